"""Protocol cards ``docs/protocols/<name>.md``, written from each protocol's data.

``python -m medheval.run.paper_protocols.cards`` rewrites them; ``tests/test_paper_protocols.py`` checks
that each card is the one its protocol writes and that every listed conflict is what the protocol does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from medheval.run.paper_protocols import list_protocols
from medheval.run.paper_protocols.base import PaperProtocol

DOCS = Path(__file__).resolve().parents[3] / "docs" / "protocols"


def _value(value: Any) -> str:
    return f"`{json.dumps(value)}`"


def card(protocol: PaperProtocol) -> str:
    """The markdown card of one protocol."""
    lines = [f"# Protocol `{protocol.name}`", "", protocol.title + ".", "",
             f"- Reproduces: {protocol.reproduces}", f"- Source: {protocol.source}",
             f"- Benchmarks: {', '.join(protocol.benchmarks) or 'any'}",
             f"- Seeds: {', '.join(str(s) for s in protocol.seeds)}",
             f"- Prompt version: `{protocol.prompt_version or 'medheval/run/prompts.py'}`", ""]
    if protocol.templates:
        lines += ["## Conversation template by model type", "", "| model_type | template | instruction script |",
                  "|---|---|---|"]
        lines += [f"| `{kind}` | `{name}` | {protocol.script_for(None if kind == '*' else kind) or '—'} |"
                  for kind, name in protocol.templates.items()]
        lines += [""]
    if protocol.generation:
        lines += ["## Generation settings by mitigation", "", "| mitigation | layer | settings |", "|---|---|---|"]
        for mitigation, layers in protocol.generation.items():
            for layer, values in layers.items():
                lines.append(f"| `{mitigation}` | {layer} | {_value(values)} |")
        lines += [""]
    if protocol.mitigation_options:
        lines += ["## Mitigation options (the user's own options win; `preset=` replaces them)", "",
                  "| mitigation | options |", "|---|---|"]
        lines += [f"| `{name}` | {_value(values)} |" for name, values in protocol.mitigation_options.items()]
        lines += [""]
    if protocol.benchmark_options:
        lines += ["## Benchmark run options (under the user's `--benchmark-option`)", "", "| benchmark | options |",
                  "|---|---|"]
        lines += [f"| `{name}` | {_value(values)} |" for name, values in protocol.benchmark_options.items()]
        lines += [""]
    if protocol.upstream_compat or protocol.metric_options or protocol.scoring_notes or protocol.gpu_dtype \
            or protocol.grey_padding:
        lines += ["## Scoring, precision and pixels", ""]
        if protocol.upstream_compat:
            lines += ["- Scored with the paper's released scorers (`upstream_compat`); `--no-upstream-compat` scores "
                      "with this project's rules, and the Reproduction table then calls the run not comparable."]
        lines += [f"- Metric `{name}`: {_value(values)} (under the user's `--metric-option`)."
                  for name, values in protocol.metric_options.items()]
        lines += [f"- {note}" for note in protocol.scoring_notes]
        if protocol.gpu_dtype:
            lines += [f"- The model loads in `{protocol.gpu_dtype}` on a GPU unless `--dtype` is given (a CPU run "
                      "keeps float32)."]
        if protocol.grey_padding:
            lines += ["- A grayscale image goes to a processor that pads to a square (LLaVA-Med-1.5's) on a grey "
                      "canvas of ⌊255·mean(image_mean)⌋ (114), as the released `process_images` pads it; "
                      "`medheval/backends/grey_padding.py`."]
        lines += [""]
    if protocol.upstream_tokens:
        types = ", ".join(f"`{name}`" for name in protocol.upstream_tokens)
        lines += ["## Prompt tokens", "",
                  f"- Models of type {types}: the prompt ids are built as LLaVA's `tokenizer_image_token` builds "
                  "them (each piece around `<image>` tokenized alone, BOS from the first piece only), each image "
                  "then expanded to as many image tokens as the processor gives it; recorded as "
                  "`settings.backend.tokenization: upstream_chunked`; `medheval/backends/llava_tokens.py`. Other "
                  "models keep the processor's tokenization.", ""]
    lines += ["## Code and paper disagree (the code's value is the default)", ""]
    if protocol.conflicts:
        lines += ["| setting | code | paper | paper's value with | where |", "|---|---|---|---|---|"]
        lines += [f"| {c.setting} | {_value(c.code)} | {_value(c.paper)} | `{c.paper_option}` | {c.where} |"
                  for c in protocol.conflicts]
    else:
        lines += ["None found."]
    lines += ["", "## Inferred (not stated by the code or the paper)", ""]
    lines += [f"- {note}" for note in protocol.inferred] or ["Nothing."]
    return "\n".join(lines) + "\n"


def write_cards(folder: Path = DOCS) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for protocol in list_protocols():
        path = folder / f"{protocol.name}.md"
        path.write_text(card(protocol), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    for written in write_cards(Path(sys.argv[1]) if len(sys.argv) > 1 else DOCS):
        print(written)
