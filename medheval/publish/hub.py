"""Publish the project's units to the Hugging Face Hub: one folder per Hub repo, then upload.

    medheval publish --to hub_out                       # write the folders (nothing leaves the machine)
    medheval publish --to hub_out --push --org medheval # and upload them (create_repo + upload_folder)

What each unit becomes:

- ``datasets/<name>`` → a dataset repo: ``<config>/test-00000-of-00001.parquet`` per config (the layout
  ``Dataset.push_to_hub(config_name=...)`` writes) and a README whose YAML the Hub and ``datasets`` read
  (``configs``, ``dataset_info``, licence, task/size/source fields). Image references stay strings.
  An ``eval.yaml`` (:mod:`medheval.publish.eval_yaml`) registers the repo as a Hub benchmark whose tasks
  are the inspect-ai tasks of its configs.
  A repo holding MIMIC-derived configs is gated (``extra_gated_prompt``/``extra_gated_fields`` in the
  card, ``gated="manual"`` in the repo settings) and never holds image bytes. A gated repo receives only
  what the exporter wrote and recorded in ``publish.json`` (:func:`check_recorded_files`: each file's name
  and sha256, Parquet with the exporter's text-only schema, the card and ``eval.yaml``); anything else in
  its folder stops the push, naming the file. :func:`check_no_credentialed_bytes` also reads every file's
  content on every push of every repo, gated or not: no repo medheval publishes holds image, DICOM, array,
  archive or other binary files, or files named like MIMIC-CXR's (``p<XX>/p<subject>/s<study>/<dicom_id>.jpg``),
  and listing a file's sha256 in ``publish.json`` never lets one through.
- ``metrics/<name>`` → an evaluate Space (module, card with the Space YAML, ``requirements.txt`` naming
  the ``medheval`` package). ``evaluate.load("<org>/<name>")`` only reads the repo's files, so the Space
  is ``sdk: static`` with a one-page ``index.html``: it needs no build.
- ``mitigations/<name>`` → a ``custom_generate`` model repo as transformers loads it
  (``custom_generate/generate.py``, ``custom_generate/requirements.txt``, README with ``base_model``/tags).
- a run's ``results.json`` → ``.eval_results/*.yaml`` for the evaluated model's repo, the Hub's
  current format for model evaluation results (docs: hub/eval-results; the older ``model-index``
  card block is the legacy path), and beside them ``.eval_results_provenance/*.json``: the model and dataset
  revisions and each value's unit (the format has no keys for them; the notes name the unit and model revision).

:func:`install_metrics` registers the metric modules where ``evaluate.load("<bare name>")`` and
``evaluate.load("medheval/<name>")`` look when the Hub has no such module or cannot be reached (its local
module cache).
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from medheval.data.credentialed import CredentialedImageError, refuse_credentialed_images
from medheval.data.images import DICOM_ID_PATTERN
from medheval.publish.content_scan import json_parts, netpbm_header, parts_kind, text_kind
from medheval.publish.meta_check import MetaError, publishable_meta
from medheval.publish.results_check import ResultsError, check_results, check_size, publishable_made_with
from medheval.data.registry import list_units, unit_dir
from medheval.data.schema import FEATURES, is_credentialed
from medheval.run import provenance
from medheval.run.control import control_of, control_slug
from medheval.backends.revision import revision_note
from medheval.scoring.headline import UNITS, headline_numbers, headline_unit, unit_label
from medheval.run.outputs import OutputLock, atomic_write_text, remove_stale_staging, replace_folder, staging_folder

DEFAULT_ORG = "medheval"
MANIFEST = "publish.json"
REPO_TYPES = {"datasets": "dataset", "metrics": "space", "mitigations": "model"}
DEFAULT_BASE_MODEL = "llava-hf/llava-1.5-7b-hf"
MITIGATION_SECTIONS = ("base model", "compatible models", "additional arguments", "output changes")
PHYSIONET_LICENSE = ("physionet-credentialed-health-data-1.5.0",
                     "https://physionet.org/content/mimic-cxr-jpg/view-license/2.1.0/")
UNSTATED_LICENSE = ("medheval-upstream-unstated", "https://github.com/Aofei-Chang/MedHEval")
SOURCE_DATASETS = {"slake": "extended|slake", "vqa_rad": "extended|vqa_rad", "iu_xray": "extended|iu_xray",
                   "mimic_cxr": "extended|mimic-cxr-jpg", "mimic_iv": "extended|mimic-iv"}
GATED_PROMPT = (
    "The questions and answers in this repository are derived from MIMIC-CXR, which PhysioNet distributes under "
    "its Credentialed Health Data License. Request access only if you are a credentialed PhysioNet user who has "
    "signed the MIMIC-CXR-JPG data use agreement. The images are not here: load them from your own copy."
)
GATED_FIELDS = {
    "PhysioNet username": "text",
    "I am a credentialed PhysioNet user and have signed the MIMIC-CXR-JPG data use agreement": "checkbox",
    "I will not try to re-identify anyone and will not share the data with people without access": "checkbox",
}


SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")  # a split key part that can name a file
# every file export_dataset writes: the card, eval.yaml, one Parquet file per config (nothing else, in a gated repo)
GATED_LAYOUT = re.compile(r"README\.md|eval\.yaml|[A-Za-z0-9][A-Za-z0-9._-]{0,95}/test-00000-of-00001\.parquet")
PARQUET_FOOTER_KEYS = {b"ARROW:schema", b"huggingface", b"content_defined_chunking"}  # what to_parquet writes
REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
# MIMIC-CXR-JPG's layout (files/p<XX>/p<subject>/s<study>/<dicom_id>.jpg) and its dicom ids, as
# medheval.data.images reads them; a file named so is a MIMIC-CXR file, whatever its content
MIMIC_PATH = re.compile(r"(?:^|/)p\d{2}/p\d{6,10}/s\d{6,10}(?:/|$)", re.IGNORECASE)
DICOM_ID = re.compile(DICOM_ID_PATTERN, re.IGNORECASE)


credentialed_source = is_credentialed  # a source value in any spelling (medheval.data.schema)


def mimic_file_name(relpath: str) -> bool:
    """Whether ``relpath`` is named like a MIMIC-CXR file: under ``p<XX>/p<subject>/s<study>/``, or a
    file whose name (before its first dot) is a dicom id (``<8 hex>-<8 hex>-<8 hex>-<8 hex>-<8 hex>``)."""
    return bool(MIMIC_PATH.search(relpath)) or any(DICOM_ID.fullmatch(part.split(".")[0])
                                                     for part in relpath.split("/"))


class PublishError(ValueError):
    """Something to publish is missing or would break a rule (credentialed bytes, random-weight results)."""


def check_org(org: str) -> str:
    """``org`` when it is a Hub user or organisation name (as ``--model-repo``'s first part: letters, digits,
    ``.``, ``_``, ``-``, at most 96 characters, no ``..``); :class:`PublishError` otherwise, so no markup
    reaches a card and no invalid repo id reaches ``publish.json``."""
    if not isinstance(org, str) or not SAFE_NAME.fullmatch(org) or ".." in org or "--" in org \
            or org.endswith((".", "-")):
        shown = repr(org)[:100]
        raise PublishError(f"--org {shown}: expected a Hub user or organisation name (letters, digits, '.', '_', "
                           "'-'; at most 96 characters), e.g. --org medheval")
    return org


@dataclass
class RepoFolder:
    """One folder on disk that becomes one Hub repo."""

    folder: str
    repo_id: str
    repo_type: str  # "dataset" | "space" | "model"
    kind: str  # "datasets" | "metrics" | "mitigations" | "results" (results go to an existing model repo)
    gated: bool = False
    space_sdk: str | None = None
    warnings: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # what the exporter wrote: relative path -> sha256


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _folder_entries(root: Path) -> dict[str, Path]:
    """``{relative path: path}`` of every file, link and other non-folder entry under ``root`` (links to
    folders listed, never followed)."""
    found: dict[str, Path] = {}
    for current, folders, files in os.walk(root):
        for name in files + [name for name in folders if os.path.islink(os.path.join(current, name))]:
            path = Path(current) / name
            found[path.relative_to(root).as_posix()] = path
    return dict(sorted(found.items()))


def recorded(repo: RepoFolder) -> RepoFolder:
    """``repo`` with :attr:`RepoFolder.files` set to what its folder holds now (called by each exporter on
    the folder it has just written; ``publish.json`` keeps the record for :func:`check_recorded_files`)."""
    repo.files = {relpath: _sha256(path) for relpath, path in _folder_entries(Path(repo.folder)).items()
                  if path.is_file() and not path.is_symlink()}
    return repo


# --------------------------------------------------------------------------------------- cards


def split_card(text: str) -> tuple[dict[str, Any], str]:
    """``(front-matter YAML as a dict, body)`` of a README; ``({}, text)`` without front matter."""
    match = re.match(r"^---\s*\n(.*?)\n---\s*\n?", text, flags=re.DOTALL)
    if not match:
        return {}, text
    return (yaml.safe_load(match.group(1)) or {}), text[match.end():]


def render_card(metadata: Mapping[str, Any], body: str) -> str:
    """A README with ``metadata`` as YAML front matter."""
    front = yaml.safe_dump(dict(metadata), sort_keys=False, allow_unicode=True, width=100)
    return f"---\n{front}---\n{body.lstrip()}"


def size_category(n: int) -> str:
    """The Hub's ``size_categories`` bucket for ``n`` rows."""
    for limit, label in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < limit:
            return label
    return "n>1M"


# ------------------------------------------------------------------------------------- datasets


def export_dataset(name: str, out_dir: str | Path, org: str = DEFAULT_ORG, data_dir: str | Path | None = None,
                   cache_dir: str | Path | None = None) -> RepoFolder:
    """``datasets/<name>`` as a dataset repo folder: Parquet per config + card (see module docstring)."""
    org = check_org(org)
    from datasets.info import DatasetInfo, DatasetInfosDict
    from datasets.splits import SplitDict, SplitInfo
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData
    from tqdm.auto import tqdm

    from medheval.data.benchmarks import benchmark_configs, builder_class, prepare_benchmark
    from medheval.publish.eval_yaml import card_section, harness_configs, write_eval_yaml

    folder = Path(out_dir) / "datasets" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    card_meta, body = split_card((unit_dir("datasets", name) / "README.md").read_text())
    default_config = builder_class(name).DEFAULT_CONFIG_NAME
    infos: dict[str, DatasetInfo] = {}
    configs: dict[str, dict[str, Any]] = {}
    sources: set[str] = set()
    credentialed_configs: list[str] = []
    largest = 0
    unpinned: dict[str, str] = {}  # annotation file -> why it is not the released file (fixture / modified copy)
    dropped_meta: dict[str, None] = {}  # meta keys no builder writes, left out of the Parquet files
    for config in tqdm(benchmark_configs(name), desc=f"export {name}", unit="config"):
        try:
            loaded = prepare_benchmark(name, config, data_dir=data_dir, cache_dir=cache_dir)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)  # no half-written repo folder left behind
            raise
        dataset = loaded.dataset
        unpinned.update(unpinned_files(loaded.files))
        config_sources = set(dataset.unique("source"))
        credentialed = any(map(credentialed_source, config_sources)) or (
            "meta" in dataset.column_names and any(map(_meta_credentialed, dataset["meta"])))
        refuse_credentialed_images(dataset, f"{name}:{config}", credentialed=credentialed)
        try:
            dataset = _publishable_rows(dataset, f"{name}:{config}", dropped_meta)
        except MetaError as error:
            shutil.rmtree(folder, ignore_errors=True)
            raise PublishError(str(error)) from None
        sources |= config_sources
        if credentialed:
            credentialed_configs.append(config)
        relpath = f"{config}/test-00000-of-00001.parquet"
        (folder / config).mkdir()
        dataset.to_parquet(str(folder / relpath))
        rewrite_parquet(folder / relpath, folder / relpath)  # the form push() uploads: the same bytes
        num_bytes = dataset.data.nbytes
        info = DatasetInfo(config_name=config, features=dataset.features, splits=SplitDict(),
                           download_size=(folder / relpath).stat().st_size, dataset_size=num_bytes)
        info.splits.add(SplitInfo(name="test", num_bytes=num_bytes, num_examples=len(dataset)))
        info.size_in_bytes = info.download_size + info.dataset_size
        infos[config] = info
        configs[config] = {"data_files": [{"split": "test", "path": f"{config}/test-*"}]}
        if config == default_config:
            configs[config]["default"] = True
        largest = max(largest, len(dataset))
    gated = bool(credentialed_configs)
    license_name, license_link = PHYSIONET_LICENSE if gated else UNSTATED_LICENSE
    meta: dict[str, Any] = {
        "pretty_name": card_meta.get("pretty_name", name),
        "language": card_meta.get("language", ["en"]),
        "license": "other",
        "license_name": license_name,
        "license_link": license_link,
        "task_categories": card_meta.get("task_categories", ["visual-question-answering"]),
        "size_categories": [size_category(largest)],
        "source_datasets": sorted(SOURCE_DATASETS.get(source, f"extended|{source}") for source in sources),
        "tags": card_meta.get("tags", []),
    }
    if gated:
        meta["extra_gated_prompt"] = GATED_PROMPT
        meta["extra_gated_fields"] = dict(GATED_FIELDS)
    card_data = DatasetCardData(**meta)
    DatasetInfosDict(infos).to_dataset_card_data(card_data)
    MetadataConfigs(configs).to_dataset_card_data(card_data)
    usage = (f"\n\n## Load from the Hub\n\n```python\nfrom datasets import load_dataset\n"
             f"ds = load_dataset(\"{org}/{name}\", \"{default_config or next(iter(configs))}\", split=\"test\")\n```\n\n"
             "Rows hold image references (strings), never pixels: pass `image_roots=` to "
             "`medheval.load_benchmark` to read images from your own copy.")
    if gated:
        usage += (f" Configs derived from MIMIC-CXR ({', '.join(credentialed_configs)}) make this repo gated: "
                  "request access with your PhysioNet credentials.")
    eval_configs = harness_configs(name, configs)  # eval.yaml: the Hub benchmark's inspect-ai tasks
    usage += card_section(name, eval_configs)
    warnings = [f"{relpath}: {why}" for relpath, why in sorted(unpinned.items())]
    if warnings:
        usage += ("\n\n## Not the released annotation files\n\nThese files did not match the sha256 pinned for "
                  "the upstream release when this repo was written, so its rows may differ from the benchmark's:\n\n"
                  + "".join(f"- {warning}\n" for warning in warnings))
    (folder / "README.md").write_text(render_card(card_data.to_dict(), body.rstrip() + usage + "\n"))
    write_eval_yaml(folder, name, eval_configs, meta["pretty_name"])
    if dropped_meta:
        warnings.append(f"meta key(s) {', '.join(list(dropped_meta)[:8])} left out of the Parquet files (no builder "
                        "writes them: medheval.publish.meta_check)")
    return recorded(RepoFolder(str(folder), f"{org}/{name}", "dataset", "datasets", gated=gated, warnings=warnings))


def _publishable_rows(dataset: Any, where: str, dropped: dict[str, None]) -> Any:
    """``dataset`` with each row's ``meta`` reduced to the keys the builders write
    (:func:`medheval.publish.meta_check.publishable_meta`; a :class:`MetaError` for a known key of the wrong kind
    or size); the keys left out are added to ``dropped``."""
    if "meta" not in dataset.column_names:
        return dataset
    metas = []
    changed = False
    for rid, meta in zip(dataset["id"], dataset["meta"]):
        kept, gone = publishable_meta(meta, f"{where} record {rid!r}"[:200])
        dropped.update(dict.fromkeys(gone))
        changed = changed or bool(gone)
        metas.append(kept)
    if not changed:
        return dataset
    feature = dataset.features["meta"]
    return dataset.remove_columns("meta").add_column("meta", metas, feature=feature)


def unpinned_files(files: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The annotation files of a split that are not the pinned upstream release, with the reason:
    the embedded fixture, or a copy whose sha256 differs from the pin (``verified is False``)."""
    found: dict[str, str] = {}
    for entry in files:
        if entry.get("fixture"):
            found[entry["relpath"]] = "the embedded fixture (synthetic records), not the upstream release"
        elif entry.get("verified") is False:
            found[entry["relpath"]] = (f"sha256 {entry['sha256']}, not the pinned "
                                       f"{entry.get('expected_sha256', '?')} (a modified copy)")
    return found


# Leading bytes of the file kinds that can carry pixels or hide them (images, DICOM, arrays, archives).
MAGIC_BYTES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\xff\xd8\xff", "JPEG image"),
    (0, b"\x89PNG\r\n\x1a\n", "PNG image"),
    (0, b"GIF8", "GIF image"),
    (0, b"BM", "BMP image"),
    (0, b"II*\x00", "TIFF image"),
    (0, b"MM\x00*", "TIFF image"),
    (0, b"\x00\x00\x00\x0cjP  \r\n\x87\n", "JPEG 2000 image"),
    (0, b"\xff\x4f\xff\x51", "JPEG 2000 codestream"),
    (128, b"DICM", "DICOM file"),
    (0, b"\x93NUMPY", "NumPy array"),
    (0, b"PK\x03\x04", "zip archive"),
    (0, b"\x1f\x8b", "gzip archive"),
    (0, b"BZh", "bzip2 archive"),
    (0, b"\xfd7zXZ\x00", "xz archive"),
    (0, b"7z\xbc\xaf\x27\x1c", "7z archive"),
    (0, b"\x28\xb5\x2f\xfd", "zstd archive"),
    (257, b"ustar", "tar archive"),
)
# base64 this long (about 1.5 KB of bytes) is an embedded file, never an annotation; a data URL of an image too
BASE64_RUN = re.compile(rb"(?:data:image/[a-z0-9.+-]+;base64,)|[A-Za-z0-9+/]{2048,}={0,2}", re.IGNORECASE)


def file_kind(path: Path) -> str | None:
    """What ``path`` holds when it can carry an image (by content, not by name): ``"JPEG image"``,
    ``"DICOM file"``, ``"zip archive"``, ``"netpbm image"``, ``"binary file"``, and in a text file
    ``"base64 text"`` (or hex, base32, base85, ascii85), ``"text with an image data URL"``, ``"bytes as
    characters"`` or ``"list of byte values"`` in any spelling
    (:func:`medheval.publish.content_scan.text_kind`: wrapped, URL-safe, slash-escaped or split base64, bytes
    as a list of numbers); ``None`` for plain text (or Parquet, which :func:`check_no_credentialed_bytes` reads
    column by column)."""
    data = path.read_bytes()
    for offset, magic, kind in MAGIC_BYTES:
        if data[offset : offset + len(magic)] == magic:
            return kind
    if data[:4] == b"PAR1":
        return None
    if netpbm_header(data):
        return "netpbm image"
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "binary file"
    return "base64 text" if BASE64_RUN.search(data) else text_kind(data, MAGIC_BYTES)


def _shape(dtype: Any) -> Any:
    """A column type with the names pyarrow gives list items left out (``item`` vs ``element``)."""
    import pyarrow as pa

    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return ["list", _shape(dtype.value_type)]
    if isinstance(dtype, pa.ExtensionType):
        return ["extension", dtype.extension_name]
    return "string" if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) else str(dtype)


MAX_INT_LIST = 64  # integers in one list value of a Parquet column: a box or a few labels, never pixels
_LIST_TYPES = ("is_list", "is_large_list", "is_fixed_size_list", "is_list_view", "is_large_list_view")


def _storage(dtype: Any) -> Any:
    """``dtype``, or the storage type of an extension type (``arrow.json``, a canonical extension type that is
    no ``pa.ExtensionType``: a string column)."""
    import pyarrow as pa

    return dtype.storage_type if isinstance(dtype, pa.BaseExtensionType) else dtype


def _is_list(dtype: Any) -> bool:
    """Whether ``dtype`` is any kind of Arrow list (variable, large, fixed-size, list view)."""
    import pyarrow as pa

    return any(getattr(pa.types, test, lambda _: False)(dtype) for test in _LIST_TYPES)


def binary_fields(dtype: Any, name: str) -> list[str]:
    """The fields of a column type that can hold bytes: binary, and lists of 8-bit integers (``name``,
    ``name.child``, ``name[]``), looking through structs, lists and extension types."""
    import pyarrow as pa

    dtype = _storage(dtype)
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype) or pa.types.is_fixed_size_binary(dtype) \
            or getattr(pa.types, "is_binary_view", lambda _: False)(dtype):
        return [name]
    if pa.types.is_struct(dtype):
        return [hit for child in dtype for hit in binary_fields(child.type, f"{name}.{child.name}")]
    if _is_list(dtype):
        item = _storage(dtype.value_type)
        if pa.types.is_int8(item) or pa.types.is_uint8(item):
            return [f"{name}[] ({item})"]
        return binary_fields(item, f"{name}[]")
    return []


def integer_list_fields(column: Any, name: str, limit: int = MAX_INT_LIST) -> list[str]:
    """The list fields of a Parquet column (a pyarrow array or chunked array) where one row holds more than
    ``limit`` integers, nested lists counted together (an image as rows of pixels): bytes or pixels written
    as numbers."""
    import numpy as np
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return _integer_lists(array, np.arange(len(array)), name, limit, nested=False)


def _integer_lists(array: Any, rows: Any, name: str, limit: int, nested: bool) -> list[str]:
    """:func:`integer_list_fields` below one field: ``rows`` gives each value's top-level row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(array, pa.ExtensionArray):
        array = array.storage
    if pa.types.is_struct(array.type):
        return [hit for index, child in enumerate(array.type)
                for hit in _integer_lists(array.field(index), rows, f"{name}.{child.name}", limit, nested)]
    if _is_list(array.type):
        parents = np.asarray(pc.list_parent_indices(array), dtype=np.int64)
        return _integer_lists(array.flatten(), rows[parents], f"{name}[]", limit, nested=True)
    if nested and pa.types.is_integer(array.type) and len(rows):
        most = int(np.bincount(rows).max())
        if most > limit:
            return [f"{name} (up to {most} integers in one row)"]
    return []


MAX_PARQUET_NUMBERS = 512  # numeric cells in one Parquet file: the exporter writes none; a 16x32 thumbnail
_CDC_KEYS = {"min_chunk_size", "max_chunk_size", "norm_level"}  # datasets' content-defined chunking options


def _text_type(dtype: Any) -> bool:
    """Whether ``dtype`` holds text: a string (any width or view, dictionary-encoded too), bool or null."""
    import pyarrow as pa

    dtype = _storage(dtype)
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    return (pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_boolean(dtype)
            or pa.types.is_null(dtype) or getattr(pa.types, "is_string_view", lambda _: False)(dtype))


def column_problems(schema: Any, num_rows: int, limit: int = MAX_PARQUET_NUMBERS) -> list[str]:
    """The columns of a Parquet file outside the exporter's kinds, as ``name (type)``: the exporter writes text,
    lists of text and JSON text only (:data:`medheval.data.schema.FEATURES`), so any list of numbers, struct,
    map or other nested column is refused, and plain numeric (or date) columns only while the file holds at
    most ``limit`` numeric cells (a few scores; an image as one pixel per row is thousands)."""
    import pyarrow as pa

    problems: list[str] = []
    numeric: list[str] = []
    for column in schema:
        dtype = _storage(column.type)
        if _text_type(dtype) or (_is_list(dtype) and _text_type(dtype.value_type)):
            continue
        if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype) \
                or pa.types.is_temporal(dtype):
            numeric.append(column.name)
            continue
        problems.append(f"{column.name} ({_shape(column.type)})")
    if numeric and len(numeric) * num_rows > limit:
        problems.append(f"{', '.join(numeric)} ({len(numeric) * num_rows} numbers, over {limit})")
    return problems


def _cdc_options(footer: Mapping[bytes, bytes]) -> dict[str, int] | bool:
    """The content-defined chunking options ``to_parquet`` recorded in a footer (``False`` when none or odd)."""
    try:
        options = json.loads(footer.get(b"content_defined_chunking", b"false"))
    except ValueError:
        return False
    if isinstance(options, dict) and set(options) <= _CDC_KEYS and all(
            isinstance(value, int) and not isinstance(value, bool) for value in options.values()):
        return options
    return False


def rewrite_parquet(source: Path, target: Path) -> None:
    """Write ``source``'s table to ``target`` afresh (row group by row group, with its Arrow schema and metadata
    and ``to_parquet``'s chunking and page index), so only what the table holds is in the file: bytes hidden
    between column chunks, in padding or after the footer (a JPEG inside a valid Parquet file) are dropped.
    The exporter writes every Parquet file this way and :func:`push` uploads each one rewritten, which gives the
    same bytes for an exported file (the rewrite is idempotent)."""
    import pyarrow.parquet as pq

    handle = pq.ParquetFile(source)
    cdc = _cdc_options(handle.metadata.metadata or {})
    fresh = target.with_name(target.name + ".rewrite")
    try:
        with pq.ParquetWriter(fresh, handle.schema_arrow, use_content_defined_chunking=cdc,
                              write_page_index=True) as writer:
            if cdc is not False:
                writer.add_key_value_metadata({"content_defined_chunking": json.dumps(cdc)})
            for index in range(handle.num_row_groups):
                writer.write_table(handle.read_row_group(index))
        handle.close()
        os.replace(fresh, target)
    finally:
        fresh.unlink(missing_ok=True)


def _check_exported_parquet(repo_id: str, relpath: str, path: Path) -> None:
    """A gated repo's Parquet file has exactly the exporter's columns (:data:`medheval.data.schema.FEATURES`:
    text and image-reference strings, no binary or numeric column) and only the metadata ``to_parquet`` writes."""
    import pyarrow.parquet as pq

    expected = {column.name: _shape(column.type) for column in FEATURES.arrow_schema}
    try:
        schema = pq.read_schema(path)
        footer = set((pq.ParquetFile(path).metadata.metadata or {}).keys())
    except Exception as error:  # noqa: BLE001 - not Parquet at all
        raise CredentialedImageError(f"{repo_id}: {relpath} is not a readable Parquet file ({type(error).__name__}); "
                                     "a gated repo receives only the exporter's files") from None
    got = {column.name: _shape(column.type) for column in schema}
    wrong = [f"{name} ({got[name]})" for name in got if got[name] != expected.get(name)]
    missing = [name for name in expected if name not in got]
    if wrong or missing or list(got) != [name for name in expected if name in got]:
        raise CredentialedImageError(
            f"{repo_id}: {relpath} does not have the exporter's columns (unexpected: {wrong or 'none'}; missing: "
            f"{missing or 'none'}); a gated repo holds text and image-reference columns only, never binary or "
            "numeric-array columns: export it again with `medheval publish`")
    hf_meta = (schema.metadata or {}).get(b"huggingface", b"{}")
    try:
        features = json.loads(hf_meta).get("info", {}).get("features")
    except (ValueError, AttributeError):
        features = None
    extra_keys = sorted(key.decode(errors="replace") for key in
                        (set((schema.metadata or {}).keys()) - {b"huggingface"}) | (footer - PARQUET_FOOTER_KEYS))
    if extra_keys or features != FEATURES.to_dict():
        raise CredentialedImageError(
            f"{repo_id}: {relpath} carries metadata the exporter does not write "
            f"({', '.join(extra_keys) or 'huggingface features'}): export it again with `medheval publish`")
    for index, value in enumerate(pq.read_table(path, columns=["meta"]).column("meta").to_pylist()):
        try:
            meta = json.loads(value) if isinstance(value, str) else value
            if publishable_meta(meta, f"{relpath} row {index}")[1]:
                raise MetaError(f"{relpath} row {index}: meta holds keys no builder writes")
        except (MetaError, ValueError) as error:
            raise CredentialedImageError(f"{repo_id}: {error}; a gated repo holds only the exporter's rows: export "
                                         "it again with `medheval publish`") from None


def _looks_credentialed(root: Path) -> str | None:
    """Why a folder holds MIMIC-derived data whatever ``publish.json`` says (``None`` when nothing says
    so): a gated card (gating fields, a MIMIC ``source_datasets`` entry or the PhysioNet licence), a file
    named like a MIMIC-CXR file (:func:`mimic_file_name`), or a Parquet file with rows from a credentialed
    source (``source``, any spelling: :func:`credentialed_source`; ``meta.credentialed``) or MIMIC-CXR
    image references."""
    import pyarrow.parquet as pq

    card = root / "README.md"
    if card.is_file() and not card.is_symlink():
        try:
            meta, _ = split_card(card.read_text(errors="replace"))
        except yaml.YAMLError:
            meta = {}
        if isinstance(meta, dict):
            sources = " ".join(map(str, meta.get("source_datasets") or []))
            licence = f"{meta.get('license_name') or ''} {meta.get('license_link') or ''}"
            if meta.get("extra_gated_fields") or "mimic" in sources.lower() or "physionet" in licence.lower():
                return "README.md is a gated or MIMIC-derived dataset card"
    for relpath in _folder_entries(root):
        if mimic_file_name(relpath):
            return f"{relpath} is named like a MIMIC-CXR file"
    for path in root.rglob("*.parquet"):
        if path.is_symlink() or not path.is_file():
            continue
        try:
            names = pq.read_schema(path).names
            columns = [name for name in ("source", "meta", "images") if name in names]
            table = pq.read_table(path, columns=columns) if columns else None
        except Exception:  # noqa: BLE001 - unreadable: the content checks name it
            continue
        if table is None:
            continue
        where = path.relative_to(root).as_posix()
        sources = sorted(map(str, filter(credentialed_source, set(table.column("source").to_pylist())))) \
            if "source" in columns else []
        if sources:
            return f"{where} has rows from credentialed source(s) {sources}"
        if "meta" in columns and any(_meta_credentialed(value) for value in table.column("meta").to_pylist()):
            return f"{where} has rows marked credentialed (meta.credentialed)"
        if "images" in columns and any(mimic_file_name(str(ref).replace("\\", "/"))
                                       for refs in table.column("images").to_pylist()
                                       for ref in (refs if isinstance(refs, list) else [refs]) if ref):
            return f"{where} references MIMIC-CXR images"
    return None


def _meta_credentialed(value: Any) -> bool:
    """A row's ``meta.credentialed`` (``meta`` as the exporter's JSON string, or a mapping)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return False
    return isinstance(value, dict) and value.get("credentialed") is True


def check_recorded_files(repo: RepoFolder) -> bool:
    """Refuse a repo folder holding anything the exporter did not write and record; returns whether the
    repo is gated (``publish.json``'s flag, or MIMIC-derived content found in the folder).

    An allow-list, not a guess at encodings: every file must be listed in ``publish.json`` with the sha256
    it had when the exporter wrote it, and every listed file must be there (a folder a killed publish left
    half-written never passes). A gated repo must have that record, its files must fit the exported layout
    (``README.md``, ``eval.yaml``, ``<config>/test-00000-of-00001.parquet``) and each Parquet file must have
    the exporter's text-only schema. A file added, renamed or edited by hand stops the push and is named.
    (A non-gated repo listed by an older medheval, without a record, is pushed as it is once
    :func:`check_no_credentialed_bytes` has read it.) The record is an allow-list of the exporter's output,
    never a licence: listing a file with its sha256 does not let credentialed material through, since
    :func:`check_no_credentialed_bytes` reads every file of every repo, listed or not."""
    root = Path(repo.folder)
    evidence = None if repo.gated else _looks_credentialed(root)
    gated = repo.gated or evidence is not None
    if not gated and not repo.files:
        return False
    if not repo.files:
        raise CredentialedImageError(
            f"{repo.repo_id}: {root} holds MIMIC-derived data ({evidence or 'publish.json says gated'}) but "
            "publish.json records no exported files for it (written by hand or by an older medheval); a gated repo "
            "receives only what the exporter wrote: export it again with `medheval publish --to`")
    present = _folder_entries(root)
    for relpath, path in present.items():
        if relpath not in repo.files:
            raise CredentialedImageError(
                f"{repo.repo_id}: {relpath} was not written by the exporter (publish.json does not list it); a repo "
                "receives only what `medheval publish` wrote (a gated one: its card, eval.yaml and Parquet files): "
                "remove it, or export again")
        if gated and not GATED_LAYOUT.fullmatch(relpath):
            raise CredentialedImageError(
                f"{repo.repo_id}: {relpath} is not a file the exporter writes (README.md, eval.yaml, "
                "<config>/test-00000-of-00001.parquet), yet publish.json lists it: the manifest was edited; "
                "export again")
        if path.is_symlink() or not path.is_file():
            raise CredentialedImageError(f"{repo.repo_id}: {relpath} is a symbolic link or not a regular file; "
                                         "the upload would follow it: export again")
        digest = _sha256(path)
        if digest != repo.files[relpath]:
            raise CredentialedImageError(
                f"{repo.repo_id}: {relpath} changed after export (sha256 {digest[:16]}…, publish.json records "
                f"{str(repo.files[relpath])[:16]}…); a repo receives only what the exporter wrote: export again")
        if gated and relpath.endswith(".parquet"):
            _check_exported_parquet(repo.repo_id, relpath, path)
    missing = sorted(set(repo.files) - set(present))
    if missing:
        raise CredentialedImageError(f"{repo.repo_id}: {', '.join(missing)} listed in publish.json but missing from "
                                     f"{root}: export again")
    return gated


def _values_kind(values: Any) -> str | None:
    """What a Parquet column's values (or one cell) hide, read as one decoded JSON value: base64 data
    (:data:`BASE64_RUN`), else :func:`medheval.publish.content_scan.parts_kind`; ``None`` for text."""
    parts = json_parts(values)
    return "base64 data" if BASE64_RUN.search(parts[0]) else parts_kind(parts, MAGIC_BYTES)


FIRST_ROW_CHUNK = 256  # rows read together while looking for the row that holds a refused column's bytes


def _first_row(values: Sequence[Any], chunk: int = FIRST_ROW_CHUNK) -> str:
    """Where in a refused Parquet column its bytes lie: ``"in row N"``, the first row that alone
    :func:`_values_kind` refuses, ``"split over its rows, from row N"`` when the first ``chunk`` of rows refused
    alone (N its first row) holds no such row, or ``"split over its rows"`` when no chunk is refused alone. Rows
    are read ``chunk`` at a time (about one more read of the column) and one by one inside that chunk alone: a
    refusal of 10,000 rows costs about one more read of the column and at most ``chunk`` calls (0.8 ms each),
    not 10,000."""
    for first in range(0, len(values), chunk):
        rows = values[first : first + chunk]
        if len(values) > chunk and not _values_kind(rows):
            continue
        row = next((first + i for i, value in enumerate(rows) if _values_kind(value)), None)
        if row is not None:
            return f"in row {row}"
        return f"split over its rows, from row {first}" if len(values) > chunk else "split over its rows"
    return "split over its rows"


def check_no_credentialed_bytes(repo: RepoFolder) -> None:
    """Refuse a repo folder that could publish credentialed pixels; runs on every push, for every repo,
    gated or not, on every file whether ``publish.json`` lists it or not.

    No repo medheval publishes holds image bytes: a dataset's rows hold image references (strings), a
    Space or model repo holds code and cards, a results folder YAML. Since content cannot tell a MIMIC-CXR
    image from another one, and ``publish.json`` (its ``gated`` flag, its kind, its file list) may have been
    written by hand, the same content checks apply to every repo: no symbolic link (the upload would
    follow it), no file named like a MIMIC-CXR file (:func:`mimic_file_name`: ``p<XX>/p<subject>/s<study>/``,
    ``<dicom_id>.jpg``), and, by content whatever the file's name: no image, DICOM, array, archive or netpbm
    file, no other binary file, no base64 run, image data URL or long list of byte values in a text file in any
    spelling (:func:`file_kind`: base64, hex, base32, base85, bytes as Latin-1 characters or as characters of
    another Unicode block, long runs of numbers, in the text and in its decoded JSON), and Parquet files of text
    columns only (:func:`column_problems`: no binary, Image, numeric-list or nested column, at most
    :data:`MAX_PARQUET_NUMBERS` numeric cells) whose string columns, their values decoded as one list, pass
    :func:`medheval.publish.content_scan.parts_kind`, without base64 in their metadata.
    (:func:`push` also uploads each Parquet file rewritten from its table: :func:`rewrite_parquet`.) So a folder edited by hand
    after :func:`export_dataset`, or a manifest entry written by hand, is checked too."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(repo.folder)
    in_repo = " in a credentialed repo" if repo.gated else ""
    how = (f"remove it from {root}, or export again with `medheval publish --to`; medheval publishes annotations, "
           "image references (strings), code and cards only, and credentialed (PhysioNet/MIMIC) images never")
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            raise CredentialedImageError(f"{repo.repo_id}: {path.relative_to(root)} is a symbolic link "
                                         f"(to {os.readlink(path)}); the upload would follow it: copy the file or drop it")
    for path in sorted(root.rglob("*")):
        relpath = path.relative_to(root).as_posix()
        if mimic_file_name(relpath):
            raise CredentialedImageError(
                f"{repo.repo_id}: {relpath} is named like a MIMIC-CXR file (p<XX>/p<subject>/s<study>/<dicom_id>.jpg); "
                f"MIMIC-CXR is credentialed (PhysioNet's data use agreement) and never published: {how}")

    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        where = path.relative_to(root)
        kind = file_kind(path)
        if kind is not None:
            raise CredentialedImageError(f"{repo.repo_id}: {where} is a {kind}{in_repo}; image, DICOM, "
                                         f"array, archive and other binary files are never published: {how}")
        if path.read_bytes()[:4] != b"PAR1":
            continue
        try:
            schema = pq.read_schema(path)
            table = pq.read_table(path)
        except Exception as error:  # noqa: BLE001 - PAR1 bytes that pyarrow cannot read
            raise CredentialedImageError(f"{repo.repo_id}: {where} is not a readable Parquet file "
                                         f"({type(error).__name__}): {how}") from None
        hits = [hit for column in schema for hit in binary_fields(column.type, column.name)]
        hits += [hit for name in table.column_names for hit in integer_list_fields(table.column(name), name)]
        metadata = schema.metadata or {}
        meta = metadata.get(b"huggingface", b"")
        if hits or b'"Image"' in meta or b"CredentialedImage" in meta:
            raise CredentialedImageError(
                f"{repo.repo_id}: {where} has binary/image column(s) {hits or '(Image feature)'}"
                f"{in_repo}; publish image references (strings) only: {how}")
        if any(BASE64_RUN.search(key + b"\n" + value) for key, value in metadata.items()):
            raise CredentialedImageError(f"{repo.repo_id}: {where} holds base64 data in its Parquet metadata"
                                         f"{in_repo}: {how}")
        odd = column_problems(schema, table.num_rows)
        if odd:
            raise CredentialedImageError(
                f"{repo.repo_id}: {where} has column(s) that are not text: {odd}{in_repo}; a published Parquet file "
                f"holds text, lists of text and JSON text (at most {MAX_PARQUET_NUMBERS} numeric cells), never "
                f"numeric-array or nested columns: {how}")
        for name in table.column_names:
            column = table.column(name)
            storage = _storage(column.type)
            if not (pa.types.is_string(storage) or pa.types.is_large_string(storage) or pa.types.is_nested(storage)):
                continue
            # the column's values as one list: base64, hex or numbers split over rows (or over a cell's JSON) join up
            values = column.to_pylist()
            found = _values_kind(values)
            if found:
                raise CredentialedImageError(f"{repo.repo_id}: {where} column {name!r} holds {found}"
                                             f" {_first_row(values)}{in_repo}; publish image references only: {how}")


# -------------------------------------------------------------------------------------- metrics


def export_metric(name: str, out_dir: str | Path, org: str = DEFAULT_ORG) -> RepoFolder:
    """``metrics/<name>`` as an evaluate Space folder (static SDK: evaluate.load reads files only)."""
    org = check_org(org)
    source = unit_dir("metrics", name)
    folder = Path(out_dir) / "metrics" / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    meta, body = split_card((source / "README.md").read_text())
    if not meta:
        raise PublishError(f"{source / 'README.md'} has no YAML front matter (title, tags, description)")
    meta.pop("sdk_version", None)
    meta.pop("app_file", None)
    meta["sdk"] = "static"
    tags = list(meta.get("tags") or [])
    meta["tags"] = tags + [tag for tag in ("evaluate", "metric") if tag not in tags]
    (folder / "README.md").write_text(render_card(meta, body))
    requirements = (folder / "requirements.txt").read_text() if (folder / "requirements.txt").exists() else ""
    imports_core = re.search(r"^\s*(import|from) medheval\b", (source / f"{name}.py").read_text(), re.M)
    names_core = any(line.strip().split("[")[0].split(">")[0].split("=")[0] == "medheval"
                     for line in requirements.splitlines())
    if imports_core and not names_core:
        raise PublishError(f"metrics/{name}/requirements.txt must name the medheval package (the module imports it)")
    title = meta.get("title", name)
    description = str(meta.get("description", "")).strip()
    (folder / "index.html").write_text(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>{t}</title></head><body>"
        "<h1>{t}</h1><p>{d}</p><pre>pip install medheval\nimport evaluate\n"
        "metric = evaluate.load(\"{org}/{n}\")</pre><p>See README.md for inputs and outputs.</p></body></html>\n"
        .format(t=_html(title), d=_html(description), org=org, n=name))
    return recorded(RepoFolder(str(folder), f"{org}/{name}", "space", "metrics", space_sdk="static"))


def _html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# ---------------------------------------------------------------------------------- mitigations


def export_mitigation(name: str, out_dir: str | Path, org: str = DEFAULT_ORG,
                      base_model: str = DEFAULT_BASE_MODEL) -> RepoFolder:
    """``mitigations/<name>`` as a transformers ``custom_generate`` model repo folder."""
    org = check_org(org)
    source = unit_dir("mitigations", name)
    for required in ("custom_generate/generate.py", "custom_generate/requirements.txt", "README.md"):
        if not (source / required).is_file():
            raise PublishError(f"{source / required} is missing: a custom_generate repo needs it")
    folder = Path(out_dir) / "mitigations" / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(source, folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    meta, body = split_card((source / "README.md").read_text())
    meta.setdefault("library_name", "transformers")
    meta.setdefault("base_model", base_model)
    tags = list(meta.get("tags") or [])
    meta["tags"] = tags + [tag for tag in ("custom_generate", "medheval") if tag not in tags]
    (folder / "README.md").write_text(render_card(meta, body))
    headings = {line.lstrip("#").strip().lower() for line in body.splitlines() if line.startswith("#")}
    missing = [section for section in MITIGATION_SECTIONS if section not in headings]
    warnings = [f"mitigations/{name}/README.md lacks section(s) {missing} that users of custom_generate repos expect"
                ] if missing else []
    return recorded(RepoFolder(str(folder), f"{org}/{name}", "model", "mitigations", warnings=warnings))


# -------------------------------------------------------------------------------------- results


PROVENANCE_DIR = ".eval_results_provenance"  # beside .eval_results/: one JSON per YAML file, same stem


def eval_results_entries(results: Mapping[str, Any], org: str = DEFAULT_ORG, date: str | None = None,
                         allow: Iterable[str] = ()) -> dict[str, list[dict[str, Any]]]:
    """``{file name: [entries]}`` in the Hub's ``.eval_results/*.yaml`` format for one ``results.json``.

    One file per benchmark split and mitigation (the Hub keeps variants of one benchmark in separate
    files); one entry per headline number (:mod:`medheval.scoring.headline`, the numbers ``eval.yaml`` and
    both harnesses report; settings and counts never). ``task_id`` is ``<config>/<metric>/<key>``.
    Random-weight, fixture and limited results (:mod:`medheval.run.provenance`, carried through re-scores)
    are refused unless ``allow`` names them (``random_weights``, ``fixture``, ``limit``); the entries'
    notes then say so, and name a protocol other than ``clean``. Each entry's notes name the value's unit
    (``unit=fraction (0-1)``, ``unit=percent (0-100)``: :data:`medheval.scoring.headline.UNITS`) and, when the
    run knows it, the model revision (``model_revision=org/name@<commit>``), and for a re-score scored against
    other annotation files than its answers were generated from, both files' sha256
    (:func:`medheval.run.provenance.scoring_note`); the format has no key for either
    (:func:`eval_results_provenance` gives the full record)."""
    return _eval_results(results, org, date, allow)[0]


def eval_results_provenance(results: Mapping[str, Any], org: str = DEFAULT_ORG, date: str | None = None,
                            allow: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """``{file name: provenance}``: for each ``.eval_results`` file of :func:`eval_results_entries`, what its
    numbers were made from, written to ``.eval_results_provenance/<stem>.json`` beside it: the model revision,
    the split's annotation source (``dataset_revision``: each annotation file's sha256 and whether it is the
    pinned upstream file; ``scoring_dataset_revision``: those a re-score scored against where they are not the
    answers' or the answers' are unknown, else ``None``), each ``task_id``'s unit and range, the protocol and
    provenance flags, and how the answers were generated (``made_with``). Never a local path (a local model is
    named by its folder's name) nor a credential."""
    return _eval_results(results, org, date, allow)[1]


def _eval_results(results: Mapping[str, Any], org: str, date: str | None, allow: Iterable[str],
                  where: str = "results.json") -> tuple[dict[str, list[dict[str, Any]]], dict[str, dict[str, Any]]]:
    """The entries and the provenance record of each ``.eval_results`` file (see the two public functions),
    once every field they copy has passed :func:`medheval.publish.results_check.check_results` (``where``
    names the results in its error)."""
    org = check_org(org)
    try:
        check_results(results, where)
    except ResultsError as error:
        raise PublishError(str(error)) from None
    runs = results["runs"] if "runs" in results else [results]
    date = date or _dt.date.today().isoformat()
    allow = tuple(allow)
    files: dict[str, list[dict[str, Any]]] = {}
    records: dict[str, dict[str, Any]] = {}
    for run in runs:
        origin = provenance.of_run(run)
        refused = provenance.refusal(origin, allow)
        if refused:
            raise PublishError(refused)
        origin_notes = provenance.notes(origin, allow)
        scored_under = (run.get("protocol") or {}).get("name") if isinstance(run.get("protocol"), Mapping) else None
        if scored_under and scored_under != origin["protocol"]:  # a re-score under another protocol's scorer
            origin_notes.append(f"scored under protocol={scored_under}")
        model_note = revision_note(origin.get("model_revision"))
        settings = run.get("settings") or {}
        mitigation = str(settings.get("mitigation") or "none")
        control = control_of(settings)  # an image-blind control run (medheval.run.control) is said and kept apart
        for split, block in sorted((run.get("benchmarks") or {}).items()):
            benchmark, _, config = split.partition(":")
            if not (SAFE_NAME.fullmatch(benchmark) and (not config or SAFE_NAME.fullmatch(config))):
                raise PublishError(f"results hold a split named {split!r}: expected BENCHMARK:CONFIG of letters, digits, "
                                   "'.', '_' and '-' (a results.json edited by hand, or not from `medheval run`)")
            part = partial_split(split, block)
            if part and "limit" not in set(allow):
                raise PublishError(f"these results are a part of a split: {part}. They are not published as the whole "
                                   f"split; pass {provenance.ALLOW_FLAGS['limit']} to publish them anyway (the entries' "
                                   f"notes then give the records scored out of the split's)")
            entries = []
            units: dict[str, dict[str, Any]] = {}
            scoring_note = provenance.scoring_note(origin, split)  # a re-score against other annotation files
            for metric, values in sorted((block.get("metrics") or {}).items()):
                for key, value in sorted(headline_numbers(metric, values).items()):
                    task_id = f"{config or 'default'}/{metric}/{key}"
                    entry: dict[str, Any] = {"dataset": {"id": f"{org}/{benchmark}", "task_id": task_id},
                                             "value": value, "date": date}
                    notes = [f"n={block.get('n_scored', block.get('n_records'))}"]
                    if part:
                        notes = [f"n={_scored_of(block)} (part of the split, published with "
                                 f"{provenance.ALLOW_FLAGS['limit']})"]
                    if control != "none":
                        notes.insert(0, f"control={control}")
                    if mitigation != "none":
                        notes.insert(0, f"mitigation={mitigation}")
                    unit = headline_unit(metric, key) or "unbounded"
                    notes.append(f"unit={unit_label(unit)}")
                    if model_note:
                        notes.append(model_note)
                    if scoring_note:
                        notes.append(scoring_note)
                    entry["notes"] = ", ".join(notes + origin_notes)
                    entries.append(entry)
                    bounds = UNITS[unit]
                    units[task_id] = {"unit": unit, "range": list(bounds) if bounds else None}
            if entries:
                suffix = "" if mitigation == "none" else "_" + re.sub(r"[^A-Za-z0-9]+", "_", mitigation).strip("_")
                suffix += "" if control == "none" else f"_{control_slug(control, 'settings.control')}"
                name = f"{benchmark}_{config or 'default'}{suffix}.yaml"
                files[name] = entries
                records[name] = _provenance_record(name, f"{org}/{benchmark}", split, origin, units, date)
    return files, records


def _provenance_record(name: str, dataset_id: str, split: str, origin: Mapping[str, Any],
                       units: Mapping[str, Any], date: str) -> dict[str, Any]:
    """The provenance file of one ``.eval_results`` file (:func:`eval_results_provenance`)."""
    return {
        "eval_results": f".eval_results/{name}", "dataset": dataset_id, "split": split, "date": date,
        "model_revision": origin.get("model_revision"),
        "dataset_revision": (origin.get("dataset_revision") or {}).get(split),
        "scoring_dataset_revision": (origin.get("scoring_dataset_revision") or {}).get(split),
        "units": dict(units),
        "provenance": {key: origin.get(key) for key in ("protocol", "random_weights", "fixture", "limit")},
        "made_with": _made_with(origin)[0],
    }


def _made_with(origin: Mapping[str, Any]) -> tuple[dict[str, Any] | None, list[str]]:
    """A run's ``made_with`` as published (its known, typed keys) and the unknown keys left out
    (:func:`medheval.publish.results_check.publishable_made_with`)."""
    try:
        return publishable_made_with(origin.get("made_with"), "results", "provenance.made_with")
    except ResultsError as error:
        raise PublishError(str(error)) from None


def _split_size(block: Mapping[str, Any]) -> int | None:
    """The records of a split block: ``data_quality.n_records`` (every record, scored or not), else ``n_records``."""
    total = (block.get("data_quality") or {}).get("n_records", block.get("n_records"))
    return total if isinstance(total, int) else None


def _scored_of(block: Mapping[str, Any]) -> str:
    """``"n_scored/n_records"`` of a split block (``n_scored`` alone when the split's size is unknown)."""
    total = _split_size(block)
    scored = block.get("n_scored", block.get("n_records"))
    return f"{scored}/{total}" if total is not None and "n_chosen_samples" not in block else f"{scored}"


def partial_split(split: str, block: Mapping[str, Any]) -> str | None:
    """Why a split block scored only a part of its split (records without a prediction, inspect's
    ``sample_id``), or ``None`` for a whole split."""
    if block.get("n_chosen_samples"):
        return f"{split} ran only the {block['n_chosen_samples']} sample(s) chosen by inspect's sample_id"
    scored, total = block.get("n_scored"), _split_size(block)
    if isinstance(scored, int) and total is not None and scored < total:
        return f"{split} scored {scored} of its {total} records (the others had no prediction)"
    return None


def _inside(root: Path, path: Path) -> Path:
    """``path``, after checking that it resolves to a place under ``root`` (:class:`PublishError` if not)."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise PublishError(f"refusing to write {path}: it would land outside {root}")
    return path


def export_results(run_dir: str | Path, out_dir: str | Path, model_repo: str, org: str = DEFAULT_ORG,
                   allow: Iterable[str] = ()) -> RepoFolder:
    """A run's ``results.json`` as ``.eval_results/*.yaml`` for the model repo ``model_repo``; ``run_dir`` may
    also be an inspect ``.eval`` log of a ``medheval/<benchmark>`` task, or a folder of them
    (:mod:`medheval.integrations.inspect.logs`), which give the same files as a run folder. ``allow``: the
    provenance blockers to publish anyway (:func:`eval_results_entries`)."""
    from medheval.integrations.inspect.logs import InspectLogError, inspect_log_paths, results_from_logs

    if not REPO_ID.fullmatch(model_repo) or ".." in model_repo:
        raise PublishError(f"--model-repo {model_repo!r}: expected ORG/MODEL, the Hub repo of the evaluated model")
    results_path = Path(run_dir) / "results.json" if Path(run_dir).is_dir() else Path(run_dir)
    warnings: list[str] = []
    logs = inspect_log_paths(run_dir)
    if logs:
        try:
            results, warnings = results_from_logs(logs)
        except InspectLogError as error:
            raise PublishError(str(error)) from None
    elif not results_path.is_file():
        raise PublishError(f"{results_path} not found: pass the output folder of `medheval run` or an inspect .eval "
                           "log of a medheval task (or a folder of them)")
    else:
        results = json.loads(results_path.read_text())
    allow = tuple(allow)
    files, records = _eval_results(results, org, None, allow, where=str(run_dir if logs else results_path))
    for run in results["runs"] if "runs" in results else [results]:
        source = provenance.of_run(run).get("source_model")
        if source and provenance.is_rescore(run) and source != model_repo:
            warnings.append(f"the answers were generated by {source!r}, published for {model_repo!r}")
        dropped = _made_with(provenance.of_run(run))[1]
        if dropped:
            warnings.append(f"left out of {PROVENANCE_DIR}: {', '.join(dropped[:8])}"
                            f"{f' and {len(dropped) - 8} more' if len(dropped) > 8 else ''} (not a setting medheval "
                            "records: only known generation settings, seed, versions and inputs are published)")
    if not files:
        raise PublishError(f"{results_path} holds no numeric metric values to publish")
    folder = _inside(Path(out_dir), Path(out_dir) / "results" / model_repo.replace("/", "--"))
    shutil.rmtree(folder, ignore_errors=True)
    (folder / ".eval_results").mkdir(parents=True)
    (folder / PROVENANCE_DIR).mkdir()
    for name, entries in files.items():
        target = _inside(folder / ".eval_results", folder / ".eval_results" / name)
        record = _inside(folder / PROVENANCE_DIR, folder / PROVENANCE_DIR / (Path(name).stem + ".json"))
        try:
            text = check_size(yaml.safe_dump(entries, sort_keys=False, allow_unicode=True), f".eval_results/{name}")
            provenance_text = check_size(_publishable_json(records[name], record.name), f"{PROVENANCE_DIR}/{record.name}")
        except ResultsError as error:
            shutil.rmtree(folder, ignore_errors=True)
            raise PublishError(str(error)) from None
        target.write_text(text)
        record.write_text(provenance_text)
    return recorded(RepoFolder(str(folder), model_repo, "model", "results", warnings=warnings))


def _publishable_json(record: Mapping[str, Any], where: str) -> str:
    """``record`` as JSON, after checking that it holds no path under the home folder and no token-like
    string: a provenance file names a local model by its folder's name only."""
    from medheval.net.secrets import redact

    text = json.dumps(record, indent=2, sort_keys=True, default=str)
    home = str(Path.home())
    leaked = len(home) > 1 and home in text
    # a registered secret (HF_TOKEN, *_API_KEY, PHYSIONET_PASSWORD, a URL's password), or a token-shaped string
    if leaked or redact(text) != text or re.search(r"\bhf_[A-Za-z0-9]{20,}|\bsk-[A-Za-z0-9_-]{20,}", text):
        raise PublishError(f"{where} would hold a local path or a token; nothing was written. The run's results.json "
                           "records one where only a name belongs: report it, or publish from a fresh run")
    return text + "\n"


# ------------------------------------------------------------------------------ export and push


def _not_published(name: str) -> str | None:
    """Why a benchmark is never exported (its builder's ``NOT_PUBLISHED``), or ``None``."""
    from medheval.data.benchmarks import builder_class

    return getattr(builder_class(name), "NOT_PUBLISHED", None)


def export_all(out_dir: str | Path, org: str = DEFAULT_ORG, kinds: Sequence[str] = tuple(REPO_TYPES),
               names: Iterable[str] | None = None, data_dir: str | Path | None = None,
               cache_dir: str | Path | None = None, results: tuple[str | Path, str] | None = None,
               allow: Iterable[str] = (),
               lock_timeout: float = 0.0) -> list[RepoFolder]:
    """Write one folder per Hub repo under ``out_dir`` (and ``publish.json`` listing them); ``results``
    (``(run folder or inspect log, model repo)``) adds that model repo's ``.eval_results`` folder.

    Atomic and locked: ``out_dir`` is locked like a run's folder (:class:`medheval.run.outputs.OutputLock`:
    a second publish into it refuses at once, naming the holder, or waits ``lock_timeout`` seconds), every
    folder is built in a staging folder inside ``out_dir``, then each replaces its target in one rename
    (:func:`medheval.run.outputs.replace_folder`). ``publish.json`` first stops listing the repos being
    replaced and lists them again once they are in place, so a kill at any point leaves every listed repo
    complete (old or new): never a half-written folder that :func:`check_recorded_files` would let through."""
    org = check_org(org)
    with OutputLock(out_dir, timeout=lock_timeout, purpose="publish"):
        out = Path(out_dir)
        for folder in [out, *(out / kind for kind in (*REPO_TYPES, "results"))]:
            remove_stale_staging(folder)  # what a killed publish left
        stage = staging_folder(out / "publish")
        try:
            repos = [export_results(results[0], stage, results[1], org=org, allow=allow)] if results else []
            skipped = _export_units(stage, repos, org, kinds, names, data_dir, cache_dir)
            _commit(stage, out, repos)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        if skipped:
            atomic_write_text(out / "skipped.json", json.dumps(skipped, indent=2))
    if "datasets" in kinds and skipped and not any(repo.kind == "datasets" for repo in repos):
        reasons = "; ".join(f"{name}: {reason}" for name, reason in skipped.items())
        others = f" (the {len(repos)} other repo folder(s) are in {out_dir})" if repos else ""
        raise PublishError(f"no dataset was exported{others}. Skipped: {reasons}. Point --data-dir at the "
                           "benchmark's annotation files, or publish other kinds only with --kind metrics/mitigations")
    return repos


def _commit(stage: Path, out: Path, repos: list[RepoFolder]) -> None:
    """Move each staged repo folder to its place under ``out`` in one rename and list it in ``publish.json``:
    first unlist what is being replaced (the same repo, or another entry for the same folder), then replace
    the folders, then list them (each step atomic)."""
    path = out / MANIFEST
    targets = {os.path.abspath(out / Path(repo.folder).relative_to(stage)) for repo in repos}
    keys = {repo.repo_id + "|" + repo.repo_type for repo in repos}
    entries = json.loads(path.read_text()) if path.is_file() else []
    kept = [entry for entry in entries if entry["repo_id"] + "|" + entry["repo_type"] not in keys
            and os.path.abspath(entry["folder"]) not in targets]
    if len(kept) != len(entries):
        atomic_write_text(path, json.dumps(kept, indent=2))
    for repo in repos:
        target = out / Path(repo.folder).relative_to(stage)
        target.parent.mkdir(parents=True, exist_ok=True)
        replace_folder(repo.folder, target)
        repo.folder = str(target)
    write_manifest(out, repos)


def _export_units(stage: Path, repos: list[RepoFolder], org: str, kinds: Sequence[str], names: Iterable[str] | None,
                  data_dir: str | Path | None, cache_dir: str | Path | None) -> dict[str, str]:
    """Export the units of ``kinds`` (only ``names``, when given) into ``stage``, appending to ``repos``;
    returns the datasets skipped, with why."""
    out_dir = stage
    wanted = set(names) if names else None
    skipped: dict[str, str] = {}  # dataset name -> why it was not exported (also in skipped.json)
    for kind in kinds:
        if kind not in REPO_TYPES:
            raise PublishError(f"unknown kind {kind!r}; choose from {list(REPO_TYPES)}")
        for name in list_units(kind):
            if wanted is not None and name not in wanted:
                continue
            if kind == "datasets":
                reason = _not_published(name)
                if reason is None:
                    try:
                        repos.append(export_dataset(name, out_dir, org, data_dir=data_dir, cache_dir=cache_dir))
                        continue
                    except FileNotFoundError as error:  # its annotations are not where data_dir points
                        if wanted is not None:
                            raise
                        reason = f"annotation files not available ({str(error).splitlines()[0]})" + (
                            "" if data_dir is not None else "; pass --data-dir DIR, a local copy of the upstream "
                            "annotation folder, or allow network access to fetch them once")
                if wanted is not None:
                    raise PublishError(f"dataset {name!r} is not published: {reason}")
                skipped[name] = reason
                print(f"publish: skipped dataset {name}: {reason}", file=sys.stderr)
            elif kind == "metrics":
                repos.append(export_metric(name, out_dir, org))
            else:
                repos.append(export_mitigation(name, out_dir, org))
    if wanted is not None:
        unknown = wanted - {Path(repo.folder).name for repo in repos}
        if unknown:
            raise PublishError(f"no unit named {sorted(unknown)} among {list(kinds)}")
    return skipped


def write_manifest(out_dir: str | Path, repos: Sequence[RepoFolder]) -> Path:
    """``publish.json``: the repos under ``out_dir`` (merged with an existing manifest, by repo id), replaced
    atomically."""
    path = Path(out_dir) / MANIFEST
    existing = {entry["repo_id"] + "|" + entry["repo_type"]: entry
                for entry in (json.loads(path.read_text()) if path.is_file() else [])}
    for repo in repos:
        existing[repo.repo_id + "|" + repo.repo_type] = asdict(repo)
    atomic_write_text(path, json.dumps(list(existing.values()), indent=2))
    return path


def read_manifest(out_dir: str | Path) -> list[RepoFolder]:
    """The repos a previous export listed in ``publish.json``."""
    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        raise PublishError(f"{path} not found: run `medheval publish --to {out_dir}` first")
    known = set(RepoFolder.__dataclass_fields__)
    repos = []
    for entry in json.loads(path.read_text()):
        unknown = sorted(set(entry) - known) if isinstance(entry, dict) else ["(not an object)"]
        if unknown:
            raise PublishError(f"{path}: an entry has unknown field(s) {unknown}; export again with `medheval publish`")
        repo = RepoFolder(**entry)
        _inside(Path(out_dir), Path(repo.folder))  # a manifest cannot point the upload at another folder
        repos.append(repo)
    return repos


def push(repos: Sequence[RepoFolder], token: str | bool | None = None, create_pr: bool = False) -> list[str]:
    """Upload each folder to its repo (``create_repo(exist_ok=True)`` + ``upload_folder``); commit URLs.

    The token comes from ``token`` or huggingface_hub's usual places (``HF_TOKEN``, ``hf auth login``)
    and is never printed. The endpoint is ``HF_ENDPOINT`` (default https://huggingface.co). Every repo is
    checked before the first upload (:func:`check_recorded_files`, :func:`check_no_credentialed_bytes`:
    the content checks run on every repo, gated or not, and a file's sha256 in ``publish.json`` never exempts
    it), then its recorded files are copied to a private folder (sha256 checked again while copying), each
    Parquet file there is written afresh from the table it holds (:func:`rewrite_parquet`: bytes hidden beside
    the table are dropped), the copy is checked again, and that copy is uploaded: a file swapped in the folder
    after the checks never reaches the Hub."""
    import tempfile

    from huggingface_hub import HfApi
    from tqdm.auto import tqdm

    from medheval.publish.hub_access import register_hub_credentials

    register_hub_credentials(token, resolve=True)  # a Hub echoing the token into an error or a reply field prints ***
    api = HfApi(token=token, library_name="medheval")
    with tempfile.TemporaryDirectory(prefix="medheval-push-") as private:
        checked = []
        for index, repo in enumerate(repos):  # check everything before the first upload
            gated = check_recorded_files(repo)  # a gated repo: only what the exporter wrote and recorded
            checked.append(RepoFolder(**{**asdict(repo), "gated": gated}))
            if not checked[-1].files:  # an older manifest's entry: upload what is there now, checked like the rest
                checked[-1] = recorded(checked[-1])
            check_no_credentialed_bytes(checked[-1])  # every repo, gated or not, every file, listed or not
        for index, repo in enumerate(checked):
            if repo.files:
                repo.folder = str(_snapshot(repo, Path(private) / str(index)))
                check_no_credentialed_bytes(repo)  # what is uploaded, Parquet files as rewritten
        return _upload(api, checked, create_pr, tqdm)


def _snapshot(repo: RepoFolder, copy: Path) -> Path:
    """Copy ``repo``'s recorded files to ``copy`` (never through a link), checking each one's sha256 again; each
    Parquet file is then written afresh from its table (:func:`rewrite_parquet`), so the copy holds nothing its
    table does not (an exported file comes out byte for byte the same)."""
    root = Path(repo.folder)
    for relpath, expected in sorted(repo.files.items()):
        target = copy / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        source = root
        for part in Path(relpath).parts[:-1]:
            source = source / part
            if source.is_symlink():
                raise CredentialedImageError(f"{repo.repo_id}: {relpath}: {part} became a symbolic link during the push")
        digest = hashlib.sha256()
        try:
            descriptor = os.open(root / relpath, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as error:
            raise CredentialedImageError(f"{repo.repo_id}: {relpath} could not be read as a plain file during the "
                                         f"push ({error.strerror}); nothing was uploaded: export again") from None
        with os.fdopen(descriptor, "rb") as handle, open(target, "wb") as out:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                out.write(block)
        if digest.hexdigest() != expected:
            raise CredentialedImageError(f"{repo.repo_id}: {relpath} changed during the push (after its checks); "
                                         "nothing was uploaded: export again")
        with open(target, "rb") as handle:
            parquet = handle.read(4) == b"PAR1"
        if parquet:  # upload only what its table holds (bytes hidden between its column chunks are dropped)
            try:
                rewrite_parquet(target, target)
            except Exception as error:  # noqa: BLE001 - PAR1 bytes that pyarrow cannot read or write back
                raise CredentialedImageError(f"{repo.repo_id}: {relpath} could not be written back from its table "
                                             f"({type(error).__name__}); nothing was uploaded: export again") from None
            if repo.gated:
                _check_exported_parquet(repo.repo_id, relpath, target)
    return copy


def _upload(api: Any, repos: Sequence[RepoFolder], create_pr: bool, tqdm: Any) -> list[str]:
    from huggingface_hub.errors import HfHubHTTPError

    urls = []
    for repo in tqdm(repos, desc="push", unit="repo"):
        is_results = repo.kind == "results"
        try:
            if not is_results:  # results go to the evaluated model's existing repo
                api.create_repo(repo.repo_id, repo_type=repo.repo_type, exist_ok=True, space_sdk=repo.space_sdk)
            if repo.gated:
                api.update_repo_settings(repo.repo_id, repo_type=repo.repo_type, gated="manual")
            commit = api.upload_folder(repo_id=repo.repo_id, folder_path=repo.folder, repo_type=repo.repo_type,
                                       commit_message="Publish with medheval", create_pr=create_pr and is_results)
        except HfHubHTTPError as error:
            raise PublishError(_push_failure(repo, error, len(urls))) from None
        urls.append(str(commit))
    return urls


def _push_failure(repo: RepoFolder, error: Exception, pushed: int) -> str:
    """One line for a Hub error while pushing ``repo``: what went wrong and what to do (never the token)."""
    from huggingface_hub.errors import RepositoryNotFoundError

    status = getattr(getattr(error, "response", None), "status_code", None)
    where = f"{repo.repo_type} repo {repo.repo_id!r}"
    if status == 401:
        why = (f"the Hub refused the token (HTTP 401) pushing to {where}: log in again (`hf auth login`) or set "
               "HF_TOKEN to a valid token with write access")
    elif isinstance(error, RepositoryNotFoundError) or status == 404:
        why = (f"the Hub has no {where}, or the token cannot see it (HTTP {status}): create the repo on the Hub first "
               "(results go to the evaluated model's existing repo; check --model-repo), or use a token that can "
               "read and write it")
    elif status == 403:
        why = (f"the token may not write to {where} (HTTP 403): use a token with write access to it, or pass "
               "--create-pr to open a pull request")
    else:
        why = f"the Hub answered HTTP {status} pushing to {where}: check the repo and the token, then push again"
    done = f"; {pushed} repo(s) before it were pushed" if pushed else "; nothing was pushed"
    return why + done


# ------------------------------------------------------------------------- bare metric names


INSTALL_NAMESPACES = ("evaluate-metric", "medheval")  # evaluate.load("<name>") and evaluate.load("medheval/<name>")


def install_metrics(names: Iterable[str] | None = None, modules_cache: str | Path | None = None) -> list[Path]:
    """Register the metric modules in evaluate's dynamic-module cache, once per id in
    :data:`INSTALL_NAMESPACES`: ``evaluate-metric--<name>/<hash>/`` (where ``evaluate.load("<name>")`` falls
    back when the Hub has no ``evaluate-metric/<name>``) and ``medheval--<name>/<hash>/`` (where
    ``evaluate.load("medheval/<name>")`` falls back offline, or when the Hub cannot be reached).

    This is exactly the layout evaluate writes after downloading a Hub module, made with evaluate's own
    ``_create_importable_file``; evaluate 0.4 tries the Hub first (offline: skipped), then this cache
    (the newest hash of the id). ``evaluate.load(metric_path(name))`` (local folder) needs none of this."""
    from evaluate.loading import DownloadMode, _create_importable_file, get_imports, init_dynamic_modules

    dynamic_modules = init_dynamic_modules(hf_modules_cache=str(modules_cache) if modules_cache else None)
    installed = []
    for name in (list(names) if names else list_units("metrics")):
        script = unit_dir("metrics", name) / f"{name}.py"
        local_imports = [(kind, value) for kind, value, *_ in get_imports(str(script)) if kind == "internal"]
        if local_imports:
            raise PublishError(f"{script} imports sibling files {local_imports}; install-metrics copies one file")
        for namespace in INSTALL_NAMESPACES:
            _create_importable_file(local_path=str(script), local_imports=[], additional_files=[],
                                    dynamic_modules_path=dynamic_modules, module_namespace="metrics",
                                    name=f"{namespace}/{name}", download_mode=DownloadMode.FORCE_REDOWNLOAD)
            installed.append(Path(dynamic_modules) / "metrics" / f"{namespace}--{name}")
    return installed
