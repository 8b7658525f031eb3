"""Time the judge layer against a loopback judge server that answers after 200 ms.

    python benchmarks/bench_judges.py [--data-dir ../shared/data/upstream/medheval]
                                      [--concurrency 16 32] [--latency 0.2] [--sequential-subset 40]

Judges the 2,318 ``knowledge:open`` items (S_h-style prompts: question, ground truth, one model
answer; the real questions and answers when the released file is present, otherwise synthetic
items of the same shape). The records are flagged credentialed (MIMIC-derived), which the
loopback endpoint accepts. Reports:

- sequential time: concurrency 1 measured on ``--sequential-subset`` items and extrapolated
  to all items (running all 2,318 one by one would take ~8 minutes at 200 ms each);
- wall time and speed-up over sequential for each ``--concurrency`` (fresh cache each);
- a second run of the same items from the cache (a new judge, same cache folder): wall time and
  the number of HTTP requests it sent (must be 0).

Targets: speed-up >= 15x with concurrency 16+; cached re-run < 2 s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the loopback fake servers live with the tests

from judge_servers import JudgeServer, user_text  # noqa: E402

from medheval.judges import JudgeRequest, make_judge  # noqa: E402

DEFAULT_UPSTREAM = REPO.parent / "shared" / "data" / "upstream" / "medheval"
KNOWLEDGE_OPEN = "Knowledge_Deficiency_Hallucination/open-ended/MIMIC-CXR_pairs.json"
N_ITEMS = 2318

SYSTEM = (
    "You are evaluating answers from a medical vision-language model against a ground-truth answer. "
    "Score the model answer from 0 to 5 for hallucination: 0 = aligns perfectly with the ground truth; "
    "1-2 = mostly accurate with minor unverified extra details; 3-4 = significant deviations, unverified "
    "or unsupported; 5 = entirely incorrect or potentially harmful. Judge directness, accuracy and "
    "relevance; do not penalise additional information if it is accurate. Reply with a JSON object "
    '{"score": <0-5>, "rationale": "<one sentence>"} and nothing else.'
)


def load_items(data_dir: Path | None) -> tuple[list[dict], str]:
    if data_dir is not None and (data_dir / KNOWLEDGE_OPEN).is_file():
        records = json.loads((data_dir / KNOWLEDGE_OPEN).read_text())
        return records, f"the released knowledge open-ended file ({len(records)} items)"
    findings = ["pleural effusion", "pneumothorax", "cardiomegaly", "Caroli's disease", "pneumobilia", "atelectasis"]
    records = [
        {"qid": i, "question": f"What is {findings[i % 6]} and how is it related to the findings in the image?",
         "answer": f"{findings[i % 6].capitalize()} is a condition ... (synthetic ground truth {i}), about 45 words "
                   "describing the finding, its mechanism and how it appears on a chest radiograph."}
        for i in range(N_ITEMS)
    ]
    return records, f"synthetic items ({len(records)})"


def build_requests(records: list[dict]) -> list[JudgeRequest]:
    def validate(parsed: dict) -> int:
        score = parsed.get("score")
        if isinstance(score, bool) or not isinstance(score, int) or not 0 <= score <= 5:
            raise ValueError(f"'score' must be an integer from 0 to 5, got {score!r}")
        return score

    out = []
    for index, rec in enumerate(records):
        user = (f"[item {index}]\nQuestion: {rec['question']}\nGround truth: {rec['answer']}\n"
                f"Model answer: The image shows findings consistent with the question; answer {index}.")
        out.append(JudgeRequest(f"knowledge/open/{rec.get('qid', index)}", system=SYSTEM, user=user,
                                validate=validate, credentialed=True))
    return out


def reply(request_json: dict) -> str:
    text = user_text(request_json)
    index = int(text.split("]", 1)[0].removeprefix("[item "))
    return json.dumps({"score": index % 6, "rationale": "synthetic judge reply"})


def timed_run(server: JudgeServer, requests: list[JudgeRequest], cache_dir, concurrency: int):
    judge = make_judge(f"openai:bench-judge@{server.base_url}", cache_dir=cache_dir, concurrency=concurrency,
                       progress=False, backoff_base=0.05)
    began = time.perf_counter()
    results = judge.run(requests)
    elapsed = time.perf_counter() - began
    failed = [r for r in results if not r.ok]
    if failed:
        raise SystemExit(f"{len(failed)} records failed, e.g. {failed[0].id}: {failed[0].error}")
    return elapsed, judge.usage(), results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_UPSTREAM)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--latency", type=float, default=0.2, help="server answer delay in seconds")
    parser.add_argument("--sequential-subset", type=int, default=40)
    parser.add_argument("--limit", type=int, default=None, help="judge only the first N items")
    args = parser.parse_args()

    records, source = load_items(args.data_dir)
    if args.limit:
        records = records[: args.limit]
    requests = build_requests(records)
    n = len(requests)
    print(f"items: {n} from {source}; server latency {args.latency * 1000:.0f} ms")

    with JudgeServer("openai", reply, latency=args.latency) as server, tempfile.TemporaryDirectory() as tmp:
        subset = requests[: args.sequential_subset]
        seq_time, _, _ = timed_run(server, subset, False, 1)
        per_item = seq_time / len(subset)
        sequential = per_item * n
        print(f"sequential (concurrency 1): {len(subset)} items in {seq_time:.2f} s = {per_item * 1000:.1f} ms/item "
              f"-> {sequential:.1f} s extrapolated to {n} items")

        last_cache = None
        for concurrency in args.concurrency:
            server.reset_counts()
            last_cache = Path(tmp) / f"cache_c{concurrency}"
            elapsed, usage, _ = timed_run(server, requests, last_cache, concurrency)
            print(f"concurrency {concurrency:>3}: {n} items in {elapsed:6.2f} s  speed-up {sequential / elapsed:5.1f}x "
                  f"(ideal {min(concurrency, n)}x; server saw {server.request_count} requests, "
                  f"max {server.max_in_flight} in flight; {n / elapsed:.0f} items/s)")

        server.reset_counts()
        elapsed, usage, results = timed_run(server, requests, last_cache, args.concurrency[-1])
        print(f"second run from cache: {n} items in {elapsed:.3f} s, {server.request_count} HTTP requests, "
              f"{sum(r.cached for r in results)} cached results")


if __name__ == "__main__":
    main()
