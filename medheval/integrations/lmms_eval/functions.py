"""The functions our lmms-eval task yamls name (``!function utils.…``; ``tasks/utils.py`` re-exports them, so
this module, and its score cache, is imported once however many yamls name it).

Every step calls :mod:`medheval.integrations.splits`, the code ``medheval run`` uses:

- ``dataset_path: json`` over a one-line stub file (lmms-eval always calls ``datasets.load_dataset``);
  the task's ``process_docs`` (``docs__<benchmark>__<config>``) replaces it with the split's records, read
  through our loader from ``MEDHEVAL_DATA_DIR`` (or ``MEDHEVAL_DATA_DIR_<BENCHMARK>``), images checked
  against ``MEDHEVAL_IMAGE_ROOTS``;
- ``doc_to_visual`` decodes a record's images through those roots, ``doc_to_text`` is our prompt;
- ``process_results`` keeps (id, prediction) per sample under each of the split's numbers, and
  ``aggregate`` scores the whole split once (:func:`~medheval.integrations.splits.score_split`, cached) and
  returns that number, so ratio metrics are computed over the split, never averaged over samples.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import datasets

from medheval.integrations import splits
from medheval.integrations.stack import check

check("lmms_eval")  # one line per missing or wrong-version dependency, before lmms-eval runs a task
STUB_DATASET = {"data_files": {"test": str(Path(__file__).resolve().parent / "tasks" / "stub.jsonl")}}


def docs(benchmark: str, config: str) -> datasets.Dataset:
    """The split's records as flat docs (id, prompt, target, image references; images decode lazily)."""
    items = splits.load_items(benchmark, config, decode_images=False)
    if not items:
        raise ValueError(f"{benchmark}:{config} has no records (check MEDHEVAL_DATA_DIR)")
    return datasets.Dataset.from_list([
        {"id": item.id, "benchmark": benchmark, "config": config, "prompt": item.prompt, "target": item.target,
         "answer_type": item.record["answer_type"], "source": item.record["source"],
         "images": list(item.record["images"] or [])}
        for item in items])


def _docs_for(benchmark: str, config: str):
    def process_docs(dataset: datasets.Dataset) -> datasets.Dataset:
        return docs(benchmark, config)

    process_docs.__name__ = f"docs__{benchmark}__{config}"
    return process_docs


DOCS_FUNCTIONS = [f"docs__{benchmark}__{config}" for benchmark, config in splits.harness_splits()]
for _name, (_benchmark, _config) in zip(DOCS_FUNCTIONS, splits.harness_splits()):
    globals()[_name] = _docs_for(_benchmark, _config)


def doc_to_visual(doc: dict) -> list:
    return splits.record_images(doc)


def doc_to_text(doc: dict, lmms_eval_specific_kwargs: dict | None = None) -> str:
    return doc["prompt"]


def doc_to_target(doc: dict) -> str:
    return doc["target"]


def process_results(doc: dict, results: list[str]) -> dict[str, dict[str, Any]]:
    """Per sample and per reported number: what ``aggregate`` needs to score the split."""
    prediction = results[0] if results else ""
    return {number: {"id": doc["id"], "prediction": prediction, "benchmark": doc["benchmark"],
                     "config": doc["config"], "number": number}
            for number, _ in splits.split_numbers(doc["benchmark"], doc["config"])}


@functools.lru_cache(maxsize=4)
def _scored(benchmark: str, config: str, predictions: tuple[tuple[str, str], ...]) -> dict:
    return splits.score_split(benchmark, config, dict(predictions))[0]


def aggregate(items: list[dict[str, Any]]) -> float:
    """The split number the items name, from one scoring of all their predictions (NaN if the metric gave none)."""
    first = items[0]
    predictions = tuple(sorted({item["id"]: item["prediction"] for item in items}.items()))
    value = splits.number_value(_scored(first["benchmark"], first["config"], predictions), first["number"])
    return float("nan") if value is None else value


__all__ = ["STUB_DATASET", "aggregate", "doc_to_target", "doc_to_text", "doc_to_visual", "docs", "process_results",
           *DOCS_FUNCTIONS]
