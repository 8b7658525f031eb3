"""Med-StepBench answer parsing (issue 22, point 8): the verdict of a verbose answer, not its first
matching word, in English and Vietnamese; the metric's own labels score as written.

Med-StepBench asks whether a statement is consistent with the PET/CT images and scores, per step, the
answers against ``ground_truth``/``hallucination`` (paper Section 4.1, Table 3). Every answer below was
written for this test; the expected label was worked out by hand and the comment names the rule of
:func:`medheval.families.stepbench.source.parse_verdict` that reads it:

    (1) the opening word when it is a verdict followed by the end, punctuation or a reason
    (2) a verdict tied to the statement ("the statement is ...", "so ...", "it is ...", "answer: ...")
    (3) the last verdict word anywhere (yes/no and có/không excepted)
    (4) a closing yes/no (có/không)
    (-) no verdict: None, counted as unparsed by the metric
"""

from __future__ import annotations

import unicodedata

import pytest

from medheval.families.stepbench.source import parse_verdict

G, H = "ground_truth", "hallucination"

VERBOSE_EN = [
    ("There is no lesion in the liver, so the statement is consistent.", G),  # (2); "no" is no verdict
    ("There is no lesion in the liver, so the statement is consistent", G),  # (2), the example
    ("No lesion is visible in the liver; the statement is therefore consistent with the images.", G),  # (2)
    ("Inconsistent. The hypermetabolic focus is in the left lung, not the right.", H),  # (1)
    ("Consistent \u2013 the FDG-avid node sits in the right hilum as described.", G),  # (1), en dash
    ("No, the lesion is in the left upper lobe, so the statement does not match the images.", H),  # (1)
    ("Yes, the images show increased uptake in the described lymph node.", G),  # (1)
    ("The statement is not consistent with the PET/CT: no uptake is seen in the spleen.", H),  # (2)
    ("Based on the coronal view, the statement appears to be correct.", G),  # (2)
    ("The uptake pattern is consistent with inflammation, but the statement claims a malignant mass, "
     "so it is inconsistent.", H),  # (2); "consistent with inflammation" describes a finding
    ("I see no abnormal uptake in the liver. Verdict: consistent.", G),  # (2)
    ("After reviewing the axial and coronal slices, I would say no.", H),  # (4)
    ("Answer: Inconsistent \u2014 the lesion measures about 3 cm, not 1 cm.", H),  # (1) after "Answer:"
    ("**Consistent**", G),  # (1)
    ("The described lesion is present, but its SUVmax is much lower than stated; this is a hallucination.", H),  # (2)
    ("There is no hallucination here: the statement matches the images.", G),  # (2) "statement matches"
    ("It is true that the kidneys are shown, but the statement places them in the neck region, "
     "which is incorrect.", H),  # (3); "it is true that" concedes a point
    ("The statement is correct: both kidneys show physiological tracer excretion.", G),  # (2)
    ("False. The liver lesion is hypometabolic rather than FDG-avid.", H),  # (1)
    ("True \u2013 the mass in the pancreatic head shows intense uptake.", G),  # (1)
    ("The images show uptake consistent with lymphoma in the mediastinum, but the statement about the "
     "right lung is false.", H),  # (2)
    ("The statement is inconsistent because the uptake is consistent with inflammation rather than tumour.", H),  # (2)
    ("Inconsistent because the uptake is consistent with inflammation.", H),  # (1) with a reason
    ("It's consistent with the images.", G),  # (2)
    ("Not consistent: the scan shows the lesion in segment VII, not segment IV.", H),  # (1)
    ("Correct. No other FDG-avid lesions are present.", G),  # (1)
    ("Based on the images, no.", H),  # (4)
    ("Yes it is, the node is enlarged and hypermetabolic.", G),  # (1) yes + "it"
    ("The answer is no; the uptake is physiological.", H),  # (2) "answer is no"
    ("Hallucinated: the lesion is actually in the left lung.", H),  # (1)
    ("The claim of a 2 cm nodule is accurate.", G),  # (2)
    ("Looking at the fused images, the statement seems accurate.", G),  # (2)
    ("The statement is partially correct but overall inconsistent.", H),  # (2), the last tied verdict
    ("Consistent or inconsistent? Inconsistent.", H),  # (3) after the echoed options
    ("Consistent with the images.", G),  # (3): "with the images" is the verdict's own phrase
    ("No hallucination.", G),  # (1) the negated term is longer than "no"
    ("I cannot determine whether the statement is consistent or inconsistent from these views.", None),  # (-)
    ("No abnormal uptake in the spleen.", None),  # (-) "no" describes a finding
]

VERBOSE_VI = [
    ("Không có tổn thương ở gan, nên nhận định là nhất quán.", G),  # (2) "nên ... là"
    ("Không nhất quán. Tổn thương nằm ở phổi trái chứ không phải phổi phải.", H),  # (1)
    ("Nhất quán \u2013 hạch tăng hấp thu FDG ở rốn phổi phải đúng như mô tả.", G),  # (1)
    ("Không, tổn thương nằm ở thùy trên phổi trái.", H),  # (1)
    ("Có, hình ảnh cho thấy tăng hấp thu tại hạch được mô tả.", G),  # (1)
    ("Nhận định này không đúng vì gan không có ổ tăng chuyển hóa.", H),  # (2)
    ("Sau khi xem các lát cắt, tôi thấy nhận định là chính xác.", G),  # (2)
    ("Sai vì khối u có kích thước khoảng 3 cm chứ không phải 1 cm.", H),  # (1) with a reason
    ("Đúng. Không có tổn thương nào khác tăng hấp thu FDG.", G),  # (1)
    ("Hình ảnh phù hợp với viêm, nhưng nhận định mô tả một khối ác tính, nên không nhất quán.", H),  # (2)
    ("Đây là ảo giác: giá trị SUVmax thấp hơn nhiều so với mô tả.", H),  # (3)
    ("Không có ảo giác, nhận định khớp với hình ảnh.", G),  # (1) negated term
    ("Câu trả lời là không.", H),  # (2) "trả lời là"
    ("Tôi không thể xác định nhận định nhất quán hay không nhất quán.", None),  # (-) echoed options
    ("Nhận định không nhất quán với hình ảnh PET/CT.", H),  # (2)
    ("Kết luận: đúng.", G),  # (1) after "Kết luận:"
    ("Theo tôi là không.", H),  # (4)
    ("Sai.", H),  # (1)
    ("Có.", G),  # (1)
    ("Không có tổn thương ở lách.", None),  # (-) "không có" describes a finding
    ("Nhận định không khớp với hình ảnh: hạch nằm ở trung thất.", H),  # (2)
    ("Hạch có kích thước đúng như mô tả, vì vậy nhận định là đúng.", G),  # (2)
]

# Issue 30, point 8: phrasings read wrong or not at all before (the issue's own cases first), by kind: short,
# verbose, negated, hedged, reasoning before the verdict; "right" is mostly anatomy and only a verdict opening
# an answer or after a copula at a clause end; a term before "?" repeats the question.
PHRASINGS = [
    # the cases
    ("The statement is wrong.", H, "verbose"),
    ("Wrong.", H, "short"),
    ("The statement is right.", G, "verbose"),
    ("I disagree with the statement; the nodule is in the left lower lobe.", H, "verbose"),
    ("I disagree.", H, "short"),
    ("Given the normal tracer distribution in the liver, the statement is invalid", H, "reasoning"),
    ("No lesion is seen in the adrenal glands, and therefore the statement is wrong.", H, "reasoning"),
    ("Statement: consistent? No.", H, "short"),
    # short
    ("Right.", G, "short"),
    ("Invalid.", H, "short"),
    ("Valid.", G, "short"),
    ("Agree.", G, "short"),
    ("Incorrect!", H, "short"),
    ("yes", G, "short"),
    ("NO", H, "short"),
    ("Đồng ý.", G, "short"),
    ("Không đồng ý.", H, "short"),
    ("Không.", H, "short"),
    ("Nhận định: nhất quán? Không.", H, "short"),
    # verbose
    ("I agree with the statement: the right hilar node is FDG-avid.", G, "verbose"),
    ("That's right, the lesion in the right lung shows intense uptake.", G, "verbose"),
    ("The lesion lies in the right lung, exactly as the statement says, so it is valid.", G, "verbose"),
    ("The mass is located in the right upper lobe and measures 2 cm.", None, "verbose"),
    ("Tôi đồng ý với nhận định này vì hạch ở rốn phổi phải tăng hấp thu.", G, "verbose"),
    ("Nhận định này sai: tổn thương nằm ở phổi trái.", H, "verbose"),
    ("Nhận định hợp lệ với hình ảnh PET/CT.", G, "verbose"),
    # negated
    ("The statement is not wrong; the node is hypermetabolic.", G, "negated"),
    ("That is not right: the uptake is in the spleen.", H, "negated"),
    ("The statement isn't right.", H, "negated"),
    ("I don't agree, the liver lesion is hypometabolic.", H, "negated"),
    ("I do not agree with the statement.", H, "negated"),
    ("The claim is not valid for these images.", H, "negated"),
    ("This is not a hallucination.", G, "negated"),
    ("Nhận định không hợp lệ.", H, "negated"),
    ("Nhận định không sai.", G, "negated"),
    ("Tôi không đồng ý với nhận định này.", H, "negated"),
    # hedged
    ("Probably wrong.", H, "hedged"),
    ("Most likely inconsistent, although the coronal view is blurry.", H, "hedged"),
    ("I'm not entirely sure, but I think the statement is right.", G, "hedged"),
    ("It seems right.", G, "hedged"),
    ("Possibly correct.", G, "hedged"),
    ("I am not certain; I would lean towards no.", H, "hedged"),
    ("Có lẽ nhận định là sai.", H, "hedged"),
    ("Có thể là đúng.", G, "hedged"),
    ("Có lẽ không nhất quán.", H, "hedged"),
    # reasoning before the verdict
    ("The right kidney shows physiological excretion and no focal uptake, so the statement is right.", G,
     "reasoning"),
    ("Uptake is seen in the right axilla rather than the left. Hence the statement is wrong.", H, "reasoning"),
    ("The SUVmax of the node is about 8, which matches the description. I agree.", G, "reasoning"),
    ("The lesion is in the right lobe of the liver, not the left; I disagree.", H, "reasoning"),
    ("There is intense uptake in the right lung mass. Conclusion: valid.", G, "reasoning"),
    ("Hạch trung thất không tăng hấp thu, vì vậy nhận định là sai.", H, "reasoning"),
    ("Tổn thương nằm ở phổi phải như mô tả, do đó tôi đồng ý.", G, "reasoning"),
    ("Khối u ở thùy phải gan. Kết luận: không hợp lệ.", H, "reasoning"),
    ("Is the statement consistent? Yes, the images show the described node.", G, "reasoning"),
    ("Is the statement consistent? Looking at the scan, no.", H, "reasoning"),
    ("Phần lớn hình ảnh bình thường, nên tôi nghĩ là không.", H, "reasoning"),
    ("Definitely not wrong.", G, "negated"),
    ("Sounds right to me.", G, "hedged"),
    ("Sai hoàn toàn.", H, "short"),
    # no verdict
    ("The right adrenal gland appears normal.", None, "verbose"),
    ("Is the statement consistent?", None, "short"),
    ("Tuyến thượng thận phải bình thường.", None, "verbose"),
]

LABELS_AS_PREDICTIONS = [("ground_truth", G), ("hallucination", H), ("Ground truth.", G), ("Hallucination", H),
                         ("ground-truth", G), (" HALLUCINATION\n", H)]


def test_the_table_is_large_and_covers_both_languages():
    assert len(VERBOSE_EN) + len(VERBOSE_VI) >= 40 and len(VERBOSE_EN) >= 20 and len(VERBOSE_VI) >= 20
    assert {label for _, label in VERBOSE_EN + VERBOSE_VI} == {G, H, None}


@pytest.mark.parametrize("answer, expected", VERBOSE_EN + VERBOSE_VI + LABELS_AS_PREDICTIONS)
def test_verbose_answers_read_as_their_verdict(answer, expected):
    assert parse_verdict(answer) == expected


def test_the_phrasing_table_spans_kinds_and_languages():
    """At least 60 hand-labelled phrasings, each kind in both languages, both labels and "no verdict"."""
    assert len(PHRASINGS) >= 60
    vietnamese = {kind for answer, _, kind in PHRASINGS if any(ch in answer for ch in "ăâđêôơưạảấầẩẫậắằẳẵặẹẻẽếềểễệỉịọỏốồổỗộớờởỡợụủứừửữựỳỵỷỹ")}
    kinds = {kind for _, _, kind in PHRASINGS}
    assert kinds == {"short", "verbose", "negated", "hedged", "reasoning"} and vietnamese == kinds
    assert {label for _, label, _ in PHRASINGS} == {G, H, None}


@pytest.mark.parametrize("answer, expected, kind", PHRASINGS)
def test_phrasings_read_as_their_hand_label(answer, expected, kind):
    assert parse_verdict(answer) == expected, kind


def test_the_question_echo_is_not_the_answer():
    """"Statement: consistent? No." answers no (a hallucination): "consistent?" repeats the question. Through
    the metric, a hallucinated statement so answered is a TP, and nothing is unparsed."""
    import evaluate

    from medheval.data.registry import metric_path

    out = evaluate.load(metric_path("stepbench")).compute(
        predictions=["Statement: consistent? No.", "The statement is wrong.", "Wrong."], references=[H, H, G],
        steps=[2, 2, 2])
    assert out["n_unparsed"] == 0 and out["correct"] == [True, True, False]
    assert (out["per_step"][2]["tp"], out["per_step"][2]["fp"]) == (2, 1)


def test_decomposed_vietnamese_reads_like_composed():
    """Vietnamese text may arrive decomposed (NFD: base letter + combining marks); it is read as NFC."""
    for answer, expected in VERBOSE_VI:
        assert parse_verdict(unicodedata.normalize("NFD", answer)) == expected, answer


def test_metric_scores_a_file_of_labels_as_written():
    """Predictions that are the metric's own labels score as written: every answer right, none unparsed.
    Step 2 holds 2 hallucinations answered "hallucination" (TP 2) and 1 ground truth answered "ground truth"
    (TN 1): recall = 2/2, precision = 2/2, F1 = 1 (hallucination = positive class)."""
    import evaluate

    from medheval.data.registry import metric_path

    references = [H, H, G, G]
    out = evaluate.load(metric_path("stepbench")).compute(
        predictions=["hallucination", "Hallucination.", "ground_truth", "ground truth"], references=references,
        steps=[2, 2, 2, 3])
    assert out["n_unparsed"] == 0 and out["correct"] == [True] * 4
    assert (out["per_step"][2]["tp"], out["per_step"][2]["tn"], out["per_step"][2]["f1"]) == (2, 1, 1.0)


def test_the_first_word_no_longer_decides():
    """The issue's case through the metric: a ground-truth statement answered "There is no lesion in the liver,
    so the statement is consistent" is a TN (correct), where reading the first match ("no") made it an FP."""
    import evaluate

    from medheval.data.registry import metric_path

    out = evaluate.load(metric_path("stepbench")).compute(
        predictions=["There is no lesion in the liver, so the statement is consistent"], references=[G], steps=[2])
    assert out["per_step"][2]["tn"] == 1 and out["per_step"][2]["fp"] == 0 and out["correct"] == [True]
