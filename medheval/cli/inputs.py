"""``medheval inputs``: exactly what the model receives for a few items, to diff against your own script.

For each selected record (``run``'s selection flags: ``--benchmark``, ``--model``, ``--data-dir``,
``--image-root``, ``--limit``, ``--protocol``, ``--chat-template``, ``--mitigation``): the rendered text
(decoded back from the processor's ``input_ids`` with its special tokens, a run of one repeated image token
shown once with its count), the number of images and each one's tensor shape after preprocessing, and the
generation settings the run would use for it (the protocol's layers, the typed generation flags on top).
An API model shows the text it sends (its server applies the chat template).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from medheval.run.options import check_sampling_flags, generation_number, positive_int, seed_argument

DEFAULT_LIMIT = 3


def add_inputs_command(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("inputs", help="print what the model receives for a few items (rendered text with "
                                                "special tokens, images after preprocessing, generation settings)")
    parser.add_argument("--benchmark", action="append", required=True, metavar="NAME[:CONFIG]",
                        help="benchmark split(s), as for `run` (repeatable, or comma list)")
    parser.add_argument("--model", required=True, help="as for `run`: a Hub id, a local folder, tiny-random-llava, "
                                                       "or openai:<model>@<base_url> …")
    parser.add_argument("--data-dir", help="local copy of the annotation files (as for `run`)")
    parser.add_argument("--image-root", action="append", default=[], metavar="SOURCE=ROOT",
                        help="image root per source, as for `run` (repeatable; without it the text alone is shown)")
    parser.add_argument("--on-missing", choices=("error", "skip"), default="error",
                        help="missing or undecodable images: stop (default) or skip them, as for `run`")
    parser.add_argument("--limit", type=positive_int, default=DEFAULT_LIMIT, help=f"items per split (default {DEFAULT_LIMIT})")
    parser.add_argument("--protocol", default="clean", metavar="NAME", help="paper protocol (as for `run`)")
    parser.add_argument("--chat-template", metavar="NAME", help="model, vicuna_v1, llava_v1, mistral_instruct")
    parser.add_argument("--mitigation", default="none", metavar="NAME[:KEY=VALUE,...]",
                        help="whose generation settings to show (a protocol's differ per mitigation; default none)")
    parser.add_argument("--max-new-tokens", type=positive_int, metavar="N",
                        help="one length for every record (default: per answer type, as for `run`)")
    parser.add_argument("--do-sample", action="store_true", help="sample instead of greedy decoding, as for `run`")
    parser.add_argument("--temperature", type=generation_number("temperature"),
                        help="needs --do-sample (or a protocol that samples), as for `run`")
    parser.add_argument("--top-p", type=generation_number("top_p"), help="needs --do-sample (or a protocol that samples), as for `run`")
    parser.add_argument("--seed", type=seed_argument, default=0, help="the seed `run` would use (default 0)")
    parser.add_argument("--device", help="cpu, cuda … (default: cuda when available)")
    parser.add_argument("--dtype", help="float32, bfloat16, float16 (default: float32 on CPU, bfloat16 on GPU)")
    parser.add_argument("--json", action="store_true", help="one JSON object per item instead of text")
    parser.set_defaults(handler=cmd_inputs)


def decode_collapsed(tokenizer: Any, ids: list[int], image_token: str) -> str:
    """``input_ids`` as text with the special tokens kept, each run of the image token written once with its
    count (``<image>×576``: the processor's expansion)."""
    image_id = tokenizer.convert_tokens_to_ids(image_token) if image_token else None
    pieces, start = [], 0
    while start < len(ids):
        end = start
        if ids[start] == image_id:
            while end < len(ids) and ids[end] == image_id:
                end += 1
            pieces.append(f"{image_token}×{end - start}" if end - start > 1 else image_token)
        else:
            while end < len(ids) and ids[end] != image_id:
                end += 1
            pieces.append(tokenizer.decode(ids[start:end], skip_special_tokens=False))
        start = end
    return "".join(pieces)


def _tensor_shapes(encoded: Any) -> dict[str, list]:
    return {key: list(value.shape) for key, value in encoded.items()
            if key not in ("input_ids", "attention_mask") and hasattr(value, "shape")}


def describe_item(backend: Any, record: dict, images: list, settings: dict[str, Any]) -> dict[str, Any]:
    """What one record's model input is: text, tokens, images, settings."""
    text = backend.format_prompt(record, len(images))
    item: dict[str, Any] = {"id": record["id"], "prompt": text, "n_images": len(images),
                            "image_sizes_loaded": [list(image.size) for image in images if hasattr(image, "size")],
                            "generation": settings}
    processor = getattr(backend, "processor", None)
    if processor is None:  # an API model: the server applies the chat template around this text
        item["note"] = "sent as the user message after the images; the server applies the model's chat template"
        return item
    kwargs: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
    if images:
        kwargs["images"] = [list(images)]
    bos = backend.tokenizer.bos_token
    if backend._tokenizer_adds_bos and bos and text.startswith(bos):
        kwargs["add_special_tokens"] = False
    encoded = processor(**kwargs)
    if getattr(backend, "upstream_tokens", False):  # a paper protocol's LLaVA chunked tokenization, as run sends it
        encoded = backend.upstream_inputs(encoded, [text])
        item["tokenization"] = "upstream_chunked"
    ids = encoded["input_ids"][0].tolist()
    item["n_tokens"] = len(ids)
    item["rendered"] = decode_collapsed(backend.tokenizer, ids, backend._image_token)
    item["preprocessed"] = _tensor_shapes(encoded)
    return item


def cmd_inputs(args: argparse.Namespace) -> int:
    from medheval.data.benchmarks import attach_images, parse_benchmark_spec, prepare_benchmark
    from medheval.data.images import parse_image_root_args
    from medheval.mitigations import get_mitigation
    from medheval.run.generation import GenerationPlan, effective_settings
    from medheval.run.grids import CLI_GENERATION, given_options
    from medheval.run.options import build_backend, split_list
    from medheval.run.paper_protocols import configure_backend, get_protocol
    from medheval.run.runner import _method_name

    check_sampling_flags(args)  # what `run` refuses is not shown as if it ran
    protocol = get_protocol(args.protocol)
    benchmarks = split_list(args.benchmark) or []
    protocol.check_benchmarks(benchmarks)
    mitigation = protocol.mitigation_spec(args.mitigation)
    get_mitigation(mitigation)  # a clear error for an unknown name or option
    namespace = argparse.Namespace(**vars(args), predictions=None, batch_size=1, prefix_cache=False, api_option=[],
                                   api_concurrency=1, allow_remote_credentialed=[])
    backend, _ = build_backend(namespace)
    backend = configure_backend(backend, protocol, args.chat_template)
    given = given_options(list(getattr(args, "argv", None) or [])[1:])
    fixed = {dest: getattr(args, dest) for dest in CLI_GENERATION if dest in given}
    plan = protocol.plan(_method_name(mitigation), GenerationPlan(fixed=fixed), getattr(backend, "accepted_overrides", None))
    roots = parse_image_root_args(args.image_root)
    items = []
    for spec in benchmarks:
        name, config = parse_benchmark_spec(spec)
        if name == "clinhallu":
            raise ValueError("clinhallu sends four trace requests per item (system + user turns with given stages), "
                             "not one prompt: `medheval run` logs each in clinhallu_generations.jsonl")
        options = {**protocol.benchmark_options.get(name, {})}
        loaded = prepare_benchmark(name, config, data_dir=args.data_dir, limit=args.limit, run_options=options)
        if roots:
            attach_images(loaded, roots, args.on_missing)
        for record in loaded.dataset.to_list():
            images = list(loaded.resolver.load_record_images(record)) if loaded.resolver is not None else []
            overrides = plan.for_record(loaded.name, loaded.config, record["answer_type"]) if plan else {}
            settings = effective_settings(backend.settings(), overrides)
            items.append({"split": f"{loaded.name}:{loaded.config}", "mitigation": mitigation,
                          "source": record["source"], "n_images_referenced": len(record["images"] or []),
                          **describe_item(backend, record, images, settings)})
    header = {"model": backend.name, "protocol": protocol.describe(),
              "conversation_template": getattr(backend, "conversation", None) or "model"}
    if args.json:
        for item in items:
            print(json.dumps({**header, **item}, ensure_ascii=False, default=str))
        return 0
    print(f"model {header['model']} · protocol {protocol.name} · template {header['conversation_template']}")
    for item in items:
        print(f"\n=== {item['split']} {item['id']} (mitigation {item['mitigation']})")
        print(f"images: {item['n_images']} loaded {item['image_sizes_loaded']}"
              + (f" -> {item['preprocessed']}" if item.get("preprocessed") else "")
              + (f" (the record names {item['n_images_referenced']}: pass --image-root {item['source']}=FOLDER to "
                 f"see the input `medheval run` gives the model)"
                 if item["n_images_referenced"] > item["n_images"] else ""))
        print(f"generation: {json.dumps(item['generation'], sort_keys=True)}")
        if "rendered" in item:
            print("--- text ---")
            print(item["prompt"])
            print(f"--- {item['n_tokens']} tokens, decoded (special tokens kept) ---")
            print(item["rendered"])
        else:
            print(f"--- text ({item['note']}) ---")
            print(item["prompt"])
    if not items:
        print("no item selected", file=sys.stderr)
        return 1
    return 0


__all__ = ["add_inputs_command", "cmd_inputs", "decode_collapsed", "describe_item"]
