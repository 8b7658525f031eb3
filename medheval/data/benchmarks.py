"""Load a benchmark split as a ``datasets.Dataset`` in the canonical schema.

``datasets`` >= 4 cannot load dataset scripts, so the builder in ``datasets/<name>/<name>.py``
is imported by path (:mod:`medheval.data.registry`) and instantiated directly. The Arrow cache
is keyed by the builder code and the sha256 of the annotation files actually read, so
editing a local ``data_dir`` copy never serves stale records.
"""

from __future__ import annotations

import hashlib
import inspect
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import datasets

from medheval.scoring import parsing
from medheval.data import builders, schema
from medheval.data.builders import quality_summary
from medheval.data.credentialed import image_feature
from medheval.data.fetch import FIXTURE_MARKER, default_cache_dir
from medheval.data.registry import list_units, load_unit_module

ON_MISSING = ("error", "skip")


@dataclass
class LoadedBenchmark:
    """A loaded split plus what the results must record about it."""

    dataset: datasets.Dataset
    name: str
    config: str
    files: list[dict[str, Any]] = field(default_factory=list)  # relpath, sha256, verified, origin
    skipped_missing_images: list[tuple[str, str]] = field(default_factory=list)  # (record id, image ref)
    skipped_undecodable_images: list[tuple[str, str]] = field(default_factory=list)  # (record id, image ref)
    quality: dict[str, Any] = field(default_factory=dict)
    resolver: Any = None  # medheval.data.images.ImageResolver when image roots were given
    all_ids: list[str] = field(default_factory=list)  # every record id of the split, before --limit
    run_options: dict[str, Any] = field(default_factory=dict)  # benchmark-specific run options, as applied
    volume_reader: Any = None  # record -> {name: 3D array}, for benchmarks with volumes (Med-StepBench)


class BenchmarkDataError(ValueError):
    """An annotation file cannot be turned into records; the message is the builder's own."""


def list_benchmarks() -> list[str]:
    """Names of the benchmark units in ``datasets/``."""
    return list_units("datasets")


def parse_benchmark_spec(spec: str) -> tuple[str, str | None]:
    """``"knowledge:open"`` -> ``("knowledge", "open")``; ``"mm_vishal"`` -> ``("mm_vishal", None)``."""
    name, _, config = spec.partition(":")
    return name.strip(), (config.strip() or None)


def builder_class(name: str) -> type[datasets.DatasetBuilder]:
    """The ``GeneratorBasedBuilder`` (or ``ArrowBasedBuilder``) subclass defined in ``datasets/<name>/<name>.py``."""
    module = load_unit_module("datasets", name)
    found = [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, (datasets.GeneratorBasedBuilder, datasets.ArrowBasedBuilder))
        and obj.__module__ == module.__name__
    ]
    if len(found) != 1:
        raise TypeError(f"datasets/{name}/{name}.py must define exactly one GeneratorBasedBuilder, found {len(found)}")
    return found[0]


def benchmark_configs(name: str) -> list[str]:
    """Config names of one benchmark."""
    return [config.name for config in builder_class(name).BUILDER_CONFIGS]


def split_id_prefixes(loaded: LoadedBenchmark) -> tuple[str, ...]:
    """The id prefixes ``benchmark/config/`` that answers to ``loaded``'s records carry (ids are
    ``benchmark/config/upstream-id``, :func:`medheval.data.schema.make_id`). A config that gathers others
    (``mm_vishal:all``) gives its records their member config (``mm_vishal/slake/0``): its prefixes are every
    config of the benchmark, so an answered id of a member whose record is gone still counts as the split's."""
    own = f"{loaded.name}/{loaded.config}/"
    ids = loaded.all_ids or loaded.dataset["id"]
    if all(rid.startswith(own) for rid in ids):
        return (own,)
    members = {"/".join(rid.split("/", 2)[:2]) + "/" for rid in ids}
    return tuple(sorted(members | {f"{loaded.name}/{config}/" for config in benchmark_configs(loaded.name)}))


def _resolve_config(name: str, config: str | None) -> str:
    cls = builder_class(name)
    names = [c.name for c in cls.BUILDER_CONFIGS]
    chosen = config or cls.DEFAULT_CONFIG_NAME or names[0]
    if chosen not in names:
        raise ValueError(f"benchmark {name!r} has no config {chosen!r}; choose one of {names}")
    return chosen


def _code_fingerprint(name: str) -> hashlib._Hash:
    """Cache key part: the builder's code and every ``medheval.*`` module it uses: imported as a module
    (e.g. ``medheval.families.stepbench.source``), or the module of a class or function it imports (its
    family's base builder and record readers)."""
    digest = hashlib.sha256()
    unit = load_unit_module("datasets", name)
    used = [value if inspect.ismodule(value) else inspect.getmodule(value) for value in vars(unit).values()
            if inspect.ismodule(value) or inspect.isclass(value) or inspect.isfunction(value)]
    used += [inspect.getmodule(base) for base in builder_class(name).__mro__]
    own = [module for module in used if module is not None and module.__name__.startswith("medheval.")]
    for module in dict.fromkeys((unit, builders, parsing, schema, *own)):
        digest.update(Path(module.__file__).read_bytes())
    return digest


def prepare_benchmark(
    name: str,
    config: str | None = None,
    data_dir: str | Path | None = None,
    image_roots: Mapping[str, Any] | None = None,
    on_missing: str = "error",
    cache_dir: str | Path | None = None,
    limit: int | None = None,
    run_options: Mapping[str, Any] | None = None,
) -> LoadedBenchmark:
    """Build (or reuse from cache) one split (its first ``limit`` records when given); check image
    references when ``image_roots`` is given.

    Builders over a user's local folder (no pinned upstream files, e.g. Med-StepBench) define
    ``input_files()``; builders may define ``quality_summary(dataset)`` and
    ``apply_run_options(dataset, run_options) -> (dataset, recorded)``: with ``run_options`` given
    (``{}`` = the defaults; the runner always gives them), e.g. prompt settings, applied before the
    image check and recorded in ``LoadedBenchmark.run_options``."""
    if on_missing not in ON_MISSING:
        raise ValueError(f"on_missing must be one of {ON_MISSING}, got {on_missing!r}")
    config = _resolve_config(name, config)
    cls = builder_class(name)
    data_dir = str(Path(data_dir).expanduser().resolve()) if data_dir is not None else None
    cache_root = Path(cache_dir) if cache_dir is not None else default_cache_dir().parent / "datasets"

    probe = cls(config_name=config, data_dir=data_dir, cache_dir=str(cache_root))
    if run_options and not hasattr(probe, "apply_run_options"):
        raise ValueError(f"benchmark {name!r} takes no run options (got {sorted(run_options)})")
    pinned = getattr(cls, "PINNED", {})
    if hasattr(probe, "input_files"):  # a builder reading its own sources (Med-StepBench, ClinHallu)
        files = probe.input_files()
        fetched = []
    else:
        fetched = [(key, probe.fetch_file(key)) for key, _ in probe.config_files()]
        fixture = data_dir is not None and (Path(data_dir) / FIXTURE_MARKER).is_file()
        files = [
            {"relpath": pinned[key].relpath, "sha256": item.sha256, "verified": item.verified,
             "origin": item.origin, "expected_sha256": pinned[key].sha256,
             **({"fixture": True} if fixture and item.origin == "data_dir" else {})}
            for key, item in fetched
        ]
    fingerprint = _code_fingerprint(name)
    for item in files:
        fingerprint.update(str(item.get("sha256") or item.get("fingerprint")).encode())
    builder = cls(
        config_name=config, data_dir=data_dir, cache_dir=str(cache_root), hash=fingerprint.hexdigest()[:16]
    )
    try:
        builder.download_and_prepare()
    except datasets.exceptions.DatasetGenerationError as error:
        raise BenchmarkDataError(f"benchmark {name}:{config}: {_root_cause(error)}") from None
    dataset = builder.as_dataset(split="test")
    check_references(dataset, f"{name}:{config}")
    if hasattr(builder, "quality_summary"):
        quality = builder.quality_summary(dataset)
    else:
        quality = quality_summary(dataset.select_columns(["id", "config", "meta"]))
    all_ids = dataset["id"]
    if limit is not None:
        dataset = dataset.select(range(min(limit, len(dataset))))
    recorded: dict[str, Any] = {}
    if run_options is not None and hasattr(builder, "apply_run_options"):
        dataset, recorded = builder.apply_run_options(dataset, run_options)
    loaded = LoadedBenchmark(dataset=dataset, name=name, config=config, files=files, quality=quality,
                             run_options=recorded, all_ids=all_ids,
                             volume_reader=getattr(builder, "record_volumes", None))
    if image_roots:
        attach_images(loaded, image_roots, on_missing)
    return loaded




def check_references(dataset: datasets.Dataset, split: str) -> None:
    """Refuse (:class:`BenchmarkDataError`, naming records, sources and references) a split whose records name
    images their source cannot hold (:func:`medheval.data.images.reference_problem`): a SLAKE record naming a
    MIMIC-CXR file would be loaded through a default root and sent or embedded as if it were not credentialed.
    Arrow picks the references to check (a known source's, or MIMIC-shaped ones), so a large split costs little."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from medheval.data.images import DICOM_ID_PATTERN, REFERENCE_PATTERNS, looks_credentialed, reference_problem
    from medheval.data.schema import record_credentialed

    if not len(dataset) or "images" not in dataset.column_names:
        return
    table = dataset.data.table
    images = table.column("images").combine_chunks()
    refs, rows = pc.list_flatten(images), pc.list_parent_indices(images)
    sources = table.column("source").take(rows)
    mimic_shaped = rf"(^|/){DICOM_ID_PATTERN}\.jpg$"  # looks_credentialed, in Arrow's regex syntax
    chosen = pc.indices_nonzero(pc.or_(
        pc.fill_null(pc.is_in(sources, value_set=pa.array(sorted(REFERENCE_PATTERNS))), False),
        pc.fill_null(pc.match_substring_regex(refs, mimic_shaped), False)))
    credentialed_rows: dict[int, bool] = {}  # a record's meta decoded once, whatever its number of images
    bad = []
    for ref, source, row in zip(*(column.take(chosen).to_pylist() for column in (refs, sources, rows))):
        source, credentialed = str(source or ""), True
        if looks_credentialed(ref):  # only then the record's meta.credentialed matters
            if row not in credentialed_rows:
                meta = table.column("meta")[row].as_py() if "meta" in table.column_names else None
                meta = json.loads(meta) if isinstance(meta, str) else meta  # a Json() column holds JSON text
                credentialed_rows[row] = record_credentialed({"source": source, "meta": meta})
            credentialed = credentialed_rows[row]
        problem = reference_problem(source, ref, credentialed)
        if problem:
            bad.append(f"{table.column('id')[row].as_py()} (source {source!r}): image {ref!r} {problem}")
    if bad:
        shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
        raise BenchmarkDataError(f"benchmark {split}: {len(bad)} image reference(s) refused: {shown}. Fix the "
                                 "records in the annotation file (source, meta.credentialed or image path)")


def _root_cause(error: BaseException) -> BaseException:
    """The builder's exception that ``datasets`` wrapped (``DatasetGenerationError`` hides its message)."""
    while type(error).__module__.startswith("datasets") and (error.__cause__ or error.__context__):
        error = error.__cause__ or error.__context__
    return error


def attach_images(loaded: LoadedBenchmark, image_roots: Mapping[str, Any], on_missing: str = "error") -> None:
    """Check that every image reference resolves and that local files open (their header); refuse (``error``) or
    drop and count (``skip``) the records with missing or undecodable images. Nothing is decoded here:
    ``loaded.resolver`` opens images on demand (the runner), :func:`with_image_column` adds them to the rows
    (``load_benchmark``)."""
    from medheval.data.images import ImageResolver

    resolver = ImageResolver(image_roots)
    records = loaded.dataset.select_columns(["id", "images", "source"]).to_list()
    kept, skipped, undecodable = resolver.check_records(records, on_missing=on_missing)
    if records and not kept:
        from medheval.data.images import ImageError

        roots = "; ".join(f"{source} -> {root}" for source, root in resolver.describe().items()) or "none"
        raise ImageError(
            f"{loaded.name}:{loaded.config}: all {len(records)} record(s) have a missing"
            f"{' or undecodable' if undecodable else ''} image "
            f"(first: {', '.join(f'{rid}: {ref}' for rid, ref, *_ in [*skipped, *undecodable][:3])}), so skipping "
            f"them would leave nothing "
            f"to evaluate. Check that --image-root SOURCE=PATH points at the folder the references are "
            f"relative to (image roots in use: {roots})."
        )
    if skipped or undecodable:
        kept_ids = {record["id"] for record in kept}
        loaded.dataset = loaded.dataset.select(
            [index for index, record in enumerate(records) if record["id"] in kept_ids])
    loaded.skipped_missing_images = list(skipped)
    loaded.skipped_undecodable_images = [(rid, ref) for rid, ref, _ in undecodable]
    loaded.resolver = resolver


def with_image_column(loaded: LoadedBenchmark) -> datasets.Dataset:
    """The split with an ``image`` column (a list of PIL images per row), decoded lazily.

    Local roots give a native ``List(Image())`` column (``CredentialedImage`` for MIMIC: pushing or
    saving it with the images embedded is refused, :mod:`medheval.data.credentialed`) of absolute paths, decoded by ``datasets``
    on row access (``ds["id"]`` stays cheap). Remote roots (URL template, ``hf://``) need our
    fetcher, so the column comes from a format transform: with those, read metadata columns
    through ``ds.select_columns([...])`` to avoid fetching every image.
    """
    from medheval.data.images import LocalFolderSource

    resolver = loaded.resolver
    if resolver is None:
        return loaded.dataset
    dataset = loaded.dataset
    sources = set(dataset.unique("source"))
    if all(isinstance(resolver.source_for(source), LocalFolderSource) for source in sources):
        paths = [
            [str(resolver.source_for(source).path_for(ref)) for ref in refs]
            for refs, source in zip(dataset["images"], dataset["source"])
        ]
        # credentialed sources get an image type that refuses push_to_hub/save_to_disk embedding
        credentialed = any(schema.is_credentialed(source) for source in sources)
        return dataset.add_column("image", paths).cast_column("image", datasets.List(image_feature(credentialed)))

    def decode(batch: dict[str, list]) -> dict[str, list]:
        batch["image"] = [
            resolver.load_record_images({"id": rid, "images": refs, "source": source})
            for rid, refs, source in zip(batch["id"], batch["images"], batch["source"])
        ]
        return batch

    return dataset.with_transform(decode)


def load_benchmark(
    name: str,
    config: str | None = None,
    data_dir: str | Path | None = None,
    image_roots: Mapping[str, Any] | None = None,
    on_missing: str = "error",
    cache_dir: str | Path | None = None,
) -> datasets.Dataset:
    """One MedHEval-HF benchmark split as a ``datasets.Dataset`` (canonical schema, DESIGN.md).

    >>> ds = load_benchmark("cxr_vishal", config="mimic_cxr",
    ...                     image_roots={"mimic_cxr": "/data/mimic-cxr-jpg/2.1.0/files"})  # doctest: +SKIP

    ``name`` may carry the config (``"knowledge:open"``). ``data_dir`` is a local copy of the
    upstream ``benchmark_data/`` folder; without it the pinned upstream files are downloaded
    once and verified. With ``image_roots`` ({source: local folder | URL template | hf://...})
    the rows gain a lazily decoded ``image`` column; missing images raise (listing the ids) or,
    with ``on_missing="skip"``, are dropped (use :func:`prepare_benchmark` to get the count).
    """
    spec_name, spec_config = parse_benchmark_spec(name)
    if spec_config and config and spec_config != config:
        raise ValueError(f"config given twice: {name!r} and config={config!r}")
    loaded = prepare_benchmark(
        spec_name, config or spec_config, data_dir=data_dir, image_roots=image_roots,
        on_missing=on_missing, cache_dir=cache_dir,
    )
    return with_image_column(loaded)
