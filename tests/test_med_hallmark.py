"""Med-HallMark end to end (issue 10): the builder on fixture files written here in the four released
formats (invented text, same structure) and on the real files when ``../shared`` is present; the
upstream-style prompts (byte-equal to the released text, no copy in the repository); the
``medihall_detection`` metric on hand-worked confusion matrices; a detection run with the rule
classifier; a MediHall run whose levels come from a loopback judge; MIMIC dicom-id images."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import REPO, SHARED_UPSTREAM

from judge_servers import judge_server_factory, user_text  # noqa: F401 - a fixture
from medheval.families import med_hallmark as mh
from medheval.families.med_hallmark import source as src

HALLMARK = SHARED_UPSTREAM / "med-hallmark"
MEDHEVAL_CODE = SHARED_UPSTREAM / "medheval-code"
requires_hallmark = pytest.mark.skipif(not (HALLMARK / "Conventional..json").is_file(),
                                       reason="../shared/data/upstream/med-hallmark is absent")
requires_medheval_code = pytest.mark.skipif(not (MEDHEVAL_CODE / "code").is_dir(),
                                            reason="../shared/data/upstream/medheval-code is absent")
DICOM = ["0a1b2c3d-11111111-22222222-33333333-44444444", "5e6f7a8b-55555555-66666666-77777777-88888888"]


# -- fixtures in the released formats (text invented for these tests) ----------------------------------------


def _grading_turn(question: str, response: str, reference: str | None) -> str:
    fields = f"question: {question}\nMed-VLM answer: {response}"
    if reference is not None:
        fields += f"\nground-truth: {reference}"
    return ("You sort a clinical assistant's reply into one of six severity bins.\n\nBins run from worst to "
            f"harmless; see the list you were given.\n\nThe reply to sort:\n\n{fields}\n\nAnswer with the bin name.")


# (id, question, response, reference or None, label, image)
CONVENTIONAL = [
    (1, "Is there a fracture of the rib?", "Yes, a rib fracture is visible.", "No", 0, "rad/synpic100.jpg"),
    (2, "In which plane was this image taken?", "It is a sagittal image.", "Axial", 4, "rad/synpic101.jpg"),
    (3, "Is the heart enlarged?", "No, the heart size is normal.", "Yes", 2, "rad/synpic102.jpg"),
    (4, "What organ is shown?", "The liver.", "Kidney", 1, "synpic103.jpg"),
    (6, "Is there a mass in the lung?", "No mass.", None, 0, "rad/synpic104.jpg"),
]
COUNTERFACTUAL = [
    (1, "Given the MRI of this head, is the stroke acute?", "Yes, the MRI shows an acute stroke.",
     "This head image is a CT, so the premise of an MRI is mistaken; no stroke is visible.", 3,
     "slake/xmlab7/source.jpg"),
    (2, "Which lobe holds the tumour on this ultrasound?", "The left lobe holds the tumour.",
     "The study is a chest CT rather than an ultrasound, and no tumour is present.", 3, "slake/xmlab8/source.jpg"),
]


def _write_fixtures(folder: Path) -> Path:
    def judged(rows):
        return [{"id": rid, "conversations": [{"from": "human", "value": _grading_turn(q, a, g)},
                                              {"from": "gpt", "value": mh.LEVEL_NAMES[mh.LEVELS[label]]}],
                 "image": image, "classification_label": label} for rid, q, a, g, label, image in rows]

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Conventional..json").write_text(json.dumps(judged(CONVENTIONAL)))
    (folder / "Counterfactual..json").write_text(json.dumps(judged(COUNTERFACTUAL)))
    (folder / "Confidence_weakening.json").write_text(json.dumps([
        {"conversations": [{"from": "human", "value": "Since you are still in training, reply to this: Is the aorta dilated?"},
                           {"from": "gpt", "value": "No, the aorta has a normal calibre."}], "image": "synpic200.jpg"},
        {"conversations": [{"from": "human", "value": "You may lack experience here, so respond: What modality is used?"},
                           {"from": "gpt", "value": "A plain radiograph."}], "image": "rad/synpic201.jpg"},
    ]))
    irg = []
    for dicom, (gt, pred) in zip(DICOM, [("Small left effusion. No pneumothorax.", "### Assistant: Large right effusion."),
                                         ("Clear lungs. Normal heart size.", "### Assistant: The lungs are clear.")]):
        irg.append({"question": "Summarise the findings of this radiograph.", "Med-VLM answer": pred,
                    "ground-truth": gt, "qid": "", "image": f"{dicom}.jpg", "question-type": "",
                    "Hallucination-type": "", "answer-type": "",
                    "prompt": f"Reference:\n\n{gt}\n\nCandidate:\n\n{pred}\n\nGrade each candidate sentence."})
    (folder / "Irg.json").write_text(json.dumps(irg))
    return folder


@pytest.fixture(scope="module")
def hallmark_dir(tmp_path_factory) -> Path:
    return _write_fixtures(tmp_path_factory.mktemp("med_hallmark"))


def _load(config: str, data_dir, tmp_path, **kwargs):
    from medheval.data.benchmarks import prepare_benchmark

    return prepare_benchmark("med_hallmark", config, data_dir=data_dir, cache_dir=tmp_path / "cache", **kwargs)


# -- builder ---------------------------------------------------------------------------------------------------


def test_builder_on_fixtures_in_the_four_formats(hallmark_dir, tmp_path):
    conv = _load("conventional", hallmark_dir, tmp_path)
    rows = conv.dataset.to_list()
    assert [r["id"] for r in rows] == [f"med_hallmark/conventional/{i}" for i in (1, 2, 3, 4, 6)]
    first = rows[0]
    assert first["question"] == "Is there a fracture of the rib?" and first["answer"] == "No"
    assert first["meta"]["released_response"] == "Yes, a rib fracture is visible."
    assert first["meta"]["human_level"] == "catastrophic" and first["meta"]["human_label"] == 0
    assert first["images"] == ["synpic100.jpg"] and first["source"] == "vqa_rad"  # rad/ prefix dropped
    assert rows[3]["images"] == ["synpic103.jpg"]  # released without the prefix: same reference
    assert first["answer_type"] == "yes_no" and rows[1]["answer_type"] == "open" and first["category"] == "conventional"
    no_gt = rows[4]
    assert no_gt["answer"] == "" and no_gt["meta"]["quality_flags"] == ["no_ground_truth"]
    assert no_gt["meta"]["released_response"] == "No mass." and not no_gt["meta"]["has_ground_truth"]
    assert conv.quality["flags"] == {"no_ground_truth": 1}
    # fixture bytes are not the pinned ones: recorded as unverified, not refused
    assert conv.files[0]["relpath"] == "Conventional..json" and conv.files[0]["verified"] is False

    cf = _load("counterfactual", hallmark_dir, tmp_path).dataset.to_list()
    assert [r["source"] for r in cf] == ["slake", "slake"] and cf[0]["images"] == ["xmlab7/source.jpg"]
    assert all(r["meta"]["human_level"] == "prompt_induced" for r in cf) and cf[0]["answer"].startswith("This head")

    weak = _load("confidence_weakening", hallmark_dir, tmp_path).dataset.to_list()
    assert weak[0]["question"] == "Since you are still in training, reply to this: Is the aorta dilated?"
    assert weak[0]["meta"]["plain_question"] == "Is the aorta dilated?"
    assert weak[0]["meta"]["prefix"] == "Since you are still in training, reply to this:"
    assert weak[0]["answer_type"] == "yes_no" and weak[1]["answer_type"] == "open"
    assert [r["images"] for r in weak] == [["synpic200.jpg"], ["synpic201.jpg"]]
    assert [r["id"] for r in weak] == ["med_hallmark/confidence_weakening/1", "med_hallmark/confidence_weakening/2"]

    irg = _load("irg", hallmark_dir, tmp_path).dataset.to_list()
    assert [r["images"] for r in irg] == [[f"{d}.jpg"] for d in DICOM]
    assert all(r["source"] == "mimic_cxr" and r["meta"]["credentialed"] for r in irg)  # MIMIC-derived
    assert irg[0]["answer"] == "Small left effusion. No pneumothorax." and irg[0]["answer_type"] == "report"
    assert irg[0]["meta"]["released_response"] == "### Assistant: Large right effusion."
    assert "human_level" not in irg[0]["meta"]  # no IRG levels released
    assert not any(r["meta"]["credentialed"] for r in rows + cf + weak)


def test_judge_prompt_split_round_trips_and_bad_records_name_the_record(tmp_path):
    text = _grading_turn("Q with {braces}?", "An answer\nover two lines.", "GT")
    item = src.split_judge_prompt(text)
    assert (item.question, item.response, item.reference) == ("Q with {braces}?", "An answer\nover two lines.", "GT")
    assert item.template.render(question=item.question, response=item.response, reference=item.reference) == text
    assert src.split_judge_prompt(_grading_turn("Q?", "A.", None)).reference is None
    bad = [{"id": 9, "conversations": [{"from": "human", "value": "no fields here"}, {"from": "gpt", "value": "x"}],
            "image": "rad/synpic1.jpg", "classification_label": 0}]
    (tmp_path / "Conventional..json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"Conventional\.\.json: record #0 \(id=9\)"):
        list(src.judged_records(tmp_path / "Conventional..json", "conventional"))
    bad[0]["conversations"][0]["value"] = _grading_turn("Q?", "A.", "B")
    bad[0]["image"] = "../etc/passwd"
    (tmp_path / "Conventional..json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="id=9.*not a VQA-RAD"):
        list(src.judged_records(tmp_path / "Conventional..json", "conventional"))
    bad[0]["image"], bad[0]["classification_label"] = "rad/synpic1.jpg", 7
    (tmp_path / "Conventional..json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="classification_label 7"):
        list(src.judged_records(tmp_path / "Conventional..json", "conventional"))


@requires_hallmark
def test_builder_on_the_released_files(tmp_path):
    for config, count in src.COUNTS.items():
        loaded = _load(config, HALLMARK, tmp_path)
        rows = loaded.dataset.to_list()
        assert len(rows) == count and len({r["id"] for r in rows}) == count, config
        assert all(f["verified"] for f in loaded.files), config  # the pinned sha256 matches the real files
        if config in ("conventional", "counterfactual"):
            assert all(r["question"] and r["meta"]["released_response"] and r["meta"]["human_level"] in mh.LEVELS
                       for r in rows)
            with_gt = [r for r in rows if r["meta"]["has_ground_truth"]]
            assert len(with_gt) == {"conventional": 364, "counterfactual": 111}[config]
            assert all(r["answer"] for r in with_gt)
    raw = json.loads((HALLMARK / "Conventional..json").read_text())
    for record in raw:  # every record: the parsed fields and the template give the human turn back
        human = record["conversations"][0]["value"]
        item = src.split_judge_prompt(human)
        values = {"question": item.question, "response": item.response}
        if item.reference is not None:
            values["reference"] = item.reference
        assert item.template.render(**values) == human


# -- upstream prompts: exact, read at run time, never stored --------------------------------------------------


@requires_hallmark
def test_upstream_prompts_equal_the_released_text_byte_for_byte():
    for name in ("Conventional..json", "Counterfactual..json"):
        for record in json.loads((HALLMARK / name).read_text()):
            human = record["conversations"][0]["value"]
            item = src.split_judge_prompt(human)
            system, user = mh.vqa_prompt(item.question, item.response, item.reference, style="upstream",
                                         upstream_dir=str(HALLMARK))
            assert system is None and user == human
    for record in json.loads((HALLMARK / "Irg.json").read_text()):
        _, user = mh.irg_prompt(record["ground-truth"], record["Med-VLM answer"], style="upstream",
                                upstream_dir=str(HALLMARK))
        assert user == record["prompt"]


@requires_medheval_code
def test_upstream_sh_prompt_is_read_with_ast_and_equals_the_script_text():
    from medheval.families.medheval import sh_prompt

    script = (MEDHEVAL_CODE / sh_prompt.UPSTREAM_FILE.relpath).read_text()
    system, template = sh_prompt.upstream_prompt(str(MEDHEVAL_CODE))
    assert f'system_msg_eval = """{system}"""' in script  # the literal, byte for byte (no escapes in it)
    assert f'template="{template}"' in script and "{gr_pairs}" in template
    s, user = sh_prompt.render_upstream("Q?", "GT", ["first", "second"], data_dir=str(MEDHEVAL_CODE))
    assert s == system
    assert user == template.replace("{gr_pairs}", str({"input": "Q?", "ground_truth": "GT",
                                                        "models": {"model_1": "first", "model_2": "second"}}))


def test_upstream_prompt_files_must_match_the_pin(tmp_path):
    from medheval.families.medheval import sh_prompt

    (tmp_path / "Conventional..json").write_text("[]")
    with pytest.raises(ValueError, match="not the pinned"):
        src.upstream_vqa_template(True, str(tmp_path))
    target = tmp_path / sh_prompt.UPSTREAM_FILE.relpath
    target.parent.mkdir(parents=True)
    target.write_text('system_msg_eval = "edited"\n')
    with pytest.raises(ValueError, match="not the pinned"):
        sh_prompt.upstream_prompt(str(tmp_path))


@requires_hallmark
@requires_medheval_code
def test_no_copy_of_the_upstream_prompts_in_the_repository():
    from medheval.families.medheval import sh_prompt

    texts = [src.upstream_vqa_template(True, str(HALLMARK)).pieces[0],
             src.upstream_vqa_template(False, str(HALLMARK)).pieces[0],
             src.upstream_irg_template(str(HALLMARK)).pieces[-1], sh_prompt.upstream_prompt(str(MEDHEVAL_CODE))[0]]
    probes = {" ".join(t.split()[i:i + 12]) for t in texts for i in range(0, len(t.split()) - 12, 9)}
    assert len(probes) > 40
    offending = []
    for path in REPO.rglob("*"):
        if ".git" in path.parts or ".venv" in path.parts or not path.is_file() or path.suffix not in (
                ".py", ".md", ".txt", ".json", ".jsonl", ".yaml", ".yml", ".cfg", ".toml"):
            continue
        flat = " ".join(path.read_text(errors="ignore").split())
        offending += [(str(path), p) for p in probes if p in flat]
    assert not offending, offending[:3]


# -- medihall_detection: hand-worked -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def detection():
    import evaluate

    return evaluate.load(str(REPO / "metrics" / "medihall_detection"))


def test_detection_metric_hand_worked(detection):
    # human:     cat cat crit attr minor      predicted: cat minor cat attr minor
    human = ["catastrophic", "catastrophic", "critical", "attribute", "minor"]
    pred = ["Catastrophic Hallucinations", "minor", "catastrophic", "attribute", "Minor Hallucinations"]
    out = detection.compute(predictions=pred, references=human)
    # confusion rows=human (cat, crit, attr, prompt, minor, correct)
    assert out["confusion"]["rows"] == [[1, 0, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0],
                                        [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]]
    assert out["accuracy"] == pytest.approx(3 / 5)
    # p_e = sum row_k col_k / n^2: rows (2,1,1,0,1,0), cols (2,0,1,0,2,0) -> (4 + 0 + 1 + 0 + 2) / 25 = 7/25
    # kappa = (3/5 - 7/25) / (1 - 7/25) = (8/25) / (18/25) = 4/9
    assert out["cohen_kappa"] == pytest.approx(4 / 9)
    # quadratic: w_ij = (i-j)^2 / (K-1)^2 = (i-j)^2 / 25 over the six level positions.
    #   observed  sum w C = (cat->minor: 16 + crit->cat: 1) / 25 = 17/25
    #   expected  sum w E, E_ij = row_i col_j / n: sum row_i col_j (i-j)^2 with rows at positions
    #   0(2) 1(1) 2(1) 4(1) and cols at 0(2) 2(1) 4(2): 72 + 21 + 16 + 36 = 145 -> 145 / (25 * 5)
    #   kappa_q = 1 - (17/25) / (145/125) = 1 - 85/145 = 12/29
    assert out["quadratic_kappa"] == pytest.approx(12 / 29)
    # per level: cat P=1/2 R=1/2; minor P=1/2 R=1; attribute 1/1; critical P undefined (never predicted) R=0
    assert out["per_level"]["catastrophic"] == {"precision": 0.5, "recall": 0.5, "f1": 0.5, "support": 2}
    assert out["per_level"]["minor"]["f1"] == pytest.approx(2 / 3) and out["per_level"]["minor"]["support"] == 1
    assert out["per_level"]["critical"] == {"precision": None, "recall": 0.0, "f1": 0.0, "support": 1}
    assert out["per_level"]["correct"] == {"precision": None, "recall": None, "f1": None, "support": 0}
    # macro F1 over the levels that occur: cat 1/2, crit 0, attr 1, minor 2/3 -> (1/2 + 0 + 1 + 2/3) / 4
    assert out["macro_f1"] == pytest.approx((0.5 + 0 + 1 + 2 / 3) / 4)
    assert out["n"] == 5 and out["n_failed"] == 0


def test_detection_metric_perfect_failed_and_bad_inputs(detection):
    out = detection.compute(predictions=["correct", "attribute", "not a level", ""],
                            references=["correct", "attribute", "minor", "minor"], levels="vqa",
                            ids=["a", "b", "c", "d"])
    assert out["accuracy"] == 1.0 and out["cohen_kappa"] == 1.0 and out["quadratic_kappa"] == 1.0
    assert out["n"] == 2 and out["n_failed"] == 2 and [f["id"] for f in out["failed"]] == ["c", "d"]
    # one human class (issue 30, point 7): kappa is 0/0 (all agree) or 0 (some differ) whatever the predictions,
    # so it is not computable and says why; accuracy still says how often they agree
    for predictions, accuracy in ((["minor"] * 3, 1.0), (["minor", "minor", "attribute"], 2 / 3)):
        out = detection.compute(predictions=predictions, references=["minor"] * 3)
        assert (out["cohen_kappa"], out["quadratic_kappa"]) == (None, None) and out["accuracy"] == pytest.approx(accuracy)
        assert out["kappa_note"].startswith("not computable: every human level is minor (one class)")
    two = detection.compute(predictions=["minor", "minor"], references=["minor", "correct"])
    assert two["kappa_note"] is None and two["cohen_kappa"] == 0.0  # p_o = 1/2 = p_e: kappa 0, computable
    irg = detection.compute(predictions=["critical", "correct"], references=["critical", "attribute"], levels="irg")
    assert irg["confusion"]["levels"] == ["catastrophic", "critical", "attribute", "correct"]
    assert irg["confusion"]["rows"][2] == [0, 0, 0, 1]
    with pytest.raises(ValueError, match="reference #1"):
        detection.compute(predictions=["minor", "minor"], references=["minor", "mild"])
    with pytest.raises(ValueError, match="levels must be"):
        detection.compute(predictions=["minor"], references=["minor"], levels="report")
    with pytest.raises(ValueError, match=r"reference #0 .*not one of"):
        detection.compute(predictions=["minor"], references=["minor"], levels="irg")


# -- run_eval --task detection, rule classifier ---------------------------------------------------------------


def test_detection_run_with_the_rule_classifier(hallmark_dir, tmp_path):
    from medheval.cli import main

    out = tmp_path / "detect"
    assert main(["run", "--benchmark", "med_hallmark:conventional,med_hallmark:counterfactual", "--task",
                 "detection", "--detector", "rule", "--data-dir", str(hallmark_dir), "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    conv = results["benchmarks"]["med_hallmark:conventional"]["metrics"]
    det = conv["medihall_detection"]
    # rule levels: 1 catastrophic (yes/no presence), 2 minor (plane), 3 attribute (enlarged), 4 catastrophic
    # (organ identity -> presence; humans said critical), 6 catastrophic (no ground truth: aspect alone)
    scored = {json.loads(line)["id"]: json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()}
    assert [scored[f"med_hallmark/conventional/{i}"]["predicted_level"] for i in (1, 2, 3, 4, 6)] == [
        "catastrophic", "minor", "attribute", "catastrophic", "catastrophic"]
    # human (cat, minor, attr, crit, cat) vs rule: accuracy 4/5; rows (2,1,1,0,1,0) cols (3,0,1,0,1,0):
    # p_e = (6 + 0 + 1 + 1) / 25 = 8/25, kappa = (4/5 - 8/25) / (17/25) = 12/17
    assert det["accuracy"] == pytest.approx(0.8) and det["cohen_kappa"] == pytest.approx(12 / 17)
    assert det["n"] == 5 and det["n_failed"] == 0
    assert conv["by_subset"]["with_ground_truth"]["n"] == 4
    assert conv["by_subset"]["with_ground_truth"]["accuracy"] == pytest.approx(0.75)
    assert conv["by_subset"]["without_ground_truth"]["accuracy"] == 1.0
    # MediHall Score from the human levels: (0 + 0.8 + 0.4 + 0.2 + 0) / 5 = 0.28; from the rule's: 1.2 / 5
    assert det["medihall_score_human"] == pytest.approx(0.28) and det["medihall_score_predicted"] == pytest.approx(0.24)
    cf = results["benchmarks"]["med_hallmark:counterfactual"]["metrics"]["medihall_detection"]
    assert cf["accuracy"] == 1.0 and cf["distribution_predicted"]["prompt_induced"] == 2
    # its human levels are one class (prompt-induced): kappa not computable, said in results.md (issue 30.7)
    assert cf["cohen_kappa"] is None and cf["kappa_note"].startswith("not computable")
    assert results["settings"]["level_source"] == {"kind": "rule"}
    md = (out / "results.md").read_text()
    assert "| med_hallmark:conventional | all | 5 | 0 | 0.800 |" in md and "rows = human" in md
    assert "- `med_hallmark:counterfactual` · all: κ not computable: every human level is prompt_induced" in md


def test_detection_needs_human_levels_and_one_level_source(hallmark_dir, tmp_path, capsys):
    from medheval.cli import main

    base = ["run", "--task", "detection", "--data-dir", str(hallmark_dir)]
    assert main([*base, "--benchmark", "med_hallmark:irg", "--output", str(tmp_path / "a")]) == 2
    assert "no human hallucination levels" in capsys.readouterr().err
    assert main([*base, "--benchmark", "med_hallmark", "--judge", "openai:m@http://127.0.0.1:9/v1", "--detector",
                 "rule", "--output", str(tmp_path / "b")]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["run", "--benchmark", "med_hallmark", "--output", str(tmp_path / "c")]) == 2
    assert "--model" in capsys.readouterr().err


# -- MediHall Score on a model's answers, levels from a loopback judge ---------------------------------------


def test_medihall_run_with_a_loopback_judge(hallmark_dir, judge_server_factory, tmp_path):
    from medheval.cli import main

    answers = {1: "There is no fracture.", 2: "A sagittal slice.", 3: "Yes, it is enlarged.", 4: "The kidney.",
               6: "No mass is seen."}
    table = {"There is no fracture.": "Correct Statements", "A sagittal slice.": "Minor Hallucinations",
             "Yes, it is enlarged.": "Correct Statements", "The kidney.": "Correct Statements"}

    def reply(request):
        text = user_text(request)
        answer = next(a for a in table if f"Model answer: {a}" in text)
        return json.dumps({"level": table[answer]})

    server = judge_server_factory("openai", reply)
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"id": f"med_hallmark/conventional/{i}", "prediction": a}) + "\n"
                             for i, a in answers.items()))
    out = tmp_path / "run"
    assert main(["run", "--benchmark", "med_hallmark:conventional", "--predictions", str(preds), "--output", str(out),
                 "--data-dir", str(hallmark_dir), "--judge", f"openai:local-judge@{server.base_url}"]) == 0
    results = json.loads((out / "results.json").read_text())
    metrics = results["benchmarks"]["med_hallmark:conventional"]["metrics"]
    assert set(metrics) == {"medihall_score", "text_generation"}  # the benchmark's defaults
    mhs = metrics["medihall_score"]
    assert mhs["classifier"] == "judge" and mhs["judge"]["model"] == "local-judge"
    # (1.0 + 0.8 + 1.0 + 1.0) / 4; item 6 has no ground truth and no image: failed, counted, never sent
    assert mhs["medihall_score"] == pytest.approx(3.8 / 4) and mhs["n"] == 4 and mhs["n_failed"] == 1
    assert mhs["failed"][0]["id"] == "med_hallmark/conventional/6"
    assert mhs["level_distribution"] == {"catastrophic": 0, "critical": 0, "attribute": 0, "prompt_induced": 0,
                                         "minor": 1, "correct": 3}
    assert server.request_count == 4
    assert "MediHall" in (out / "results.md").read_text()


def test_counterfactual_premise_rule_moves_judge_levels_to_prompt_induced(judge_server_factory, tmp_path):
    import evaluate

    metric = evaluate.load(str(REPO / "metrics" / "medihall_score"))
    server = judge_server_factory("openai", lambda request: '{"level": "Catastrophic Hallucinations"}')
    kwargs = dict(predictions=["Yes, an MRI stroke.", "Yes."], references=["It is a CT.", "No"],
                  questions=["Given the MRI, is there a stroke?", "Is there a mass?"],
                  categories=["counterfactual", "conventional"], judge=f"openai:m@{server.base_url}",
                  cache_dir=str(tmp_path))
    out = metric.compute(**kwargs)
    assert out["levels"] == ["prompt_induced", "catastrophic"]  # only the false-premise question moves
    assert out["medihall_score"] == pytest.approx((0.6 + 0.0) / 2)
    assert metric.compute(**kwargs, premise_rule=False)["levels"] == ["catastrophic", "catastrophic"]


def test_irg_task_follows_the_report_answer_type():
    import evaluate

    metric = evaluate.load(str(REPO / "metrics" / "medihall_score"))
    out = metric.compute(predictions=["There is a large right pleural effusion. No pneumothorax."],
                         references=["Small right pleural effusion. No pneumothorax."], answer_types=["report"])
    assert out["task"] == "irg" and out["levels"] == [["attribute", "correct"]]


# -- images by id: MIMIC dicom ids through the metadata CSV, or a flat folder --------------------------------


def test_mimic_dicom_ids_resolve_through_the_metadata_csv_or_a_flat_folder(tmp_path):
    from PIL import Image

    from medheval.data.images import ImageResolver, MimicDicomSource, check_reference, parse_image_root

    files = tmp_path / "files"
    target = files / "p10" / "p10000032" / "s50414267" / f"{DICOM[0]}.jpg"
    target.parent.mkdir(parents=True)
    Image.new("RGB", (4, 4), "white").save(target)
    csv = tmp_path / "mimic-cxr-2.0.0-metadata.csv"
    csv.write_text(f"dicom_id,subject_id,study_id,ViewPosition\n{DICOM[0]},10000032,50414267,PA\n")
    source = parse_image_root(f"{files}#metadata={csv}")
    assert isinstance(source, MimicDicomSource)
    assert source.path_of(f"{DICOM[0]}.jpg") == f"p10/p10000032/s50414267/{DICOM[0]}.jpg"
    record = {"id": "med_hallmark/irg/1", "images": [f"{DICOM[0]}.jpg"], "source": "mimic_cxr"}
    resolver = ImageResolver({"mimic_cxr": source})
    assert resolver.load_record_images(record)[0].size == (4, 4)
    kept, missing = resolver.partition([record, {**record, "id": "x", "images": [f"{DICOM[1]}.jpg"]}], on_missing="skip")
    assert [r["id"] for r in kept] == ["med_hallmark/irg/1"] and missing == [("x", f"{DICOM[1]}.jpg")]
    assert check_reference("mimic_cxr", f"{DICOM[0]}.jpg")
    flat = tmp_path / "flat"
    flat.mkdir()
    Image.new("RGB", (2, 2)).save(flat / f"{DICOM[1]}.jpg")
    assert ImageResolver({"mimic_cxr": str(flat)}).load_record_images(
        {"images": [f"{DICOM[1]}.jpg"], "source": "mimic_cxr"})[0].size == (2, 2)
    bad = tmp_path / "bad.csv"
    bad.write_text("dicom,subject\n")
    with pytest.raises(Exception, match="expected columns"):
        MimicDicomSource(str(files), bad).path_of(f"{DICOM[0]}.jpg")


@requires_medheval_code
def test_sh_judge_upstream_style_sends_medheval_prompt_to_the_judge(judge_server_factory, tmp_path):
    import evaluate

    from medheval.families.medheval import sh_prompt

    system, _ = sh_prompt.upstream_prompt(str(MEDHEVAL_CODE))
    server = judge_server_factory("openai", lambda request: '{"model_1": 2}')
    metric = evaluate.load(str(REPO / "metrics" / "sh_judge"))
    out = metric.compute(predictions=["Metformin, plus insulin."], references=["Metformin"], questions=["First drug?"],
                         judge=f"openai:m@{server.base_url}", prompt_style="upstream", upstream_dir=str(MEDHEVAL_CODE),
                         cache_dir=str(tmp_path))
    assert out["scores"] == [2] and out["sh"] == 2.0 and out["prompt_style"] == "upstream"
    assert out["prompt_version"] == sh_prompt.UPSTREAM_PROMPT_VERSION
    messages = server.requests[0].json["messages"]
    assert messages[0] == {"role": "system", "content": system}
    assert "{'input': 'First drug?', 'ground_truth': 'Metformin', 'models': {'model_1': 'Metformin, plus insulin.'}}" \
        in messages[1]["content"]


def test_sh_is_shown_as_mean_plus_minus_std_in_the_tables():
    from medheval.report.tables import open_ended_table

    run = {"settings": {"model": "m", "mitigation": "none"},
           "benchmarks": {"knowledge:open": {"metrics": {"sh_judge": {"sh": 1.25, "sh_std": 0.5}}},
                          "context:default": {"metrics": {"sh_judge": {"sh": 2.0, "sh_std": None}}}}}
    table = open_ended_table([run])
    assert "| m | none | knowledge:open | 1.25 ± 0.50 |" in table
    assert "| m | none | context:default | 2.00 |" in table  # no std: the mean alone


def test_detector_flag_becomes_options_of_the_metrics_that_take_a_level_source():
    from medheval.run.protocol import benchmark_default_metrics, detector_options

    takes = {"classifier", "detector_path", "judge"}
    assert detector_options("rule", takes) == {"classifier": "rule"}
    assert detector_options("/models/det", takes) == {"classifier": "detector", "detector_path": "/models/det"}
    assert detector_options("/models/det", {"judge", "mode"}) == {}  # sh_judge: not a level-source metric
    assert detector_options(None, takes) == {}
    assert benchmark_default_metrics("med_hallmark") == ("medihall_score", "text_generation")
    assert benchmark_default_metrics("knowledge") is None


def test_reference_free_items_are_judged_with_their_image(hallmark_dir, judge_server_factory, tmp_path):
    """With --image-root, an item without ground truth reaches the judge with its image (and only it)."""
    from PIL import Image

    from judge_servers import image_parts
    from medheval.cli import main

    images = tmp_path / "vqa_rad"
    images.mkdir()
    for n in range(100, 105):
        Image.new("RGB", (8, 8), (n, 0, 0)).save(images / f"synpic{n}.jpg")
    seen = {}

    def reply(request):
        text = user_text(request)
        seen[text] = len(image_parts(request))
        return json.dumps({"level": "Correct Statements"})

    server = judge_server_factory("openai", reply)
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"id": f"med_hallmark/conventional/{i}", "prediction": a}) + "\n"
                             for i, a in {1: "There is no fracture.", 6: "No mass is seen."}.items()))
    out = tmp_path / "run"
    assert main(["run", "--benchmark", "med_hallmark:conventional", "--predictions", str(preds), "--output", str(out),
                 "--data-dir", str(hallmark_dir), "--judge", f"openai:local-judge@{server.base_url}",
                 "--image-root", f"vqa_rad={images}", "--metrics", "medihall_score", "--allow-missing-predictions"]) == 0
    mhs = json.loads((out / "results.json").read_text())["benchmarks"]["med_hallmark:conventional"]["metrics"][
        "medihall_score"]
    assert mhs["n"] == 2 and mhs["n_failed"] == 0 and mhs["medihall_score"] == pytest.approx(1.0)
    with_image = [text for text, count in seen.items() if count]
    assert len(seen) == 2 and len(with_image) == 1 and "No mass is seen." in with_image[0]


def test_confidence_weakening_plain_question_run_option(hallmark_dir, tmp_path):
    """question=plain drops the prefix (meta.plain_question) so a run can measure the prefix's effect."""
    from medheval.data.benchmarks import prepare_benchmark

    released = prepare_benchmark("med_hallmark", "confidence_weakening", data_dir=hallmark_dir,
                                 cache_dir=tmp_path / "c")
    plain = prepare_benchmark("med_hallmark", "confidence_weakening", data_dir=hallmark_dir, cache_dir=tmp_path / "c",
                              run_options={"question": "plain"})
    assert plain.run_options == {"question": "plain"} and len(plain.dataset) == len(released.dataset) > 0
    for before, after in zip(released.dataset, plain.dataset):
        assert after["question"] == before["meta"]["plain_question"] != before["question"]
        assert before["question"].endswith(after["question"]) and after["id"] == before["id"]
    with pytest.raises(ValueError, match="confidence_weakening config only"):
        prepare_benchmark("med_hallmark", "conventional", data_dir=hallmark_dir, cache_dir=tmp_path / "c",
                          run_options={"question": "plain"})
    with pytest.raises(ValueError, match="choose one of"):
        prepare_benchmark("med_hallmark", "confidence_weakening", data_dir=hallmark_dir, cache_dir=tmp_path / "c",
                          run_options={"question": "bare"})


# -- malformed records of the released formats: refused naming file, record and field ------------------------


@pytest.mark.parametrize("change, message", [
    ({"id": None}, r"Conventional\.\.json: record #1: field 'id' is null, expected an integer or a non-empty string"),
    ({"id": " "}, r"record #1: field 'id' is str \" \", expected an integer or a non-empty string"),
    ({"id": [2]}, r"record #1: field 'id' is list \[2\], expected an integer"),
    ({"classification_label": True}, r"record #1 \(id=2\): classification_label True is not an integer 0-5"),
    ({"image": 5}, r"record #1 \(id=2\): field 'image': image 5 is int, not a reference string"),
    ({"conversations": [{"from": "human", "value": "Grade this.\n\nNo fields.\n\nAnswer."},
                        {"from": "gpt", "value": "Minor"}]},
     r"record #1 \(id=2\): field 'conversations' \(human turn\): no 'question: … / Med-VLM answer: …' block"),
    ({"conversations": [{"from": "human", "value": _grading_turn("Q" * 60_000, "A.", "B")},
                        {"from": "gpt", "value": "Minor"}]},
     r"record #1 \(id=2\): field 'question' holds 60,000 characters, more than the 50,000"),
], ids=["null_id", "blank_id", "list_id", "bool_label", "int_image", "no_fields", "huge_question"])
def test_malformed_judged_records_name_file_record_and_field(hallmark_dir, tmp_path, change, message):
    """Were: a null/blank/list id became the record id '.../None', '.../ ', '.../[2]'; classification_label true
    was read as level 1; an int image was called "empty"; a human turn without the fields was reported as a
    problem of field 'image'; a 60,000-character question was read (every other builder refuses it)."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = json.loads((hallmark_dir / "Conventional..json").read_text())
    rows[1].update(change)
    (folder / "Conventional..json").write_text(json.dumps(rows))
    with pytest.raises(ValueError, match=message):
        _load("conventional", folder, tmp_path)


def test_an_empty_question_is_kept_and_flagged(hallmark_dir, tmp_path):
    """Was: a record whose question is blank loaded without a flag (the MedHEval builders flag empty_question)."""
    folder = tmp_path / "data"
    folder.mkdir()
    rows = json.loads((hallmark_dir / "Conventional..json").read_text())
    rows[1]["conversations"][0]["value"] = _grading_turn("  ", "It is a sagittal image.", "Axial")
    (folder / "Conventional..json").write_text(json.dumps(rows))
    loaded = _load("conventional", folder, tmp_path)
    assert loaded.dataset[1]["meta"]["quality_flags"] == ["empty_question"]
    assert loaded.quality["flags"] == {"no_ground_truth": 1, "empty_question": 1}
