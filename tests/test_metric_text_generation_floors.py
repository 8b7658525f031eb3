"""metrics/text_generation on one hand-worked pair: BLEU (NLTK), sacreBLEU and ROUGE come from nltk, sacrebleu and
rouge-score, so this runs in ``make test-oldest`` (their setup.cfg floors: nltk 3.9.1, rouge-score 0.1.2, sacrebleu
2.3.0) and ``make test-latest`` as well as in the suite. Offline: METEOR is checked only where WordNet is
installed, else it must say why it is missing; BERTScore is pointed at a folder that does not exist."""

import math
from pathlib import Path

import evaluate
import pytest

from medheval.scoring import nltk_data

METRIC_DIR = Path(__file__).resolve().parents[1] / "metrics" / "text_generation"
PREDICTION, REFERENCE = "effusion and small pleural thickening", "small pleural effusion"


@pytest.fixture(scope="module")
def scored() -> dict:
    metric = evaluate.load(str(METRIC_DIR))
    return metric.compute(predictions=[PREDICTION], references=[REFERENCE], bertscore_model="/nonexistent/bertscore",
                          bertscore_num_layers=4)


def test_rouge_on_a_hand_worked_pair(scored):
    # Porter-stemmed tokens: prediction [effus, and, small, pleural, thicken] (5), reference [small, pleural, effus] (3)
    # ROUGE-1: overlap 3: P = 3/5, R = 3/3, F = 2PR / (P + R) = 1.2 / 1.6 = 0.75
    assert (scored["rouge1_precision"], scored["rouge1_recall"], scored["rouge1"]) == pytest.approx((60.0, 100.0, 75.0))
    # ROUGE-2: prediction bigrams 4, reference bigrams 2, overlap 1 (small pleural): P = 1/4, R = 1/2, F = 1/3
    assert (scored["rouge2_precision"], scored["rouge2_recall"], scored["rouge2"]) == pytest.approx(
        (25.0, 50.0, 100 / 3))
    # ROUGE-L: the longest common subsequence is "small pleural" (2; order matters, unlike ROUGE-1):
    # P = 2/5, R = 2/3, F = 2 * (4/15) / (16/15) = 0.5
    assert (scored["rougeL_precision"], scored["rougeL_recall"], scored["rougeL"]) == pytest.approx(
        (40.0, 200 / 3, 50.0))
    assert scored["rougeL_per_item"] == pytest.approx([50.0])


def test_bleu_and_sacrebleu_on_a_hand_worked_pair(scored):
    # clipped n-gram matches of the 5-token prediction against the 3-token reference: 3/5, 1/4, 0/3, 0/2;
    # the prediction is longer, so the brevity penalty is 1.
    # NLTK sentence BLEU-4, smoothing method4 (k = 5): the i-th zero precision becomes 1 / (2**i * k / ln 5) / total
    p = [3 / 5, 1 / 4, math.log(5) / 10 / 3, math.log(5) / 20 / 2]
    assert scored["bleu"] == pytest.approx(100 * math.exp(sum(0.25 * math.log(x) for x in p)), rel=1e-9)
    assert scored["bleu"] == pytest.approx(13.4141, abs=1e-4)
    # sacreBLEU, "exp" smoothing: the i-th zero precision becomes 100 / (2**i * total): 60, 25, 100/6, 12.5 (%)
    assert scored["sacrebleu"] == pytest.approx((60 * 25 * (100 / 6) * 12.5) ** 0.25, rel=1e-9)  # 23.6435
    assert scored["n"] == 1 and scored["n_empty_predictions"] == 0


def test_meteor_and_bertscore_offline(scored):
    wordnet, why = nltk_data.load_wordnet()
    if wordnet is None:
        assert scored["meteor"] is None and scored["meteor_unavailable_reason"] == why and "WordNet" in why
    else:
        # 3 exact matches: P = 3/5, R = 1, Fmean = PR / (0.9 P + 0.1 R) = 0.6 / 0.64 = 0.9375; aligned (hypothesis
        # -> reference) 0->2, 2->0, 3->1: 2 chunks, penalty 0.5 * (2/3) ** 3 = 4/27
        assert scored["meteor"] == pytest.approx(100 * 0.9375 * (1 - 4 / 27))
    assert scored["bertscore"] is None
    assert "does not exist" in scored["bertscore_unavailable_reason"]
