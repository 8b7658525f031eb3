"""AvisC as a Hub-style `custom_generate` folder for transformers 5.x.

    model.generate(**inputs, custom_generate="mitigations/avisc", trust_remote_code=True)

Keyword arguments that are AvisC settings (see ../README.md), `preset` among them (e.g.
`preset="official"`), configure the method; all others are ordinary `generate` arguments. The
implementation lives in the `medheval` package (declared in requirements.txt, which transformers
checks before running this file): this file only forwards to it, so the folder, the Python API and
`run_eval.py --mitigation avisc` run the same code.
"""

from medheval.decoding import generate_from_folder
from medheval.mitigations import AvisC


def generate(model, **kwargs):
    return generate_from_folder(AvisC, model, **kwargs)
