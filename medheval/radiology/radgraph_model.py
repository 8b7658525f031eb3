"""RadGraph entity/relation extraction from local weights, through the ``radgraph`` package's model code.

The model is DyGIE++ (Wadden et al., 2019): a transformer encoder over the report's words, span
enumeration, a span NER head and a pairwise relation head. ``radgraph==0.1.18`` (MIT) carries that
model code (``radgraph/dygie`` plus a stripped AllenNLP in ``radgraph/allennlp``) on plain
torch/transformers; this module builds the model with those classes and loads the real weights, so
the extraction is the package's, not a re-implementation. What this module adds:

- **local loading**: a model folder (or the ``.tar.gz`` it ships as) instead of the package's Hub
  download, and the encoder's tokenizer/config from a local folder instead of the Hub name written
  in ``config.json``;
- **transformers 5**: the package calls ``tokenizer.encode_plus`` and
  ``tokenizer.build_inputs_with_special_tokens``, which transformers 5 removed. Tokenizers handed to
  the package get both back (``encode_plus(a, b, **kw)`` is ``tokenizer(a, b, **kw)``; the special
  tokens wrapped around a segment are read off the tokenizer itself). Nothing else is patched;
- strict, explained weight loading (a missing, unexpected or mis-shaped tensor names itself);
- empty reports get an empty graph without a model call (the package would feed the word "None");
- **long reports**: the package turns the model's predictions into a graph in time cubic in the
  report length (and builds the relation head's pair features in one piece); by default
  ``radgraph_decoding`` gives the same graph in linear time and blockwise memory
  (``decoding="package"`` keeps the package's own path, for checking).

**Model folder layout** (what the package extracts from ``StanfordAIMI/RRG_scorers``
``radgraph.tar.gz`` / ``radgraph-xl.tar.gz`` / ``modern-radgraph-xl.tar.gz`` / ``echograph.tar.gz``,
and what an AllenNLP archive such as PhysioNet RadGraph 1.0.0's ``model.tar.gz`` holds)::

    <radgraph_path>/
        config.json          AllenNLP/DyGIE config: dataset_reader.{max_span_width, token_indexers.bert.model_name},
                             model.{embedder|text_field_embedder, modules, feature_size, max_span_width, ...}
        weights.th           torch state dict of the whole DyGIE model (encoder included)
        vocabulary/          AllenNLP vocabulary: non_padded_namespaces.txt, <dataset>__ner_labels.txt,
                             <dataset>__relation_labels.txt
        encoder/             (optional) tokenizer + config.json of the encoder named in config.json

The ``<dataset>`` prefix of the label namespaces is read from ``vocabulary/`` (the package's archives
use the model type, AllenNLP archives trained without a dataset field use ``None``).

Tokenization before the model follows the package's ``preprocess_reports`` for the model type:
``radgraph`` (v1, what MedHEval ran) splits around punctuation with RadGraph's regex; the XL models
use ``nltk.wordpunct_tokenize`` plus fixes.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import json
import os
import shutil
import tarfile
import tempfile
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from medheval.radiology import radgraph_decoding

RADGRAPH_PATH_ENV = "MEDHEVAL_RADGRAPH_PATH"
RADGRAPH_ENCODER_ENV = "MEDHEVAL_RADGRAPH_ENCODER"
MODEL_TYPES: tuple[str, ...] = ("radgraph", "radgraph-xl", "modern-radgraph-xl", "echograph")
DEFAULT_MODEL_TYPE = "radgraph"
REQUIRED_FILES: tuple[str, ...] = ("config.json", "weights.th", "vocabulary")
DECODINGS: tuple[str, ...] = ("linear", "package")
ENCODER_SUBDIR = "encoder"
PACKAGE_SPEC = "radgraph==0.1.18"
# Constant buffers older transformers wrote into state dicts (transformers >= 4.31 / 5 keep them out).
IGNORED_BUFFER_SUFFIXES: tuple[str, ...] = (".embeddings.position_ids", ".embeddings.token_type_ids")
# Keys of config["model"] that are not DyGIE constructor arguments.
NON_ARGUMENT_KEYS = frozenset({"type", "embedder", "text_field_embedder", "initializer", "module_initializer"})

WEIGHTS_HELP = """\
RadGraph weights are not redistributed with this package. Get one of:
  * the radgraph package's models on the Hugging Face Hub, repo StanfordAIMI/RRG_scorers:
    radgraph.tar.gz (RadGraph v1, the model family MedHEval used), radgraph-xl.tar.gz,
    modern-radgraph-xl.tar.gz, echograph.tar.gz (~420 MB each):
      hf download StanfordAIMI/RRG_scorers radgraph.tar.gz --local-dir /path/radgraph
    then pass the .tar.gz (it is extracted once into the medheval cache) or its extracted folder;
  * PhysioNet RadGraph 1.0.0 (credentialed access, https://physionet.org/content/radgraph/1.0.0/):
    models/model_checkpoint/model.tar.gz, the checkpoint MedHEval's scripts point at.
The folder must hold config.json, weights.th and vocabulary/. Its config.json names the encoder
(a Hub model id); offline, put that model's tokenizer files and config.json in <folder>/encoder/
(e.g. `hf download <model id> config.json vocab.txt tokenizer_config.json --local-dir <folder>/encoder`),
or pass encoder_path=..., or have it in the Hugging Face cache.
Point at the model with one of:
  Python / evaluate:  radgraph_path="/path/radgraph/radgraph.tar.gz"   (or the extracted folder)
  run_eval.py:        --metric-option {metric}.radgraph_path=/path/radgraph/radgraph.tar.gz
  environment:        export {path_env}=/path/radgraph/radgraph.tar.gz
(encoder folder: encoder_path=... or {encoder_env}=...)."""


class RadGraphError(ValueError):
    """A RadGraph setup problem the user can fix (shown as one message)."""


class RadGraphWeightsMissing(RadGraphError):
    """No RadGraph model was given, or the given path does not exist."""


class RadGraphCheckpointError(RadGraphError):
    """The given files are not a RadGraph (DyGIE++) model this code can load."""


class RadGraphPackageMissing(RadGraphError):
    """The ``radgraph`` package (the model code) is not installed."""


def weights_help(metric: str = "radgraph_f1") -> str:
    return WEIGHTS_HELP.format(metric=metric, path_env=RADGRAPH_PATH_ENV, encoder_env=RADGRAPH_ENCODER_ENV)


# --------------------------------------------------------------------------------------------------
# Finding the files


def _cache_root() -> Path:
    base = os.environ.get("MEDHEVAL_CACHE") or os.path.join(Path.home(), ".cache", "medheval")
    return Path(base) / "radgraph"


def _hub_file(uri: str, metric: str) -> str:
    parts = uri[len("hf://"):].split("/")
    if len(parts) < 3:
        raise RadGraphWeightsMissing(f"{uri!r}: expected hf://OWNER/REPO/FILE, "
                                     f"e.g. hf://StanfordAIMI/RRG_scorers/radgraph.tar.gz")
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo_id="/".join(parts[:2]), filename="/".join(parts[2:]))
    except Exception as error:  # offline, gated, missing file: one message with the way out
        raise RadGraphWeightsMissing(f"could not get {uri} from the Hugging Face Hub "
                                     f"({type(error).__name__}: {error}).\n" + weights_help(metric)) from error


def _is_model_dir(folder: Path) -> bool:
    return (folder / "config.json").is_file() and (folder / "weights.th").is_file()


def _extract_archive(archive: Path) -> Path:
    """Extract a model ``.tar.gz`` once into the cache (keyed by name, size and mtime); returns the folder."""
    stat = archive.stat()
    key = hashlib.sha256(f"{archive.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    name = archive.name.split(".")[0] or "model"
    target = _cache_root() / f"{name}-{key}"
    if target.is_dir() and (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        with tarfile.open(archive, "r:*") as tar:
            root = staging.resolve()
            for member in tar.getmembers():
                destination = (staging / member.name).resolve()
                if not (destination == root or root in destination.parents) or member.issym() or member.islnk():
                    raise RadGraphCheckpointError(f"{archive}: unsafe archive member {member.name!r} (absolute path, "
                                                  f"'..' or a link); refusing to extract")
            if hasattr(tarfile, "data_filter"):
                tar.extractall(staging, filter="data")
            else:  # pragma: no cover - Python < 3.11.4
                tar.extractall(staging)
        (staging / ".complete").write_text(str(archive))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    except tarfile.TarError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise RadGraphCheckpointError(f"{archive} is not a readable tar archive ({error}); expected a RadGraph model "
                                      f".tar.gz (config.json, weights.th, vocabulary/)") from error
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _choose_model_dir(folder: Path, model_type: str | None) -> Path:
    if _is_model_dir(folder):
        return folder
    if model_type and _is_model_dir(folder / model_type):
        return folder / model_type
    children = sorted(child for child in folder.iterdir() if child.is_dir() and _is_model_dir(child))
    if len(children) == 1:
        return children[0]
    if children:
        raise RadGraphWeightsMissing(f"{folder} holds several RadGraph models ({', '.join(c.name for c in children)}); "
                                     f"pass one of them, or model_type= to pick it")
    missing = [name for name in REQUIRED_FILES if not (folder / name).exists()]
    raise RadGraphCheckpointError(f"{folder} is not a RadGraph model folder: missing {', '.join(missing)} "
                                  f"(expected config.json, weights.th and vocabulary/ from a RadGraph model.tar.gz).\n"
                                  + weights_help())


def resolve_radgraph_dir(path: str | os.PathLike | None = None, model_type: str | None = None,
                         metric: str = "radgraph_f1") -> Path:
    """The model folder to load: ``path``, else ``$MEDHEVAL_RADGRAPH_PATH``; a clear error when neither is usable.

    ``path`` may be a model folder, a folder holding one model folder (or ``<model_type>/``, the
    radgraph package's cache layout), a ``.tar.gz`` archive (extracted once into
    ``$MEDHEVAL_CACHE/radgraph``), or ``hf://OWNER/REPO/FILE`` (downloaded with huggingface_hub).
    """
    chosen = os.fspath(path) if path not in (None, "") else os.environ.get(RADGRAPH_PATH_ENV, "")
    if not chosen:
        raise RadGraphWeightsMissing("RadGraph F1 needs a RadGraph model (radgraph_path), and none was given.\n"
                                     + weights_help(metric))
    if chosen.startswith("hf://"):
        chosen = _hub_file(chosen, metric)
    resolved = Path(chosen).expanduser()
    if not resolved.exists():
        source = "" if path not in (None, "") else f" (from ${RADGRAPH_PATH_ENV})"
        raise RadGraphWeightsMissing(f"RadGraph model not found: {resolved}{source}.\n" + weights_help(metric))
    if resolved.is_file():
        resolved = _extract_archive(resolved)
    folder = _choose_model_dir(resolved, model_type)
    if not (folder / "vocabulary").is_dir():
        raise RadGraphCheckpointError(f"{folder} has no vocabulary/ folder (the model's AllenNLP label vocabulary)")
    return folder


def infer_model_type(model_dir: Path, model_type: str | None = None) -> str:
    """``model_type`` if given, else the folder's name when it is a known type, else ``radgraph`` (v1)."""
    if model_type:
        if model_type not in MODEL_TYPES:
            raise RadGraphError(f"unknown RadGraph model_type {model_type!r}; expected one of {', '.join(MODEL_TYPES)}")
        return model_type
    name = model_dir.name.lower()  # "radgraph-xl", or "radgraph-xl-<key>" for an extracted archive
    matches = [known for known in MODEL_TYPES if name == known or name.startswith(known + "-")]
    return max(matches, key=len) if matches else DEFAULT_MODEL_TYPE


def resolve_encoder(config: dict, model_dir: Path, encoder_path: str | os.PathLike | None) -> str:
    """The encoder's tokenizer/config location: ``encoder_path``, ``$MEDHEVAL_RADGRAPH_ENCODER``,
    ``<model_dir>/encoder/``, else the name written in ``config.json`` (a Hub id or a path)."""
    for candidate in (encoder_path, os.environ.get(RADGRAPH_ENCODER_ENV)):
        if candidate not in (None, ""):
            folder = Path(os.fspath(candidate)).expanduser()
            if not (folder / "config.json").is_file():
                raise RadGraphWeightsMissing(f"encoder folder {folder} has no config.json (it must hold the encoder's "
                                             f"tokenizer files and config.json, e.g. those of "
                                             f"{_config_encoder_name(config)})")
            return str(folder)
    local = model_dir / ENCODER_SUBDIR
    if (local / "config.json").is_file():
        return str(local)
    return _config_encoder_name(config)


def _config_encoder_name(config: dict) -> str:
    try:
        return str(config["dataset_reader"]["token_indexers"]["bert"]["model_name"])
    except (KeyError, TypeError):
        raise RadGraphCheckpointError("config.json has no dataset_reader.token_indexers.bert.model_name: "
                                      "not a RadGraph (DyGIE++) config") from None


# --------------------------------------------------------------------------------------------------
# The radgraph package, made to work with transformers 5


def _import_radgraph() -> dict[str, Any]:
    try:
        with warnings.catch_warnings():  # radgraph.radgraph sets a global DeprecationWarning filter on import
            warnings.simplefilter("ignore")
            from radgraph.allennlp.common import cached_transformers
            from radgraph.allennlp.data import Vocabulary, token_indexers
            from radgraph.allennlp.data.dataloader import PyTorchDataLoader
            from radgraph.allennlp.data.dataset_readers import AllennlpDataset
            from radgraph.allennlp.modules import text_field_embedders, token_embedders
            from radgraph.dygie.data.dataset_readers.dygie import DyGIEReader
            from radgraph.dygie.models.dygie import DyGIE
            from radgraph import utils as radgraph_utils
    except ImportError as error:
        raise RadGraphPackageMissing(
            f"RadGraph F1 runs the RadGraph model with the `radgraph` package's model code, which is not installed "
            f"({error}). Install it: pip install '{PACKAGE_SPEC}' (or pip install 'medheval[radiology]')."
        ) from error
    _patch_tokenizer_factory(cached_transformers)
    return dict(cached_transformers=cached_transformers, Vocabulary=Vocabulary, token_indexers=token_indexers,
                PyTorchDataLoader=PyTorchDataLoader, AllennlpDataset=AllennlpDataset,
                text_field_embedders=text_field_embedders, token_embedders=token_embedders,
                DyGIEReader=DyGIEReader, DyGIE=DyGIE, utils=radgraph_utils)


def add_legacy_tokenizer_api(tokenizer: Any) -> Any:
    """Give a transformers-5 tokenizer the two methods radgraph's AllenNLP code calls (no-op when present).

    - ``encode_plus(text, text_pair=None, **kw)`` = ``tokenizer(text, text_pair, **kw)`` (the v4 alias);
    - ``build_inputs_with_special_tokens(ids)`` wraps ``ids`` in the special tokens the tokenizer adds
      to a single sequence (read off ``tokenizer("a")`` vs ``tokenizer("a", add_special_tokens=False)``).
    """
    if not hasattr(tokenizer, "encode_plus"):
        def encode_plus(text, text_pair=None, **kwargs):
            return tokenizer(text, text_pair, **kwargs)

        tokenizer.encode_plus = encode_plus
    if not hasattr(tokenizer, "build_inputs_with_special_tokens"):
        plain = tokenizer("a", add_special_tokens=False)["input_ids"]
        full = tokenizer("a", add_special_tokens=True)["input_ids"]
        at = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), None)
        if not plain or at is None:
            raise RadGraphCheckpointError(f"cannot find where {type(tokenizer).__name__} puts its special tokens")
        prefix, suffix = list(full[:at]), list(full[at + len(plain):])

        def build_inputs_with_special_tokens(token_ids_0, token_ids_1=None):
            if token_ids_1 is not None:
                raise NotImplementedError("sequence pairs are not used by RadGraph")
            return prefix + list(token_ids_0) + suffix

        tokenizer.build_inputs_with_special_tokens = build_inputs_with_special_tokens
    return tokenizer


def _patch_tokenizer_factory(cached_transformers: Any) -> None:
    """Make radgraph's tokenizer cache hand out tokenizers with :func:`add_legacy_tokenizer_api` applied."""
    if getattr(cached_transformers.get_tokenizer, "_medheval_compat", False):
        return
    original = cached_transformers.get_tokenizer

    def get_tokenizer(model_name: str, **kwargs: Any) -> Any:
        return add_legacy_tokenizer_api(original(model_name, **kwargs))

    get_tokenizer._medheval_compat = True  # type: ignore[attr-defined]
    cached_transformers.get_tokenizer = get_tokenizer


def _forget_cached_encoder(cached_transformers: Any, name: str) -> None:
    """radgraph caches encoders and tokenizers by name; drop ``name`` so a rewritten folder is re-read."""
    for key in [k for k in cached_transformers._model_cache if k.model_name == name]:
        del cached_transformers._model_cache[key]
    for key in [k for k in cached_transformers._tokenizer_cache if k[0] == name]:
        del cached_transformers._tokenizer_cache[key]


# --------------------------------------------------------------------------------------------------
# Building and loading the model


def _read_config(model_dir: Path) -> dict:
    try:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise RadGraphCheckpointError(f"{model_dir / 'config.json'} is not readable JSON ({error})") from error
    model = config.get("model") if isinstance(config, dict) else None
    reader = config.get("dataset_reader") if isinstance(config, dict) else None
    if not isinstance(model, dict) or not isinstance(reader, dict) or "modules" not in model:
        raise RadGraphCheckpointError(f"{model_dir / 'config.json'} is not a RadGraph (DyGIE++) config: it needs "
                                      f"'dataset_reader' and 'model' with 'modules' (found keys {sorted(config)[:8]})")
    return config


def _embedder_config(model: dict) -> dict:
    embedder = model.get("embedder") or model.get("text_field_embedder") or {}
    try:
        return dict(embedder["token_embedders"]["bert"])
    except (KeyError, TypeError):
        raise RadGraphCheckpointError("config.json: model.embedder.token_embedders.bert is missing") from None


def _load_vocabulary(rg: dict, model_dir: Path) -> Any:
    vocab_dir = model_dir / "vocabulary"
    try:
        return rg["Vocabulary"].from_files(str(vocab_dir))
    except PermissionError:  # read-only model folder: AllenNLP writes a lock file next to the vocabulary
        scratch = Path(tempfile.mkdtemp(prefix="radgraph-vocab-"))
        shutil.copytree(vocab_dir, scratch / "vocabulary")
        return rg["Vocabulary"].from_files(str(scratch / "vocabulary"))


def _dataset_prefix(vocab: Any, model_type: str, model_dir: Path) -> str:
    prefixes = sorted({ns[: -len("__ner_labels")] for ns in vocab.get_namespaces() if ns.endswith("__ner_labels")})
    if not prefixes:
        raise RadGraphCheckpointError(f"{model_dir / 'vocabulary'} has no '<dataset>__ner_labels' namespace: "
                                      f"not a RadGraph (DyGIE++) vocabulary (found {sorted(vocab.get_namespaces())})")
    if len(prefixes) == 1:
        return prefixes[0]
    if model_type in prefixes:
        return model_type
    raise RadGraphCheckpointError(f"{model_dir / 'vocabulary'} has label namespaces for several datasets {prefixes}; "
                                  f"pass model_type= naming one of them")


def build_dygie(model_dir: str | os.PathLike, encoder: str,
                model_type: str = DEFAULT_MODEL_TYPE) -> tuple[Any, Any, str]:
    """Build the (randomly initialised) DyGIE model and its reader from a model folder's config and vocabulary.

    Returns ``(model, reader, dataset_prefix)``; weights are loaded by :class:`RadGraphAnnotator`.
    """
    rg = _import_radgraph()
    model_dir = Path(model_dir)
    config = _read_config(model_dir)
    vocab = _load_vocabulary(rg, model_dir)
    prefix = _dataset_prefix(vocab, model_type, model_dir)
    reader_config, model_config = config["dataset_reader"], dict(config["model"])
    indexer_config = (reader_config.get("token_indexers") or {}).get("bert") or {}
    embedder_config = _embedder_config(model_config)
    max_length = indexer_config.get("max_length") or embedder_config.get("max_length") or 512
    _forget_cached_encoder(rg["cached_transformers"], encoder)
    try:
        indexer = rg["token_indexers"].PretrainedTransformerMismatchedIndexer(model_name=encoder, max_length=max_length)
        token_embedder = rg["token_embedders"].PretrainedTransformerMismatchedEmbedder(model_name=encoder,
                                                                                     max_length=max_length)
    except OSError as error:
        raise RadGraphWeightsMissing(
            f"cannot load the RadGraph encoder's tokenizer/config from {encoder!r} ({error}). Offline, put that "
            f"encoder's tokenizer files and config.json in {model_dir / ENCODER_SUBDIR} or pass encoder_path=...\n"
            + weights_help()) from error
    reader = rg["DyGIEReader"](max_span_width=reader_config.get("max_span_width", model_config.get("max_span_width")),
                               token_indexers={"bert": indexer})
    embedder = rg["text_field_embedders"].BasicTextFieldEmbedder({"bert": token_embedder})
    accepted = set(inspect.signature(rg["DyGIE"].__init__).parameters) - {"self", "vocab", "embedder"}
    arguments = {key: copy.deepcopy(value) for key, value in model_config.items()
                 if key not in NON_ARGUMENT_KEYS and key in accepted}
    unknown = sorted(key for key in model_config if key not in NON_ARGUMENT_KEYS and key not in accepted)
    if unknown:
        raise RadGraphCheckpointError(f"{model_dir / 'config.json'}: model keys {unknown} are not DyGIE arguments")
    try:
        model = rg["DyGIE"](vocab=vocab, embedder=embedder, **arguments)
    except (TypeError, KeyError, AssertionError) as error:
        raise RadGraphCheckpointError(f"{model_dir / 'config.json'} does not describe a DyGIE model this code can "
                                      f"build ({type(error).__name__}: {error})") from error
    return model, reader, prefix


def _check_and_clean_state(state: Any, model: Any, weights: Path) -> dict:
    if not isinstance(state, dict) or not all(isinstance(key, str) for key in state):
        raise RadGraphCheckpointError(f"{weights} is not a state dict (got {type(state).__name__})")
    expected = model.state_dict()
    state = {key: value for key, value in state.items()
             if key in expected or not key.endswith(IGNORED_BUFFER_SUFFIXES)}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    mismatched = sorted(key for key in set(state) & set(expected)
                        if tuple(getattr(state[key], "shape", ())) != tuple(expected[key].shape))
    if missing or unexpected or mismatched:
        def show(keys: list[str]) -> str:
            return ", ".join(keys[:5]) + (f" … (+{len(keys) - 5})" if len(keys) > 5 else "")

        parts = []
        if missing:
            parts.append(f"{len(missing)} missing ({show(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected ({show(unexpected)})")
        if mismatched:
            parts.append(f"{len(mismatched)} with another shape ({show(mismatched)})")
        raise RadGraphCheckpointError(f"{weights} does not match the model described by its config.json and "
                                      f"vocabulary/: {'; '.join(parts)}. Is it a RadGraph (DyGIE++) weights.th, with "
                                      f"the encoder its config.json names?")
    return state


class RadGraphAnnotator:
    """A loaded RadGraph model: ``annotate(reports)`` -> one graph dict per report (see ``radgraph_rewards``).

    Args:
        model_dir: a model folder (``config.json``, ``weights.th``, ``vocabulary/``), as returned by
            :func:`resolve_radgraph_dir`.
        encoder_path: the encoder's tokenizer/config folder (default: see :func:`resolve_encoder`).
        model_type: ``radgraph`` (v1), ``radgraph-xl``, ``modern-radgraph-xl`` or ``echograph``; picks
            the pre-tokenization (default: from the folder name, else ``radgraph``).
        device: ``"cpu"``, ``"cuda"``, … (default: CUDA when available).
        decoding: ``"linear"`` (default): predictions become the graph in time linear in its size,
            and the relation head's pair tensor is built in blocks (``radgraph_decoding``);
            ``"package"``: radgraph 0.1.18's own decoding, unchanged (cubic in the report length; kept
            to check the linear one against).
        pair_block_bytes: with ``decoding="linear"``, the relation head's candidate-pair tensor is
            built in one piece up to this size, in row blocks of this size above it.
    """

    def __init__(self, model_dir: str | os.PathLike, encoder_path: str | os.PathLike | None = None,
                 model_type: str | None = None, device: str | None = None, decoding: str = "linear",
                 pair_block_bytes: int = radgraph_decoding.PAIR_BLOCK_BYTES) -> None:
        import torch

        if decoding not in DECODINGS:
            raise RadGraphError(f"decoding must be one of {', '.join(DECODINGS)}, got {decoding!r}")
        if not isinstance(pair_block_bytes, int) or pair_block_bytes < 1:
            raise RadGraphError(f"pair_block_bytes must be a positive number of bytes, got {pair_block_bytes!r}")
        self._rg = _import_radgraph()
        self.model_dir = Path(model_dir)
        self.model_type = infer_model_type(self.model_dir, model_type)
        config = _read_config(self.model_dir)
        self.encoder = resolve_encoder(config, self.model_dir, encoder_path)
        model, self.reader, self.dataset = build_dygie(self.model_dir, self.encoder, self.model_type)
        weights = self.model_dir / "weights.th"
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as error:  # not a torch file, or pickled objects beyond tensors
            raise RadGraphCheckpointError(f"{weights} is not a loadable torch state dict ({type(error).__name__}: "
                                          f"{error})") from error
        model.load_state_dict(_check_and_clean_state(state, model, weights), strict=True)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.decoding = decoding
        self.model = model.to(self.device).eval()
        if decoding == "linear":
            radgraph_decoding.install(self.model, self.dataset, pair_block_bytes)

    def __repr__(self) -> str:
        return (f"RadGraphAnnotator(model_dir={str(self.model_dir)!r}, model_type={self.model_type!r}, "
                f"device={str(self.device)!r})")

    def _annotate_one(self, text: str) -> dict:
        import torch

        rg = self._rg
        document = rg["utils"].preprocess_reports([text], self.model_type)[0]
        document["dataset"] = self.dataset
        if not document["sentences"][0]:
            return {"text": "", "entities": {}}
        data = rg["AllennlpDataset"]([self.reader.text_to_instance(document)])
        data.index_with(self.model.vocab)
        batches = list(rg["PyTorchDataLoader"](batch_size=1, dataset=data))
        if len(batches) != 1:
            raise RuntimeError(f"RadGraph made {len(batches)} batches of report {text[:80]!r}")
        batch = rg["utils"].batch_to_device(batches[0], self.device)
        with torch.no_grad():
            if self.decoding == "linear":
                with radgraph_decoding.paused_gc():
                    return radgraph_decoding.graph_from_output(self.model(**batch))
            output = self.model.make_output_human_readable(self.model(**batch)).to_json()
        graph = rg["utils"].postprocess_reports([output]).get(document["doc_key"])
        if graph is None:
            raise RuntimeError(f"RadGraph produced no output for report {text[:80]!r}")
        return {"text": graph["text"], "entities": graph["entities"]}

    def annotate(self, reports: Sequence[str | None], progress: bool | None = None,
                 callback: Callable[[int], None] | None = None) -> list[dict]:
        """Graphs for ``reports`` (each distinct text runs once; empty texts get an empty graph)."""
        from tqdm.auto import tqdm

        texts = ["" if report is None else str(report) for report in reports]
        unique = [text for text in dict.fromkeys(texts) if text.strip()]
        graphs: dict[str, dict] = {}
        show = progress if progress is not None else len(unique) >= 50
        for text in tqdm(unique, desc="RadGraph", unit="report", disable=not show):
            graphs[text] = self._annotate_one(text)
            if callback is not None:
                callback(1)
        handed_out: set[str] = set()  # a text given twice gets two independent graphs
        results = []
        with radgraph_decoding.paused_gc():
            for text in texts:
                if not text.strip():
                    results.append({"text": "", "entities": {}})
                elif text in handed_out:
                    results.append(copy.deepcopy(graphs[text]))
                else:
                    handed_out.add(text)
                    results.append(graphs[text])
        return results


def load_radgraph(radgraph_path: str | os.PathLike | None = None, encoder_path: str | os.PathLike | None = None,
                  model_type: str | None = None, device: str | None = None,
                  metric: str = "radgraph_f1") -> RadGraphAnnotator:
    """Resolve the model (path, ``$MEDHEVAL_RADGRAPH_PATH``, archive, ``hf://``) and load it."""
    model_dir = resolve_radgraph_dir(radgraph_path, model_type, metric)
    return RadGraphAnnotator(model_dir, encoder_path=encoder_path, model_type=model_type, device=device)


__all__ = [
    "DEFAULT_MODEL_TYPE", "MODEL_TYPES", "RADGRAPH_ENCODER_ENV", "RADGRAPH_PATH_ENV", "RadGraphAnnotator",
    "RadGraphCheckpointError", "RadGraphError", "RadGraphPackageMissing", "RadGraphWeightsMissing",
    "add_legacy_tokenizer_api", "build_dygie", "infer_model_type", "load_radgraph", "resolve_encoder",
    "resolve_radgraph_dir", "weights_help",
]
