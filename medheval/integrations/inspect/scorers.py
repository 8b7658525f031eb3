"""inspect_ai scorer and split metric for our benchmarks: the numbers of ``medheval run --predictions``.

Per sample, :func:`medheval_scorer` scores the completion with the split's own metrics
(:func:`medheval.integrations.splits.score_split` on that one item) and logs a :class:`Score` whose
``value`` is the item's number (:func:`~medheval.integrations.splits.item_value`: 1.0/0.0 for a
close-ended answer, the report's own CHAIR, ...; ``"n/a"`` where the item has none, e.g. the metric failed on
it), ``answer`` the completion and ``metadata`` the record id and the scored row.

The split metric, :func:`split_metrics`, does not average those values: it takes every sample's (id,
completion) and scores the whole split once through ``score_split``, so ratio metrics (CHAIR_i = hallucinated
/ all mentioned objects over the split, corpus BLEU, ...) equal ``medheval run``'s. Its result is one
inspect metric per headline number, named ``<metric>/<key>`` (e.g. ``close_ended_accuracy/accuracy``,
``chair/chair`` (CHAIR_i)) as in the ``task_id`` of the Hub's ``.eval_results``.
"""

from __future__ import annotations

from typing import Any, Mapping

from inspect_ai.scorer import Metric, SampleScore, Score, Scorer, Target, metric, scorer
from inspect_ai.solver import TaskState

from medheval.integrations.splits import item_value, score_split
from medheval.scoring.headline import headline_values

NO_ITEM_VALUE = "n/a"  # a Score value must not be NaN (inspect would leave the sample out of the split metric)


def _predictions(scores: list[SampleScore]) -> dict[str, str]:
    """{record id: completion} from the samples' scores; one completion per record (epochs=1)."""
    predictions: dict[str, str] = {}
    for sample in scores:
        metadata = sample.score.metadata or {}
        record_id = metadata.get("id", sample.sample_id)
        if record_id is None or sample.score.answer is None:
            raise ValueError(f"sample {sample.sample_id!r}: its score has no record id or completion (answer); "
                             "split metrics need the medheval scorer's scores")
        if str(record_id) in predictions and predictions[str(record_id)] != sample.score.answer:
            raise ValueError(f"record {record_id!r} has several different completions (epochs > 1): the split "
                             "metrics score one generation per item, as `medheval run` does; run with --epochs 1")
        predictions[str(record_id)] = sample.score.answer
    return predictions


@metric(name="split", scores="unreduced")
def split_metrics(benchmark: str, config: str, data_dir: str | None = None,
                  image_root: str | None = None) -> Metric:
    """The split's metrics over all samples, computed once by ``score_split`` (module docstring)."""

    def compute(scores: list[SampleScore]) -> dict[str, float]:
        results, _ = score_split(benchmark, config, _predictions(scores), data_dir=data_dir, image_roots=image_root)
        return headline_values(results)

    return compute


@scorer(metrics=[])  # the task passes split_metrics(...) bound to its benchmark and config
def medheval_scorer(benchmark: str, config: str, data_dir: str | None = None,
                    image_root: str | None = None) -> Scorer:
    """Score one completion with the split's metrics (``score_split`` on that item)."""

    async def score(state: TaskState, target: Target) -> Score:
        record_id = str(state.metadata.get("record_id", state.sample_id))
        completion = state.output.completion
        _, rows = score_split(benchmark, config, {record_id: completion}, data_dir=data_dir, image_roots=image_root)
        row = rows[0] if rows else {}
        value = item_value(row)
        scored = {key: item for key, item in row.items() if key not in ("id", "prediction", "images")}
        return Score(value=NO_ITEM_VALUE if value is None else value, answer=completion,
                     metadata={"id": record_id, "scored": scored})

    return score
