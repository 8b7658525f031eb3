"""LLaVA's conversation templates by name (``vicuna_v1``, ``llava_v1``, ``mistral_instruct``), read as data.

The LLaVA code bases build a prompt with ``conv_templates[conv_mode]`` from their ``llava/conversation.py``:
a system text, two role names and separators, joined by a separator style. MedHEval's released inference
code ran LLaVA-Med-1.5 with ``vicuna_v1`` (``Med-LVLMs/llava-med-1.5`` and ``Mitigation/llava-med-1.5``)
and LLaVA-NeXT with ``llava_v1`` (``Med-LVLMs/llava_1.6``). Those strings are upstream text, so this
module never carries them: it fetches the pinned ``conversation.py`` (URL at commit ``7f7d980e`` and
sha256, cached like the annotations, :mod:`medheval.data.fetch`), parses it with :mod:`ast` (never
imported or executed) and renders with the separator-style rules below.

Rendering one user turn ``m`` followed by an open assistant turn (``conv.append_message(roles[0], m);
conv.append_message(roles[1], None); conv.get_prompt()``):

* ``TWO`` (vicuna_v1, llava_v1): ``system + sep + roles[0] + ": " + m + sep + roles[1] + ":"``.
  LLaVA-Med's file strips ``m`` and then the whole prompt (``strips=True``); LLaVA 1.6's does not.
* ``LLAMA_2`` (mistral_instruct): ``"[INST] " + wrap_sys(system) + m + " [/INST]"`` where ``wrap_sys(s)``
  is ``"<<SYS>>\\n" + s + "\\n<</SYS>>\\n\\n"`` for a non-empty ``s`` (else empty), with ``sep`` in front
  and then left-stripped (``str.lstrip(sep)``).

The tokenizer adds BOS in front, as LLaVA's ``tokenizer_image_token`` does.

Which file a name is read from: :data:`TEMPLATE_SOURCES`. ``MEDHEVAL_UPSTREAM_CODE=<dir>`` points at a local
copy of the MedHEval repository root (``<dir>/code/baselines/...``) instead of the download; a copy whose
sha256 differs from the pin is refused.
"""

from __future__ import annotations

import ast
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from medheval.data.fetch import PinnedFile, fetch

_COMMIT = "7f7d980e676890ed99513f4629fd4d5af19bc8b9"
_BASE = f"https://raw.githubusercontent.com/Aofei-Chang/MedHEval/{_COMMIT}"
UPSTREAM_CODE_ENV = "MEDHEVAL_UPSTREAM_CODE"


def _pin(relpath: str, sha256: str) -> PinnedFile:
    return PinnedFile(relpath=relpath, url=f"{_BASE}/{relpath}", sha256=sha256)


LLAVA_MED_CONVERSATION = _pin("code/baselines/Med-LVLMs/llava-med-1.5/llava/conversation.py",
                              "dd9c8b52c0f22ea53ff60312b220fdf3c13a8c87e5ad8c9c38f41e94f0cb1943")
LLAVA_16_CONVERSATION = _pin("code/baselines/Med-LVLMs/llava_1.6/LLaVA/llava/conversation.py",
                             "5afd26fa231082cb6fdc100c3887d663f72d8c99a93dcdd285dac303ca72e45c")
# whether a file's TWO style strips the message and the prompt (LLaVA-Med's fork does, LLaVA 1.6 does not)
STRIPS = {LLAVA_MED_CONVERSATION.relpath: True, LLAVA_16_CONVERSATION.relpath: False}

TEMPLATE_SOURCES: dict[str, PinnedFile] = {
    "vicuna_v1": LLAVA_MED_CONVERSATION,       # LLaVA-Med-1.5 in MedHEval's baseline and mitigation scripts
    "mistral_instruct": LLAVA_MED_CONVERSATION,  # LLaVA-Med-1.5's own training template
    "llava_v1": LLAVA_16_CONVERSATION,         # LLaVA-NeXT (llava-v1.6-vicuna) in MedHEval's baseline scripts
}
MODEL_TEMPLATE = "model"  # the processor's own chat template
TEMPLATE_NAMES = (MODEL_TEMPLATE, *TEMPLATE_SOURCES)
SUPPORTED_STYLES = ("TWO", "LLAMA_2")


class TemplateError(ValueError):
    """A template name is unknown, or an upstream file does not hold it in the expected shape."""


@dataclass(frozen=True)
class ConversationTemplate:
    """One ``Conversation(...)`` of a ``conversation.py``: the fields :meth:`render` needs."""

    name: str
    system: str
    roles: tuple[str, str]
    sep_style: str
    sep: str
    sep2: str | None
    strips: bool  # TWO style: strip the message and the prompt (LLaVA-Med's fork)
    source: str  # the file it was read from (relpath or path)

    def render(self, message: str) -> str:
        """The prompt for one user ``message`` and an open assistant turn (rules in the module docstring)."""
        if self.sep_style == "TWO":
            body = message.strip() if self.strips else message
            text = f"{self.system}{self.sep}{self.roles[0]}: {body}{self.sep}{self.roles[1]}:"
            return text.strip() if self.strips else text
        if self.sep_style == "LLAMA_2":
            system = f"<<SYS>>\n{self.system}\n<</SYS>>\n\n" if self.system else ""
            return f"{self.sep}[INST] {system}{message} [/INST]".lstrip(self.sep)  # lstrip(""): strips nothing
        raise TemplateError(f"template {self.name!r} ({self.source}) uses separator style {self.sep_style}; "
                            f"supported: {', '.join(SUPPORTED_STYLES)}")

    def describe(self) -> dict:
        return {"name": self.name, "system": self.system, "roles": list(self.roles), "sep_style": self.sep_style,
                "sep": self.sep, "sep2": self.sep2, "strips": self.strips, "source": self.source}


def _constant(node: ast.AST, where: str):
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise TemplateError(f"{where}: not a literal value") from None


def parse_conversation_file(path: str | Path, strips: bool) -> dict[str, ConversationTemplate]:
    """Every ``conv_templates`` entry of a LLaVA ``conversation.py`` whose ``Conversation(...)`` is literal,
    read with :mod:`ast` (the file is never executed). ``strips``: the file's TWO-style stripping rule."""
    path = Path(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    conversations: dict[str, dict] = {}
    names: dict[str, str] = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        target, value = node.targets[0].id, node.value
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "Conversation":
            fields: dict = {}
            for keyword in value.keywords:
                if keyword.arg == "sep_style":
                    if not isinstance(keyword.value, ast.Attribute):
                        raise TemplateError(f"{path}: {target}.sep_style is not SeparatorStyle.<NAME>")
                    fields["sep_style"] = keyword.value.attr
                elif keyword.arg in ("system", "roles", "sep", "sep2"):
                    fields[keyword.arg] = _constant(keyword.value, f"{path}: {target}.{keyword.arg}")
            conversations[target] = fields
        elif target == "conv_templates" and isinstance(value, ast.Dict):
            for key, item in zip(value.keys, value.values):
                if isinstance(key, ast.Constant) and isinstance(item, ast.Name):
                    names[str(key.value)] = item.id
    templates: dict[str, ConversationTemplate] = {}
    for name, variable in names.items():
        fields = conversations.get(variable)
        if fields is None or "system" not in fields or "roles" not in fields:
            continue
        templates[name] = ConversationTemplate(
            name=name, system=fields["system"], roles=tuple(fields["roles"]),
            sep_style=fields.get("sep_style", "SINGLE"), sep=fields.get("sep", "###"), sep2=fields.get("sep2"),
            strips=strips, source=str(path))
    return templates


def upstream_code_dir() -> str | None:
    """``$MEDHEVAL_UPSTREAM_CODE`` (a local copy of the MedHEval repository root), else ``None`` (download)."""
    value = os.environ.get(UPSTREAM_CODE_ENV, "").strip()
    return value or None


@functools.lru_cache(maxsize=None)
def _load(relpath: str, code_dir: str | None) -> dict[str, ConversationTemplate]:
    """The templates of one pinned file; ``code_dir`` (``$MEDHEVAL_UPSTREAM_CODE``, read by :func:`fetch`) keys the
    memo, so setting the variable reads the file again."""
    pinned = next(pin for pin in (LLAVA_MED_CONVERSATION, LLAVA_16_CONVERSATION) if pin.relpath == relpath)
    got = fetch(pinned, folder_env=UPSTREAM_CODE_ENV, what="conversation template file of MedHEval's release", fix=(
        f"set {UPSTREAM_CODE_ENV}=<folder>, a local copy of the MedHEval repository root where <folder>/{relpath} "
        "exists, or allow network access to fetch it once into the cache; or run without the paper's template: "
        "--chat-template model (the processor's own) or --protocol clean"))
    if not got.verified:
        raise TemplateError(f"{got.path} has sha256 {got.sha256}, not the pinned {pinned.sha256}: conversation "
                            f"templates are read only from the released file ({pinned.url})")
    templates = parse_conversation_file(got.path, STRIPS[relpath])
    for template in templates.values():
        object.__setattr__(template, "source", pinned.url)
    return templates


def conversation_template(name: str) -> ConversationTemplate:
    """The named upstream template (fetched, verified and parsed once per process)."""
    if name not in TEMPLATE_SOURCES:
        raise TemplateError(f"unknown conversation template {name!r}; known: {', '.join(TEMPLATE_NAMES)} "
                            f"({MODEL_TEMPLATE!r} = the processor's own chat template)")
    pinned = TEMPLATE_SOURCES[name]
    templates = _load(pinned.relpath, upstream_code_dir())
    if name not in templates:
        raise TemplateError(f"{pinned.url} has no literal conv_templates[{name!r}]")
    return templates[name]


def check_template_file(name: str | None) -> None:
    """Fetch, verify and parse the upstream file template ``name`` is read from (memoized, so rendering reads it
    again for free); nothing for ``None`` or ``model`` (no upstream file)."""
    if name not in (None, MODEL_TEMPLATE):
        conversation_template(name)


def check_template_name(name: str | None) -> str | None:
    """``name`` when it is a known template name (or ``None``), else a :class:`TemplateError` listing them."""
    if name is not None and name not in TEMPLATE_NAMES:
        raise TemplateError(f"unknown --chat-template {name!r}; known: {', '.join(TEMPLATE_NAMES)}")
    return name


__all__ = ["ConversationTemplate", "LLAVA_16_CONVERSATION", "LLAVA_MED_CONVERSATION", "MODEL_TEMPLATE",
           "TEMPLATE_NAMES", "TEMPLATE_SOURCES", "TemplateError", "check_template_file", "check_template_name",
           "conversation_template", "parse_conversation_file", "upstream_code_dir"]
