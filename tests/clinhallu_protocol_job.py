"""Runs the ClinHallu protocol with the tiny random LLaVA on a fixture snapshot (config vqa_rad) (a subprocess of
tests/test_clinhallu_protocol.py, so it can be killed): argv = snapshot, output, judge URL, cache, datasets cache,
and optionally the base URL of an API model, which then replaces the tiny LLaVA (tests/test_clinhallu_generation.py)."""

from __future__ import annotations

import sys


def main(snapshot: str, output: str, judge_url: str, cache: str, datasets_cache: str, model_url: str = "") -> None:
    from medheval.backends.api import APIBackend
    from medheval.backends.hf import HFBackend
    from medheval.backends.tiny import build_tiny_llava
    from medheval.data.benchmarks import prepare_benchmark
    from medheval.families.clinhallu.prompts import prompt_set
    from medheval.families.clinhallu.protocol import ClinHalluRun, ProtocolConfig, clinhallu_judge
    from medheval.data.images import ImageResolver

    roots = {f"clinhallu_{s}": f"{snapshot}/images/{s}" for s in ("vqa_rad", "pathvqa", "medframeqa", "medxpertqa")}
    loaded = prepare_benchmark("clinhallu", "vqa_rad", data_dir=snapshot, image_roots=roots, cache_dir=datasets_cache)
    records = loaded.dataset.to_list()
    if model_url:
        backend = APIBackend(f"openai:vlm@{model_url}", concurrency=4, cache_dir=False)
    else:
        model, processor = build_tiny_llava(seed=0)
        backend = HFBackend(model, processor, batch_size=1, max_new_tokens=12)
    judge = clinhallu_judge(f"openai:fake-judge@{judge_url}", cache_dir=cache, progress=False, max_retries=0)
    run = ClinHalluRun(backend, judge, prompt_set("own"), output, ProtocolConfig(max_attempts=2, max_new_tokens=12),
                       images_for=loaded.resolver.load_record_images, progress=False)
    run.run(records)


if __name__ == "__main__":
    main(*sys.argv[1:7])
