"""Cross-checks: under the MedHEval paper protocols, the text LLaVA-Med-1.5 (vicuna_v1) and LLaVA-NeXT (llava_v1)
receive is the text MedHEval's released scripts build, character for character, for every released item.

The upstream side is built here, independently of the product: the instruction strings are read with ``ast``
out of the released ``model_vqa.py`` / ``model_open_vqa.py`` files (never executed), the scripts' branching is
written out below as the scripts have it, and ``Conversation.get_prompt`` (separator style TWO of each
fork) is re-implemented from the fields of ``conv_vicuna_v1`` / ``conv_llava_v1`` read with ``ast``. The
product side is :meth:`HFBackend.format_prompt` of a tiny LLaVA / LLaVA-NeXT configured by the protocol.
Skipped without ``../shared``.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

import pytest

from conftest import SHARED_UPSTREAM

CODE = SHARED_UPSTREAM / "medheval-code"
BASELINES = CODE / "code" / "baselines"
DATA = SHARED_UPSTREAM / "medheval"
pytestmark = pytest.mark.skipif(not BASELINES.is_dir() or not DATA.is_dir(),
                                reason="../shared/data/upstream/medheval-code (or medheval) is absent")

MED = BASELINES / "Med-LVLMs" / "llava-med-1.5"
NEXT = BASELINES / "Med-LVLMs" / "llava_1.6" / "LLaVA"
MITIGATION = BASELINES / "Mitigation" / "llava-med-1.5"
VISUAL = "Visual_Misinterpretation_Hallucination/close-ended/fine-grained"
SPLITS = [  # (split, file, reader, args)
    ("mm_vishal:slake", f"{VISUAL}/slake_qa_pairs.json", "visual", ("mm_vishal", "slake", "slake")),
    ("mm_vishal:vqa_rad", f"{VISUAL}/rad_vqa_pairs.json", "visual", ("mm_vishal", "vqa_rad", "vqa_rad")),
    ("cxr_vishal:iu_xray", f"{VISUAL}/xray_closed_pairs.json", "visual", ("cxr_vishal", "iu_xray", "iu_xray")),
    ("cxr_vishal:mimic_cxr", f"{VISUAL}/mimic_cxr_closed_pairs.json", "visual", ("cxr_vishal", "mimic_cxr", "mimic_cxr")),
    ("knowledge:closed", "Knowledge_Deficiency_Hallucination/close-ended/MIMIC-CXR_sampled.json", "text",
     ("knowledge", "closed", "knowledge")),
    ("knowledge:open", "Knowledge_Deficiency_Hallucination/open-ended/MIMIC-CXR_pairs.json", "text",
     ("knowledge", "open", "knowledge")),
    ("context", "Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json", "text", ("context", "default", "context")),
    ("vishal_report", "Visual_Misinterpretation_Hallucination/open-ended/MIMIC-CXR_pairs.json", "report",
     ("vishal_report", "default")),
]


# ------------------------------------------------------------------ upstream strings, read with ast
def appended_strings(path: Path) -> list[str]:
    """String constants the script appends to ``question``/``qs`` (``+=`` or ``question = … + "…"``), in order;
    an f-string contributes its leading constant."""
    found: list[tuple[int, str]] = []

    def text(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant):
            return node.values[0].value
        return None

    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name) and node.target.id in ("question", "qs"):
            if text(node.value) is not None:
                found.append((node.lineno, text(node.value)))
            elif isinstance(node.value, ast.BinOp) and text(node.value.left) is not None:
                found.append((node.lineno, text(node.value.left)))
        elif (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "question" for t in node.targets)
              and isinstance(node.value, ast.BinOp) and text(node.value.right) is not None):
            found.append((node.lineno, text(node.value.right)))
    return [string for _, string in sorted(found)]  # source order (ast.walk is breadth-first)


def conversation_fields(path: Path, variable: str) -> dict:
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == variable:
            fields = {k.arg: ast.literal_eval(k.value) for k in node.value.keywords if k.arg in ("system", "roles", "sep", "sep2")}
            fields["sep_style"] = next(k.value.attr for k in node.value.keywords if k.arg == "sep_style")
            return fields
    raise AssertionError(f"{variable} not in {path}")


def get_prompt_two(fields: dict, message: str, llava_med_fork: bool) -> str:
    """``Conversation.get_prompt`` for [(USER, message), (ASSISTANT, None)], separator style TWO."""
    assert fields["sep_style"] == "TWO"
    seps = [fields["sep"], fields["sep2"]]
    ret = fields["system"] + seps[0]
    for i, (role, msg) in enumerate([(fields["roles"][0], message), (fields["roles"][1], None)]):
        if msg:
            if llava_med_fork:  # LLaVA-Med's fork: "{sep2} " after an assistant turn, message stripped, result stripped
                sep = "{0} ".format(fields["sep2"]) if seps[i % 2] == fields["sep2"] else fields["sep"]
                ret += role + ": " + msg.strip() + sep
            else:
                ret += role + ": " + msg + seps[i % 2]
        else:
            ret += role + ":"
    return ret.strip() if llava_med_fork else ret


@pytest.fixture(scope="module")
def upstream() -> dict:
    med_close, med_open = appended_strings(MED / "llava/eval/model_vqa.py"), appended_strings(MED / "llava/eval/model_open_vqa.py")
    next_close, next_open = appended_strings(NEXT / "llava/eval/model_vqa.py"), appended_strings(NEXT / "llava/eval/model_open_vqa.py")
    mitigation = appended_strings(MITIGATION / "llava/eval/model_vqa.py")
    assert len(med_close) == 2 and med_open == [] and len(next_close) == 2 and len(next_open) == 1, \
        (med_close, med_open, next_close, next_open)
    assert len(mitigation) == 2, mitigation
    return {
        "med": {"mc": med_close[0], "yes_no": med_close[1]},
        "next": {"mc": next_close[0], "yes_no": next_close[1], "open": next_open[0]},
        "mitigation": {"mc": mitigation[0], "yes_no": mitigation[1]},
        "vicuna_v1": conversation_fields(MED / "llava/conversation.py", "conv_vicuna_v1"),
        "llava_v1": conversation_fields(NEXT / "llava/conversation.py", "conv_llava_v1"),
    }


def upstream_text(line: dict, protocol: str, model: str, up: dict) -> str:
    """The ``qs`` each released script builds from one released line (its branches written out)."""
    if protocol == "medheval-baseline":
        if "question_type" not in line or line["question_type"] in ("type4_Knowledge",) or "structured_answer" in line:
            # model_open_vqa.py (knowledge open; report questions under the same rule, inferred)
            if model == "llava_next":
                return line["question"] + up["next"]["open"]
            return line["question"].replace("<image>", "").strip()
        strings = up["next" if model == "llava_next" else "med"]
        question = line["question"]
        if line["question_type"] == "multi-choice":
            assert len(line["choices"]) >= 4
            question += f"{strings['mc']}{line['choices']}"
        else:
            question += strings["yes_no"]
        return question if model == "llava_next" else question.replace("<image>", "").strip()
    qs = line["question"]
    if "choices" in line and line["choices"] is not None and len(line["choices"]) > 10:
        qs += up["mitigation"]["mc"] + line["choices"]
    if "question_type" in line and line["question_type"] == "binary":
        qs += up["mitigation"]["yes_no"]
    return qs.replace("<image>", "").strip()


@pytest.fixture(scope="module")
def backends():
    from medheval.backends.hf import HFBackend
    from medheval.backends.tiny import build_tiny_llava
    from medheval.backends.tiny_families import build_tiny_llava_next

    made = {}
    for kind, build in (("llava", build_tiny_llava), ("llava_next", build_tiny_llava_next)):
        model, processor = build(seed=0)
        made[kind] = HFBackend(model, processor, device="cpu")
    return made


def records_of(file: str, reader: str, args: tuple) -> tuple[list[dict], list[dict]]:
    import json

    from medheval.families.medheval import source

    path = DATA / file
    lines = json.loads(path.read_text())
    read = {"visual": source.visual_close_records, "text": source.text_records, "report": source.report_records}[reader]
    return lines, list(read(path, *args))


@pytest.fixture(scope="module")
def code_dir(monkeypatch_module):
    monkeypatch_module.setenv("MEDHEVAL_UPSTREAM_CODE", str(CODE))


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def compare(split_file: str, reader: str, args: tuple, protocol_name: str, backends: dict, up: dict) -> Counter:
    """``Counter`` of (model, answer_type, identical) over every released item of one file."""
    from medheval.run.paper_protocols import configure_backend, get_protocol

    protocol = get_protocol(protocol_name)
    lines, records = records_of(split_file, reader, args)
    assert len(lines) == len(records)
    counts: Counter = Counter()
    for kind, backend in backends.items():
        ours = configure_backend(backend, protocol)
        template = up["llava_v1" if kind == "llava_next" else "vicuna_v1"]
        for line, record in zip(lines, records):
            if "question_type" not in line and "ground_truth_type" in line and protocol_name == "medheval-baseline":
                line = {**line, "question_type": line["ground_truth_type"]}  # the protocol's inference (see card)
            message = "<image>\n" + upstream_text(line, protocol_name, kind, up)
            expected = get_prompt_two(template, message, llava_med_fork=kind != "llava_next")
            got = ours.format_prompt(record, 1)
            counts[(kind, record["answer_type"], got == expected)] += 1
            if got != expected and counts[(kind, record["answer_type"], False)] == 1:
                print(f"{record['id']} {kind}:\n  ours:     {got!r}\n  upstream: {expected!r}")
    return counts


@pytest.mark.parametrize("protocol_name", ["medheval-baseline", "medheval-mitigation"])
@pytest.mark.parametrize("split,file,reader,args", SPLITS, ids=[s[0] for s in SPLITS])
def test_rendered_inputs_equal_the_released_scripts(split, file, reader, args, protocol_name, backends, upstream,
                                                    code_dir):
    counts = compare(file, reader, args, protocol_name, backends, upstream)
    differing = {key: n for key, n in counts.items() if not key[2]}
    assert not differing, f"{split} under {protocol_name}: inputs differ from upstream: {differing}"
    assert sum(counts.values()) > 0


def test_the_upstream_strings_are_the_protocol_constants(upstream):
    """The constants the product keeps are the released fragments (read here with ast)."""
    from medheval.run.paper_protocols import medheval as m

    assert (m.MC_BASELINE, m.YES_NO) == (upstream["med"]["mc"], upstream["med"]["yes_no"])
    assert (m.YES_NO_NEXT, m.OPEN_NEXT) == (upstream["next"]["yes_no"], upstream["next"]["open"])
    assert (m.MC_MITIGATION, m.YES_NO) == (upstream["mitigation"]["mc"], upstream["mitigation"]["yes_no"])


def test_the_scripts_decode_as_the_protocols_say():
    """Decoding settings read out of the released scripts with ast: argparse defaults and the per-method branches."""
    from medheval.run.paper_protocols import get_protocol

    def defaults(path: Path) -> dict:
        out = {}
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
                flag = ast.literal_eval(node.args[0])
                for keyword in node.keywords:
                    if keyword.arg == "default":
                        out[flag] = ast.literal_eval(keyword.value)
        return out

    def generate_keywords(path: Path) -> list[dict]:
        calls = []
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "generate":
                kw = {}
                for keyword in node.keywords:
                    try:
                        kw[keyword.arg] = ast.literal_eval(keyword.value)
                    except ValueError:
                        kw[keyword.arg] = ast.unparse(keyword.value)
                calls.append(kw)
        return calls

    baseline = get_protocol("medheval-baseline").generation["none"]["defaults"]
    for script in (MED / "llava/eval/model_vqa.py", NEXT / "llava/eval/model_vqa.py"):
        args = defaults(script)
        assert (args["--temperature"], args["--top_p"], args["--num_beams"]) == (baseline["temperature"], None, 1)
        (call,) = generate_keywords(script)
        assert call["max_new_tokens"] == baseline["max_new_tokens"] == 1024
    assert defaults(MED / "llava/eval/model_vqa.py")["--conv-mode"] == "vicuna_v1"
    assert defaults(NEXT / "llava/eval/model_vqa.py")["--conv-mode"] == "llava_v1"

    mitigation = get_protocol("medheval-mitigation")
    script = MITIGATION / "llava/eval/model_vqa.py"
    assert defaults(script)["--temperature"] == mitigation.generation["none"]["defaults"]["temperature"] == 0.7
    calls = {("opera" if c.get("opera_decoding") else "dola" if c.get("dola_decoding") else "avisc" if c.get("use_avisc")
              is True else "m3id" if c.get("use_m3id") else "damro" if c.get("use_damro") else "vcd" if "cd_alpha" in c
              and c.get("cd_alpha") == 1 and "images_cd" in c and "use_avisc" not in c else
              "pai" if "logits_processor" in c else None): c for c in generate_keywords(script)}
    for name in ("vcd", "avisc", "m3id", "damro", "pai", "opera"):
        call, ours = calls[name], mitigation.generation[name]["defaults"]
        assert bool(call.get("do_sample", False)) == ours["do_sample"], name
        assert call["max_new_tokens"] == ours["max_new_tokens"], name
        if call.get("do_sample"):
            assert float(call["temperature"]) == ours["temperature"], name
            assert (0 if "top_k" in call and call["top_k"] is None else 50) == ours["top_k"], name
    assert "do_sample" not in calls["dola"] and mitigation.generation["dola"]["defaults"]["do_sample"] is False
    opera = calls["opera"]
    assert (opera["num_beams"], opera["scale_factor"], opera["threshold"]) == (5, 25, 25)
    assert mitigation.mitigation_options["opera"] == {"scale_factor": 25.0, "threshold": 25}


def measure(backends: dict, up: dict) -> list[tuple]:
    """Rows (split, answer_type, protocol, model, n, identical) for the issue note's table."""
    rows = []
    for split, file, reader, args in SPLITS:
        for protocol_name in ("medheval-baseline", "medheval-mitigation"):
            counts = compare(file, reader, args, protocol_name, backends, up)
            for kind in ("llava", "llava_next"):
                for answer_type in sorted({key[1] for key in counts if key[0] == kind}):
                    n = counts[(kind, answer_type, True)] + counts[(kind, answer_type, False)]
                    rows.append((split, answer_type, protocol_name, kind, n, counts[(kind, answer_type, True)]))
    return rows


# ------------------------------------------------------------------ launchers and every baseline script's decoding
def _argparse_defaults(path: Path) -> dict:
    found = {}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            for keyword in node.keywords:
                if keyword.arg == "default":
                    found[ast.literal_eval(node.args[0])] = ast.literal_eval(keyword.value)
    return found


def _generate_calls(path: Path) -> list[dict[str, str]]:
    """Each ``*.generate(...)`` call of a script: keyword -> its source text."""
    return [{k.arg: ast.unparse(k.value) for k in node.keywords if k.arg}
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "generate"]


@pytest.mark.parametrize("fork,template", [(MED, "vicuna_v1"), (NEXT, "llava_v1")], ids=["llava-med-1.5", "llava-1.6"])
def test_every_baseline_script_and_launcher_decodes_as_the_protocol(fork, template):
    """Both baseline scripts of each fork (close-ended model_vqa.py, open-ended model_open_vqa.py) decode with
    the protocol's settings, and nothing between the shell scripts and them changes those settings: the
    shell scripts and eval_batch.py pass no decoding or template flag, and open-ended files go to the open
    script only through --question_type open (Type1_open.sh, Type2_open.sh)."""
    import re

    from medheval.run.paper_protocols import get_protocol

    ours = get_protocol("medheval-baseline").generation["none"]["defaults"]
    # no repetition, length or stop-string setting of our own: the scripts set none either
    assert set(ours) == {"do_sample", "temperature", "top_p", "top_k", "num_beams", "max_new_tokens"}
    allowed = {"images", "image_sizes", "do_sample", "temperature", "top_p", "num_beams", "max_new_tokens",
               "use_cache", "stopping_criteria"}
    sep2 = conversation_fields(fork / "llava/conversation.py", f"conv_{template}")["sep2"]
    for script in ("model_vqa.py", "model_open_vqa.py"):
        path = fork / "llava/eval" / script
        args = _argparse_defaults(path)
        assert (args["--temperature"], args["--top_p"], args["--num_beams"], args["--conv-mode"]) == \
            (ours["temperature"], None, ours["num_beams"], template), script
        (call,) = _generate_calls(path)
        assert set(call) <= allowed, (script, set(call) - allowed)
        assert call["do_sample"] == "True if args.temperature > 0 else False" and ours["do_sample"] is True
        assert (call["temperature"], call["top_p"], call["num_beams"]) == \
            ("args.temperature", "args.top_p", "args.num_beams"), script
        assert int(call["max_new_tokens"]) == ours["max_new_tokens"], script
        if "stopping_criteria" in call:  # the keyword is the template's sep2, i.e. the EOS token itself
            assert "keywords = [stop_str]" in path.read_text() and sep2 == "</s>", script

    # the command template: the string literal whose .format() builds ``cmd`` (comments are not part of it)
    launcher = ast.parse((fork / "llava/eval/eval_batch.py").read_text())
    (command,) = [node.value.func.value.value for node in ast.walk(launcher)
                  if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "cmd"]
    flags = set(re.findall(r"--[\w-]+", command))
    assert flags == {"--model-path", "--question-file", "--image-folder", "--answers-file", "--num-chunks",
                     "--chunk-idx"}, flags
    for shell in sorted((fork / "inference_scripts").glob("*.sh")):
        text = shell.read_text()
        given = set(re.findall(r"--[\w-]+", text))
        assert given <= {"--num-chunks", "--model-name", "--question-file", "--image-folder", "--answers-file",
                         "--question_type"}, (shell.name, given)
        question_file = re.search(r"--question-file\s+(\S+)", text).group(1)
        opens = "--question_type open" in text or "open" in question_file
        assert opens == shell.name.startswith(("Type1_open", "Type2_open")), shell.name
