"""Paper protocols: what the model receives and how it decodes, per source of published numbers.

Not to be confused with :mod:`medheval.run.protocol` (how one *split* is run and scored). A paper protocol
fixes, for a whole run, everything upstream of the scorer: the instruction text per answer type, the
conversation template, the generation settings (sampling, temperature, top-p, top-k, beams, length, seeds)
per mitigation, each mitigation's hyperparameters and a benchmark family's own run options.

``clean`` (the default) is this project's protocol: :mod:`medheval.run.prompts`, the model's own chat
template, greedy decoding with the lengths of :mod:`medheval.run.generation`. Every other protocol follows
the code that produced a paper's numbers; where that code and the paper disagree the code wins and the
paper's value is one option away (:attr:`PaperProtocol.conflicts`, listed in the protocol's card
``docs/protocols/<name>.md``). A paper that released no inference code gets a protocol whose settings
are inferred, each inference named in :attr:`PaperProtocol.inferred`.

A run records ``{"name": …}`` (and the protocol's source) under ``"protocol"`` in ``run.json`` and
``results.json``; a folder made under another protocol is refused on resume. Older folders without
the key were made under ``clean``.
"""

from __future__ import annotations

import copy
from typing import Any

from medheval.run.paper_protocols.base import CLEAN, Conflict, Instruction, PaperProtocol


def _registry() -> dict[str, PaperProtocol]:
    from medheval.run.paper_protocols import medheval as medheval_protocols
    from medheval.run.paper_protocols import others

    protocols = [PaperProtocol(name=CLEAN, title="this project's prompts, the model's own chat template, greedy "
                                                 "decoding, lengths per answer type (the default)",
                               reproduces="no paper", source="medheval/run/prompts.py, medheval/run/generation.py"),
                 *medheval_protocols.PROTOCOLS, *others.PROTOCOLS]
    return {protocol.name: protocol for protocol in protocols}


PROTOCOL_NAMES = (CLEAN, "medheval-baseline", "medheval-mitigation", "med-hallmark", "clinhallu", "med-stepbench")


def get_protocol(name: str | None) -> PaperProtocol:
    """The protocol called ``name`` (``None`` = ``clean``); a ``ValueError`` lists the known ones."""
    protocols = _registry()
    name = name or CLEAN
    if name not in protocols:
        raise ValueError(f"unknown --protocol {name!r}; known: {', '.join(protocols)}")
    return protocols[name]


def list_protocols() -> list[PaperProtocol]:
    return list(_registry().values())


def template_for_model(protocol: PaperProtocol, chat_template: str | None, model_type: str | None) -> str | None:
    """The conversation template a model of ``model_type`` renders under ``protocol``; ``chat_template``
    (``--chat-template``) beats the protocol's (``None``: the backend's own choice)."""
    return chat_template if chat_template is not None else protocol.template_for(model_type)


def configure_backend(backend: Any, protocol: PaperProtocol, chat_template: str | None = None) -> Any:
    """A copy of ``backend`` that renders records under ``protocol`` (its instruction and its conversation
    template for the backend's model type, its ``grey_padding``, and LLaVA's chunked prompt tokenization for
    the model types in its ``upstream_tokens``); ``chat_template`` (``--chat-template``)
    beats the protocol's. A backend without those attributes (a predictions file) is returned as it is."""
    from medheval.backends.conversation import check_template_name

    check_template_name(chat_template)
    if not hasattr(backend, "instruction"):
        if chat_template is not None and chat_template != "model":
            from medheval.run.protocol import RunError

            raise RunError(f"--chat-template {chat_template}: model {getattr(backend, 'name', backend)} renders no "
                           f"template here (an API server applies its own; a predictions file was made elsewhere)")
        return backend
    model_type = getattr(getattr(getattr(backend, "model", None), "config", None), "model_type", None)
    instruction = protocol.instruction_for(model_type)
    template = template_for_model(protocol, chat_template, model_type)
    grey = protocol.grey_padding and hasattr(backend, "grey_padding")
    chunked = model_type in protocol.upstream_tokens and hasattr(backend, "upstream_tokens")
    if instruction is None and template is None and not grey and not chunked:
        return backend
    variant = copy.copy(backend)
    if grey:
        variant.grey_padding = True
    if chunked:
        variant.upstream_tokens = True
    if instruction is not None:
        variant.instruction = instruction
    if template is not None and hasattr(variant, "conversation"):
        variant.conversation = None if template == "model" else template
    return variant


__all__ = ["CLEAN", "Conflict", "Instruction", "PROTOCOL_NAMES", "PaperProtocol", "configure_backend",
           "get_protocol", "list_protocols", "template_for_model"]
