"""metrics/green and medheval.scoring.green: GREEN (Ostmeier et al., 2024) from a judge's error counts.

The upstream prompt file is never copied here: the fixture below is a stand-in ``green_score/utils.py`` in
this project's words with the same structure (``make_prompt(text1, text2, max_len=...)`` returning an
f-string), and the pin is pointed at its sha256 for the tests.
"""

from __future__ import annotations

import json

import evaluate
import pytest
from conftest import REPO
from judge_servers import JudgeServer, user_text

from medheval.data.fetch import PinnedFile, sha256_of
from medheval.scoring import green as g

METRIC_DIR = REPO / "metrics" / "green"

FIXTURE_UTILS = '''\
def other_helper(x):
    return f"not the prompt {x}"


def make_prompt(text1, text2, max_len=5):
    text1 = " ".join(text1.split()[:max_len])
    text2 = " ".join(text2.split()[:max_len])
    prompt = f"Compare the reports.\\n\\nREFERENCE: {text1}\\nCANDIDATE: {text2}\\n\\nCount errors {{a-f}}."
    return prompt
'''


def reply(matched: int, significant: dict[str, int], insignificant: str = "No clinically insignificant errors.") -> str:
    """A reply in GREEN's output format (sections in brackets, (a)-(f) lines with ': <count>.')."""
    lines = [f"({k}) Some error type: {v}. details" for k, v in significant.items()]
    return ("[Explanation]:\nThe candidate misses things.\n\n[Clinically Significant Errors]:\n" + "\n".join(lines)
            + f"\n\n[Clinically Insignificant Errors]:\n{insignificant}\n\n[Matched Findings]:\n{matched}. a; b\n")


@pytest.fixture
def upstream_dir(tmp_path, monkeypatch):
    root = tmp_path / "GREEN"
    (root / "green_score").mkdir(parents=True)
    path = root / "green_score" / "utils.py"
    path.write_text(FIXTURE_UTILS)
    monkeypatch.setattr(g, "UPSTREAM_FILE", PinnedFile(g.UPSTREAM_FILE.relpath, g.UPSTREAM_FILE.url, sha256_of(path)))
    g.upstream_prompt.cache_clear()
    yield str(root)
    g.upstream_prompt.cache_clear()


def test_the_pin_names_the_upstream_file_at_a_commit():
    assert g.UPSTREAM_FILE.url == ("https://raw.githubusercontent.com/Stanford-AIMI/GREEN/"
                                   "d72c1951e69683b93405968901fd4f14cc6c27b0/green_score/utils.py")
    assert len(g.UPSTREAM_FILE.sha256) == 64 and g.PROMPT_VERSION == "green-upstream@d72c1951"


def test_prompt_is_read_from_the_pinned_file_and_reports_are_cut_to_its_word_limit(upstream_dir):
    template, limit = g.upstream_prompt(upstream_dir)
    assert limit == 5 and "{reference}" in template and "{candidate}" in template
    text = g.render("one two three four five six", "No  acute\nfindings.", upstream_dir)
    assert text == ("Compare the reports.\n\nREFERENCE: one two three four five\nCANDIDATE: No acute findings."
                    "\n\nCount errors {a-f}.")


def test_a_file_that_is_not_the_pinned_one_is_refused(upstream_dir, tmp_path):
    other = tmp_path / "other"
    (other / "green_score").mkdir(parents=True)
    (other / "green_score" / "utils.py").write_text(FIXTURE_UTILS.replace("Compare", "Contrast"))
    with pytest.raises(ValueError, match="not the pinned"):
        g.upstream_prompt(str(other))


def test_parse_a_full_reply_and_the_score():
    """Hand-worked: significant (a) 1, (c) 1 -> 2 errors; matched 3; GREEN = 3 / (3 + 2) = 0.6. Insignificant
    (d) 2 is counted but not scored."""
    text = reply(3, {"a": 1, "b": 0, "c": 1, "d": 0, "e": 0, "f": 0},
                 insignificant="(d) Misassessment: 2. mild vs small")
    counts = g.parse_reply(text)
    assert counts == {"matched": 3, "significant": [1, 0, 1, 0, 0, 0], "insignificant": [0, 0, 0, 2, 0, 0]}
    assert g.green_score(counts["matched"], counts["significant"]) == pytest.approx(0.6)


def test_parse_edge_cases():
    """"No ..." sections are zero; numbered (1)-(6) labels are read like (a)-(f); 0 matched scores 0 (GREEN's
    rule), even with no errors; a missing insignificant section is None."""
    text = "[Clinically Significant Errors]:\nNo clinically significant errors.\n\n[Matched Findings]:\n4. x\n"
    assert g.parse_reply(text) == {"matched": 4, "significant": [0] * 6, "insignificant": None}
    numbered = "[Clinically Significant Errors]:\n(2) Missing: 3. y\n\n[Matched Findings]:\n1. z"
    assert g.parse_reply(numbered)["significant"] == [0, 3, 0, 0, 0, 0]
    assert g.green_score(0, [0] * 6) == 0.0 and g.green_score(2, [0] * 6) == 1.0


@pytest.mark.parametrize("text, reason", [
    ("I think the report is fine.", "no \\[Matched Findings\\] section"),
    ("[Clinically Significant Errors]:\n(a) x: 1.\n\n[Matched Findings]:\nseveral", "does not start with a count"),
    ("[Matched Findings]:\n2. a", "no \\[Clinically Significant Errors\\] section"),
    ("[Clinically Significant Errors]:\n(a) False report: none\n\n[Matched Findings]:\n2.", r"\(a\) has no count"),
    ("[Clinically Significant Errors]:\nsome errors\n\n[Matched Findings]:\n2.", "lists no"),
])
def test_unparseable_replies_are_errors(text, reason):
    with pytest.raises(ValueError, match=reason):
        g.parse_reply(text)


def test_metric_through_a_loopback_judge(upstream_dir, tmp_path):
    """Scripted judge, by candidate: A -> matched 3, errors 2 (0.6); B -> matched 2, none (1.0); C -> prose
    (unparseable, counted, not scored). GREEN = (0.6 + 1.0) / 2 = 0.8."""
    replies = {"A": reply(3, {"a": 1, "b": 1}), "B": reply(2, {}).replace("\n\n\n", "\nNo errors.\n\n"),
               "C": "The candidate looks reasonable overall."}

    def answer(request):
        return replies[user_text(request).split("CANDIDATE: ")[1].split()[0]]

    metric = evaluate.load(str(METRIC_DIR))
    with JudgeServer("openai", reply=answer) as server:
        out = metric.compute(predictions=["A", "B", "C"], references=["ref one", "ref two", "ref three"],
                             ids=["r1", "r2", "r3"], credentialed=False, judge=f"openai:m@{server.base_url}",
                             cache_dir=str(tmp_path / "cache"), upstream_dir=upstream_dir)
        assert any("REFERENCE: ref one\nCANDIDATE: A" in user_text(r.json) for r in server.requests)
        assert "response_format" not in server.requests[0].json  # a text reply, not JSON mode
    assert out["green_per_item"] == [pytest.approx(0.6), 1.0, None]
    assert out["green"] == pytest.approx(0.8) and out["n"] == 2
    assert out["n_unparseable"] == 1 and out["n_failed"] == 1 and out["failed"][0]["id"] == "r3"
    assert "no [Matched Findings] section" in out["failed"][0]["reason"]
    assert out["matched_per_item"] == [3, 2, None] and out["significant_errors_per_item"] == [2, 0, None]
    assert out["significant_by_category"]["false_finding"] == 1 and out["significant_by_category"][
        "missing_finding"] == 1
    assert out["prompt_version"] == g.PROMPT_VERSION


def test_a_judge_or_a_green_model_is_needed(upstream_dir):
    metric = evaluate.load(str(METRIC_DIR))
    with pytest.raises(ValueError, match="green needs judge=.*or green_model="):
        metric.compute(predictions=["a"], references=["b"], upstream_dir=upstream_dir)


def test_green_model_runs_locally_with_greens_chat_layout(upstream_dir, tmp_path):
    """A tiny random causal LM stands in for a GREEN model: it runs in-process (credentialed items allowed),
    its prompt is in GREEN's <|user|> ... <|assistant|> layout, and its junk replies are counted as
    unparseable, never scored."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from medheval.backends.tiny import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    folder = tmp_path / "tiny_green"
    LlamaForCausalLM(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)

    metric = evaluate.load(str(METRIC_DIR))
    seen = []
    original = LlamaForCausalLM.generate

    def recording_generate(self, *args, **kwargs):
        seen.append(kwargs["input_ids"].shape[0])
        return original(self, *args, **kwargs)

    LlamaForCausalLM.generate = recording_generate
    try:
        out = metric.compute(predictions=["small effusion", "no findings"], references=["effusion", "normal"],
                             credentialed=True, green_model=str(folder), max_tokens=4, batch_size=2, device="cpu",
                             judge="openai:m@http://127.0.0.1:9/v1",  # a run's --judge for other metrics: not used
                             cache_dir=str(tmp_path / "cache"), upstream_dir=upstream_dir)
    finally:
        LlamaForCausalLM.generate = original
    assert seen == [2]  # one batch, no corrective follow-up for a fine-tuned model
    assert out["n"] == 0 and out["green"] is None and out["n_unparseable"] == 2 and out["n_failed"] == 2
    assert out["judge"]["backend"] == "transformers" and out["judge"]["local"] and "judge= was not" in out["judge_note"]
    rendered = g.render("effusion", "small effusion", upstream_dir)
    layout = _layout(folder, rendered)
    assert layout.startswith("<|user|>\n" + rendered) and layout.endswith("<|assistant|>\n")


def _layout(folder, prompt: str) -> str:
    import importlib.util

    spec = importlib.util.spec_from_file_location("green_module", METRIC_DIR / "green.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tokenizer = module._green_tokenizer(str(folder))
    assert tokenizer.padding_side == "left"
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}, {"role": "assistant", "content": ""}],
                                         add_generation_prompt=True, tokenize=False)


def test_results_are_json(upstream_dir, tmp_path):
    metric = evaluate.load(str(METRIC_DIR))
    with JudgeServer("openai", reply=lambda request: reply(1, {"b": 1})) as server:
        out = metric.compute(predictions=["x"], references=["y"], credentialed=False,
                             judge=f"openai:m@{server.base_url}", cache_dir=str(tmp_path / "c"),
                             upstream_dir=upstream_dir)
    assert out["green"] == pytest.approx(0.5)
    json.dumps(out)
