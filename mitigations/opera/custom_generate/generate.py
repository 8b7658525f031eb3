"""OPERA as a Hub-style `custom_generate` folder for transformers 5.x.

    model.generate(**inputs, custom_generate="mitigations/opera", trust_remote_code=True, num_beams=5)

Keyword arguments that are OPERA settings (see ../README.md), `preset` and `num_beams` among them,
configure the method; all others are ordinary `generate` arguments. The implementation lives in the
`medheval` package (declared in requirements.txt, which transformers checks before running this
file): this file only forwards to it, so the folder, the Python API and `run_eval.py --mitigation
opera` run the same code.
"""

from medheval.decoding import generate_from_folder
from medheval.mitigations import OPERA


def generate(model, **kwargs):
    return generate_from_folder(OPERA, model, **kwargs)
