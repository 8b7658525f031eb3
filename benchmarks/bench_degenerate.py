"""Degenerate model outputs: how long the parsers and scorers take on them, against the code they replaced.

    python benchmarks/bench_degenerate.py [--sizes 1000,10000,100000] [--budget 10]

Models under evaluation write the same phrase until ``max_new_tokens``, long blank runs, thousands of JSON
objects. For every piece rewritten so that such an output costs linear time, this script times the current
code on inputs of each size, then the replaced code (kept below, swapped in behind the same entry point) on
the same inputs, each call in a forked process stopped after ``--budget`` seconds. It prints both times, their
ratio (measured in this one run) and the current code's growth per tenfold size (about 10 when linear; the
replaced code grew 100 or 1000 times). The last line compares the memory the close-ended answer caches keep
after 200 answers of 100,000 characters.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import multiprocessing
import random
import re
import time
import tracemalloc
from typing import Callable, Iterator

from medheval.families.med_hallmark import prompts, rules
from medheval.judges import structured
from medheval.labelers import chexpert_rules
from medheval.scoring import green, nltk39, parsing, text_cues

CXR = ["Pleural effusion", "Pneumonia", "Cardiomegaly", "Pulmonary edema"]
REPORT = "Small left pleural effusion. No pneumothorax."


def _fit(piece: str, n: int) -> str:
    return (piece * (n // len(piece) + 1))[:n]


# -- the replaced code ---------------------------------------------------------------------------------------
OLD_WHOLE_LETTER = re.compile(r"^\(?\s*([A-Za-z])\s*\)?\s*[.:)]?$")
OLD_EXPLICIT_LETTER = re.compile(
    r"\b(?:answer|option|choice)\b(?:\s+(?:is|would\s+be|will\s+be|should\s+be))?\s*[:\-]?\s*"
    r"(?:option\s+|choice\s+)?\(?([A-Za-z])(?![A-Za-z0-9])\)?", re.I)
OLD_FENCE = re.compile(r"```[ \t]*(?:json5?|javascript|js|python|py)?[ \t]*\r?\n?(.*?)```", re.I | re.S)
OLD_GREEN = {green._HEADER: re.compile(r"^\s*\[([^\]\n]+)\]\s*:?", re.MULTILINE),
             green._ITEM: re.compile(r"^\s*\(([a-f1-6])\)\s*(.*)$", re.MULTILINE)}
OLD_IRG_BLOCK = re.compile(r"Sentence\"?\s*[:：]\s*(?P<sentence>.*?)\s*\n\s*\"?Hallucination type\"?\s*[:：]\s*"
                           r"(?P<level>[^\n]*)", re.I | re.S)
OLD_FULL_STOP = re.compile(r"""([^\.])(\.)([\]\)}>"'""" + nltk39._CLOSE_QUOTES + r" ]*)\s*$")


def _old_context(m, s_start, s_end, scan, cuts, reach):
    kinds = set()
    for t in cuts.triggers:
        if t.end > s_start and t.start < s_end:
            kinds.update(kind for kind, direction, window in t.roles
                         if chexpert_rules._in_scope(m, t, kind, direction, window, scan, cuts))
    return kinds


def _old_mentions(sentence):
    low = sentence.lower()
    found = {}
    for clause in rules._CLAUSE_BREAK.split(low):
        for name, pattern in rules.FINDINGS.items():
            for m in pattern.finditer(clause):
                before, after = clause[:m.start()], clause[m.end():]
                if rules._NEGATION.search(before) or rules._POST_NEGATION.match(after):
                    state = "absent"
                elif rules._UNCERTAIN.search(before):
                    state = "uncertain"
                else:
                    state = "present"
                near = " ".join(before.split()[-rules._SEVERITY_SCOPE:])
                severity = frozenset(rules._SEVERITY[w] for w in rules._SEVERITY_RE.findall(near))
                found.setdefault(name, []).append(rules._Mention(state, rules._sides(clause), severity,
                                                                 bool(rules._CHRONIC.search(clause))))
        if rules._NORMAL_HEART.search(clause) and "cardiomegaly" not in found:
            found["cardiomegaly"] = [rules._Mention("absent", frozenset(), frozenset(), False)]
        if rules._CLEAR_LUNGS.search(clause):
            for name in rules._LUNG_FINDINGS:
                found.setdefault(name, [rules._Mention("absent", rules._sides(clause), frozenset(), False)])
    m = rules._GLOBAL_NORMAL.search(low)
    return found, (None if m is None else "acute" if m.group(1) else "normal")


@contextlib.contextmanager
def _swapped(*changes: tuple[object, str, object]) -> Iterator[None]:
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in changes]
    for owner, name, value in changes:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def _json(text: str) -> object:
    try:
        return structured.parse_json_object(text)
    except ValueError as error:
        return str(error)[:30]


def _irg(text: str) -> object:
    try:
        return prompts.parse_irg_upstream(text)
    except ValueError as error:
        return str(error)[:30]


def _mc(text: str) -> object:
    parsing.clear_caches()
    return parsing.parse_multiple_choice(text, CXR)


# (name, call, input of n characters, the replaced code swapped in)
Swap = Callable[[], contextlib.AbstractContextManager]
CASES: list[tuple[str, Callable[[str], object], Callable[[int], str], Swap]] = [
    ("multiple choice: letter, blanks, x", _mc, lambda n: "A" + " " * (n - 2) + "x",
     lambda: _swapped((parsing, "_WHOLE_LETTER", OLD_WHOLE_LETTER))),
    ("multiple choice: '... answer is', blanks", _mc, lambda n: "I think the answer is" + " " * (n - 23) + "1.",
     lambda: _swapped((parsing, "_EXPLICIT_LETTER", OLD_EXPLICIT_LETTER))),
    ("judge reply: ``` then blanks", _json, lambda n: "```" + " " * (n - 4) + "x",
     lambda: _swapped((structured, "_fence_blocks", OLD_FENCE.findall))),
    ("judge reply: many different objects", _json, lambda n: " ".join(f'{{"score": {i}}}' for i in range(n // 16)),
     lambda: _swapped((structured, "_same_key", lambda value: 0))),
    ("GREEN reply: blank lines", lambda text: green.parse_reply(text),
     lambda n: "[Matched Findings]:\n1\n[Clinically Significant Errors]:\n(a) x: 1" + "\n" * n + "x",
     lambda: _swapped((green, "_line_matches", lambda pattern, text: [(m.start(), m)
                                                                     for m in OLD_GREEN[pattern].finditer(text)]))),
    ("MediHall IRG reply: 'Sentence:' repeated", _irg, lambda n: _fit("Sentence: ", n),
     lambda: _swapped((prompts, "_irg_blocks", lambda text: [(m["sentence"], m["level"])
                                                             for m in OLD_IRG_BLOCK.finditer(text)]))),
    ("NLTK 3.9 tokenizer: full stop, blanks", nltk39.tokenize_sentence, lambda n: "a." + " " * (n - 3) + "b",
     lambda: _swapped((nltk39, "_PUNCTUATION", ((OLD_FULL_STOP, r"\1 \2 \3 "), *nltk39._PUNCTUATION[1:])))),
    ("MediHall sentences: 'Dr. A' repeated", lambda text: text_cues.split_sentences(text, text_cues.MEDIHALL_SENTENCES),
     lambda n: _fit("Dr. A ", n),
     lambda: _swapped((text_cues, "_last_word", lambda text, start, end: (text[start:end].split() or [""])[-1]))),
    ("CheXpert rules (CHAIR): 'no effusion' repeated", chexpert_rules.label_report, lambda n: _fit("no effusion ", n),
     lambda: _swapped((chexpert_rules, "_context", _old_context), (chexpert_rules, "_opens_phrase",
                      lambda text, start: text[:start].rstrip().endswith(chexpert_rules._OPENERS) or start == 0))),
    ("MediHall IRG rule: 'effusion no effusion'", lambda text: rules.classify_irg_rule(text, REPORT),
     lambda n: _fit("effusion no effusion ", n), lambda: _swapped((rules, "_mentions", _old_mentions))),
]


def _timed(call: Callable[[str], object], text: str, swap, budget: float) -> float | None:
    """Seconds for one call (best of three when quick) in a forked process; ``None`` past ``budget``."""

    def child(pipe) -> None:
        gc.disable()  # as timeit does: no collection of the parent's objects inside a timed call
        with swap() if swap else contextlib.nullcontext():
            best = float("inf")
            for _ in range(3):
                began = time.perf_counter()
                call(text)
                best = min(best, time.perf_counter() - began)
                if best > 0.2:
                    break
        pipe.send(best)

    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=child, args=(send,))
    process.start()
    ready = receive.poll(budget)
    if not ready:
        process.kill()
    process.join()
    return receive.recv() if ready else None


def _cache_mib(max_chars: int) -> float:
    """MiB the close-ended caches keep after 200 different answers of 100,000 characters."""
    rng = random.Random(0)
    words = "the left pleural effusion is small no pneumonia answer option B not and or".split()
    parsing.clear_caches()
    with _swapped((parsing, "MEMO_MAX_CHARS", max_chars)):
        tracemalloc.start()
        for _ in range(200):
            text = " ".join(rng.choice(words) for _ in range(20_000))
            parsing.score_item(text, "Yes", "yes_no", question="Is there an effusion?")
            parsing.score_item(text, "B", "multiple_choice", CXR)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
    parsing.clear_caches()
    return held / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000", help="input sizes in characters")
    parser.add_argument("--budget", type=float, default=10.0, help="seconds after which a call is stopped")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in args.sizes.split(",")]
    fmt = lambda s: "   stopped" if s is None else f"{s * 1000:8.1f}ms"  # noqa: E731
    print(f"{'case':46s} {'chars':>7s} {'now':>10s} {'replaced':>10s} {'ratio':>8s} {'growth':>7s}")
    for name, call, make, swap in CASES:
        call(make(200))  # compiled tables and imports, before the timed calls fork
        previous = None
        old_stopped = False
        for n in sizes:
            text = make(n)
            now = _timed(call, text, None, args.budget)
            old = None if old_stopped else _timed(call, text, swap, args.budget)
            old_stopped = old is None
            if now is None:
                ratio = ""
            else:
                ratio = f"{old / now:.0f}x" if old is not None else f">{args.budget / now:.0f}x"
            growth = f"{now / previous:6.1f}x" if previous and now is not None else ""
            print(f"{name:46s} {n:7d} {fmt(now)} {fmt(old)} {ratio:>8s} {growth:>7s}", flush=True)
            previous = now
    now_mib, old_mib = _cache_mib(parsing.MEMO_MAX_CHARS), _cache_mib(10**9)
    print(f"close-ended caches after 200 answers of 100,000 characters: {now_mib:.1f} MiB kept "
          f"(every text memoised: {old_mib:.1f} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
