"""The shipped grids list the papers' models (issue 22, point 10): a Hub id for every model of the paper
that has a checkpoint ``transformers`` loads, and a comment for every one that has none."""

from __future__ import annotations

import pytest
from conftest import REPO

from medheval.run.grids import load_grid_config

# paper -> (config, {paper's model name: Hub id, or None when it has no loadable checkpoint}).
PAPER_MODELS = {
    # Med-HallMark (arXiv 2406.10185) Table 1 rows, in order (Section 6.1 names the same twelve).
    "med_hallmark": ("med_hallmark_table1.yaml", {
        "BLIP2": "Salesforce/blip2-opt-2.7b", "InstructBLIP-7b": "Salesforce/instructblip-vicuna-7b",
        "InstructBLIP-13b": "Salesforce/instructblip-vicuna-13b", "LLaVA1.5-7b": "llava-hf/llava-1.5-7b-hf",
        "LLaVA1.5-13b": "llava-hf/llava-1.5-13b-hf", "LLaVA-Med (SF": None, "RF": None, "PF": None,
        "mPLUG-Owl2": None, "XrayGPT": None, "MiniGPT4": None, "RadFM": None}),
    # Med-StepBench (arXiv 2605.10002) Table 3 rows, in order.
    "med_stepbench": ("med_stepbench_table3.yaml", {
        "GPT-4o": None, "Gemini 2.5 Flash": None, "Gemini 2.5 Pro": None,
        "Qwen3-VL-8B": "Qwen/Qwen3-VL-8B-Instruct", "Qwen3-VL-4B": "Qwen/Qwen3-VL-4B-Instruct",
        "LLaVA-7B": "llava-hf/llava-1.5-7b-hf", "LLaVA-Med": None, "MedM-VL 2D": None, "MedM-VL 3D": None,
        "Med-Flamingo": None, "M3D": None}),
    # ClinHallu (arXiv 2606.14697) Section 5.1: three API models and eight open ones.
    "clinhallu": ("clinhallu_tables2_3.yaml", {
        "Qwen3-VL Flash/Plus": None, "Gemini 3 Flash": None,
        "Qwen2.5-VL-7B": "Qwen/Qwen2.5-VL-7B-Instruct", "Qwen3-VL-8B": "Qwen/Qwen3-VL-8B-Instruct",
        "Lingshu-7B": "lingshu-medical-mllm/Lingshu-7B", "MedGemma-4B": "google/medgemma-4b-it",
        "InternVL3.5-8B": "OpenGVLab/InternVL3_5-8B-HF", "Qwen3-VL-32B": "Qwen/Qwen3-VL-32B-Instruct",
        "Qwen3.5-4B": "Qwen/Qwen3.5-4B", "Qwen3.5-9B": "Qwen/Qwen3.5-9B"}),
}


@pytest.mark.parametrize("paper", sorted(PAPER_MODELS))
def test_every_paper_model_is_listed_or_explained(paper):
    """Every loadable paper model is in ``models`` (in the paper's order where the paper has one); every
    other paper model is named in the file's comments (why it has no checkpoint, or how to add it)."""
    name, models = PAPER_MODELS[paper]
    path = REPO / "configs" / name
    text = path.read_text()
    listed = load_grid_config(path).models
    expected = list(dict.fromkeys(hub for hub in models.values() if hub))
    assert [model for model in listed if model in expected] == expected
    for model_name, hub in models.items():
        assert model_name in text, f"{name}: the paper's model {model_name!r} is not mentioned"
        if hub is None:
            assert any(model_name in line for line in text.splitlines() if line.lstrip().startswith("#")), \
                f"{name}: {model_name!r} has no checkpoint and no comment saying so"


def test_med_hallmark_grid_lists_exactly_the_loadable_table1_models():
    """Med-HallMark Table 1 has twelve rows; five have a transformers checkpoint (BLIP2, InstructBLIP-7b/13b,
    LLaVA1.5-7b/13b); LLaVA-Med SF/RF/PF, mPLUG-Owl2, XrayGPT, MiniGPT4 and RadFM are comments. Nothing else
    is run, so the grid's rows are the paper's."""
    config = load_grid_config(REPO / "configs" / "med_hallmark_table1.yaml")
    assert config.models == ["Salesforce/blip2-opt-2.7b", "Salesforce/instructblip-vicuna-7b",
                             "Salesforce/instructblip-vicuna-13b", "llava-hf/llava-1.5-7b-hf",
                             "llava-hf/llava-1.5-13b-hf"]
    assert config.benchmarks == ["med_hallmark:conventional", "med_hallmark:confidence_weakening",
                                 "med_hallmark:counterfactual", "med_hallmark:irg"]
