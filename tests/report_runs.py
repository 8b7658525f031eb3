"""Hand-made run folders (results.json + scored.jsonl + predictions.jsonl) for the report tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CATEGORIES = ("anatomy", "measurement", "symptom", "radiology")


def write_run(folder: Path, mitigation: str, correct: list[bool], model: str = "m", new_fields: bool = True,
              bleu: list[float] | None = None, prompt: bool = False, images: list[str] | None = None) -> Path:
    """A run with one close-ended split (``mm_vishal:all``, ids ``mm_vishal/slake/<i>``, categories in turn)
    and, with ``bleu``, an open-ended split (``knowledge:open``) scored by text_generation. ``images`` (one
    image name per item) makes it a run written with cluster ids: items asking about one image share a cluster."""
    folder.mkdir(parents=True, exist_ok=True)
    items: list[dict[str, Any]] = []
    by_category: dict[str, list[bool]] = {}
    for i, ok in enumerate(correct):
        category = CATEGORIES[i % 4]
        by_category.setdefault(category, []).append(ok)
        item = {"id": f"mm_vishal/slake/{i}", "prediction": "yes" if ok else "<b onmouseover=x>no</b>",
                "reference": "yes", "correct": ok, "parsed": True, "model": model, "mitigation": mitigation}
        if new_fields:
            item.update(split="mm_vishal:all", category=category, source="slake", answer_type="yes_no",
                        images=[images[i] if images else f"img{i}.png"], credentialed=False)
        if images:
            item["cluster"] = f"image:{images[i]}"
        items.append(item)
    benchmarks: dict[str, Any] = {"mm_vishal:all": {
        "n_records": len(correct), "n_scored": len(correct), "skipped_missing_images": {"count": 0, "examples": []},
        "data_quality": {}, "metrics": {"close_ended_accuracy": {
            "accuracy": sum(correct) / len(correct), "n": len(correct), "n_unparsed": 0, "n_bad_reference": 0,
            "accuracy_by_category": {c: sum(v) / len(v) for c, v in by_category.items()}}},
        **({"cluster_unit": "image"} if images else {})}}
    if bleu is not None:
        for i, value in enumerate(bleu):
            item = {"id": f"knowledge/open/{i}", "prediction": f"answer {i}", "reference": "ref", "model": model,
                    "mitigation": mitigation, "bleu_per_item": value}
            if new_fields:
                item.update(split="knowledge:open", category="knowledge", source="mimic_cxr", answer_type="open",
                            images=[f"p{i}.jpg"], credentialed=True)
            items.append(item)
        benchmarks["knowledge:open"] = {
            "n_records": len(bleu), "n_scored": len(bleu), "skipped_missing_images": {"count": 0, "examples": []},
            "data_quality": {}, "metrics": {"text_generation": {"bleu": sum(bleu) / len(bleu), "sacrebleu": 1.0}}}
    results = {"settings": {"model": model, "mitigation": mitigation}, "labels": {}, "warnings": [],
               "benchmarks": benchmarks}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "scored.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (folder / "predictions.jsonl").write_text("".join(json.dumps(
        {"id": item["id"], "prediction": item["prediction"], "model": model, "mitigation": mitigation,
         **({"prompt": f"Question {item['id']}?"} if prompt else {})}) + "\n" for item in items))
    return folder


def write_grid(folder: Path, runs: dict[str, list[bool]], **kwargs: Any) -> Path:
    """A mitigation grid: one sub-folder per mitigation plus the combined results.json."""
    combined = []
    for mitigation, correct in runs.items():
        sub = write_run(folder / mitigation, mitigation, correct, **kwargs)
        combined.append(json.loads((sub / "results.json").read_text()))
    (folder / "results.json").write_text(json.dumps({"runs": combined}))
    return folder


# ClinHallu item: source, ORG, Rep-V, Rep-K, Rep-VK answer judged (1/0/None), h_v, h_k, h_r (1/0/None)
CLINHALLU_COLUMNS = ("correct", "correct_rep_v", "correct_rep_k", "correct_rep_vk", "h_v", "h_k", "h_r")


def write_clinhallu_run(folder: Path, table: list[tuple], mitigation: str = "none", model: str = "m",
                        upstream_compat: bool = False, split: str = "clinhallu:all",
                        stage_denominator: str = "all_items", images: list[str] | None = None) -> Path:
    """A ClinHallu run as ``medheval run`` leaves it: results.json with ``metrics/clinhallu`` on the items of
    ``table`` (ids ``clinhallu/<source>/<i>``), an empty scored.jsonl, and the protocol's generation and
    judgment logs in ``<folder>/clinhallu/<config>/`` (written in reverse item order); with ``images`` (one
    image name per item) also the items' cluster labels beside the logs, as a run writes them."""
    from conftest import load_metric_offline
    from medheval.families.clinhallu.protocol import GENERATIONS, JUDGED_STAGE, JUDGMENTS, RATE_OF_SETTING
    from medheval.run.predictions_log import LogWriter

    logs = folder / "clinhallu" / split.partition(":")[2]
    answers = dict(zip(("org", "rep_v", "rep_k", "rep_vk"), CLINHALLU_COLUMNS))
    with LogWriter(logs / GENERATIONS) as generations, LogWriter(logs / JUDGMENTS) as judgments:
        for i, (source, *values) in reversed(list(enumerate(table))):
            row = dict(zip(CLINHALLU_COLUMNS, values))
            for setting, column in answers.items():
                rid = f"clinhallu/{source}/{i}"
                generations.write({"id": rid, "setting": setting, "valid": row[column] is not None, "attempts": 1,
                                   "reason": None if row[column] is not None else "missing_answer"})
                steps = {}
                rate = RATE_OF_SETTING.get(setting)
                if rate and row[rate] is not None:
                    steps[JUDGED_STAGE[setting]] = {"hallucinated": row[rate], "reason": "checked", "error": None,
                                                    "cached": False}
                judgments.write({"id": rid, "setting": setting, "answer_correct": row[column], "steps": steps})
    if images is not None:
        from medheval.families.clinhallu.task import CLUSTERS

        (logs / CLUSTERS).write_text(json.dumps({f"clinhallu/{row[0]}/{i}": f"image:{image}"
                                                 for i, (row, image) in enumerate(zip(table, images))}))
    columns = {key: [row[i + 1] for row in table] for i, key in enumerate(CLINHALLU_COLUMNS)}
    metric = load_metric_offline(Path(__file__).resolve().parents[1] / "metrics" / "clinhallu").compute(
        **columns, sources=[row[0] for row in table], upstream_compat=upstream_compat,
        stage_denominator=stage_denominator)
    results = {"settings": {"model": model, "mitigation": mitigation}, "labels": {}, "warnings": [],
               "benchmarks": {split: {"n_records": len(table), "n_scored": len(table), "logs": str(logs),
                                      **({"cluster_unit": "image"} if images is not None else {}),
                                      "metrics": {"clinhallu": json.loads(json.dumps(metric))}}}}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "scored.jsonl").write_text("")
    return folder


def export_results_json(tmp_path: Path, results: dict[str, Any], model_repo: str) -> Any:
    """``results`` written as ``<tmp_path>/run/results.json`` and exported for ``model_repo`` as ``medheval
    publish --results`` does (into ``<tmp_path>/out``): the publish guard's tests' run folder."""
    from medheval.publish import hub

    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    (run / "results.json").write_text(json.dumps(results))
    return hub.export_results(run, tmp_path / "out", model_repo)
