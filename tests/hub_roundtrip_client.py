"""Client side of the Hub round trip (tests/test_publish_hub.py runs it in a subprocess, because
huggingface_hub, datasets and evaluate read HF_ENDPOINT at import time).

    python hub_roundtrip_client.py OUT.json DATA_DIR IMAGE_ROOTS_JSON

Reads everything back by Hub id from the fake Hub at $HF_ENDPOINT and writes what it got to OUT.json;
the test compares it with the local code's answers. Errors are recorded by class name, not raised.
"""

from __future__ import annotations

import json
import sys


def _error_name(call) -> str | None:
    try:
        call()
    except Exception as error:  # the class name is what the test checks
        return f"{type(error).__name__}: {error}"[:400]
    return None


def main(out_path: str, data_dir: str, image_roots_json: str) -> None:
    import datasets
    import evaluate
    import numpy as np
    from huggingface_hub import hf_hub_download
    from PIL import Image

    out: dict = {}
    rows = datasets.load_dataset("medheval/cxr_vishal", "mimic_cxr", split="test").to_list()
    out["dataset_rows"] = rows
    out["dataset_features"] = str(datasets.load_dataset("medheval/cxr_vishal", "mimic_cxr", split="test").features)

    metric = evaluate.load("medheval/medihall_score")
    out["metric"] = metric.compute(predictions=["Yes.", "No."], references=["No", "No"],
                                   questions=["Is there a mass?"] * 2, ids=["a", "b"])

    from medheval.backends.tiny import build_tiny_llava
    from medheval.mitigations import VCD

    model, processor = build_tiny_llava(seed=0)
    image = Image.fromarray(np.random.RandomState(0).randint(0, 255, (30, 30, 3), dtype=np.uint8))
    inputs = processor(text=["USER: <image>\nis there a pleural effusion ? ASSISTANT:"], images=[image],
                       return_tensors="pt")
    settings = dict(max_new_tokens=6, do_sample=False)
    out["vcd_hub"] = model.generate(**inputs, **settings, custom_generate="medheval/vcd", trust_remote_code=True,
                                    alpha=0.5).tolist()
    out["vcd_local"] = model.generate(**inputs, **settings, custom_generate=VCD(alpha=0.5)).tolist()
    out["greedy"] = model.generate(**inputs, **settings).tolist()

    # a gated repo refuses an anonymous download (token=False: send no token at all; a fresh cache, so
    # nothing downloaded above with the token can answer instead)
    import tempfile

    out["gated_anonymous"] = _error_name(lambda: hf_hub_download(
        "medheval/cxr_vishal", "mimic_cxr/test-00000-of-00001.parquet", repo_type="dataset", token=False,
        cache_dir=tempfile.mkdtemp()))
    out["public_anonymous"] = _error_name(lambda: hf_hub_download(
        "medheval/vcd", "custom_generate/generate.py", token=False, cache_dir=tempfile.mkdtemp()))
    out["gated_with_token"] = _error_name(
        lambda: hf_hub_download("medheval/cxr_vishal", "README.md", repo_type="dataset"))

    # a user's own push_to_hub of MIMIC images loaded with image_roots is refused (datasets embeds by default)
    from medheval.data.benchmarks import load_benchmark

    with_images = load_benchmark("cxr_vishal", "mimic_cxr", data_dir=data_dir, image_roots=json.loads(image_roots_json))
    out["user_push"] = _error_name(lambda: with_images.push_to_hub("owner/my-mimic-copy"))
    out["user_push_without_images"] = _error_name(
        lambda: with_images.remove_columns("image").push_to_hub("owner/my-mimic-refs"))
    with open(out_path, "w") as handle:
        json.dump(out, handle, default=str)


if __name__ == "__main__":
    main(*sys.argv[1:4])
