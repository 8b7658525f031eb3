"""CheXbert (Smit et al., EMNLP 2020) from local weights: 14 CheXpert labels and the [CLS] embedding.

Architecture (``stanfordmlgroup/CheXbert`` ``src/models/bert_labeler.py``): a bert-base-uncased
encoder; the last-layer hidden state of token 0 (``[CLS]``) goes through ``Dropout(0.1)`` into
14 linear heads: 13 four-way heads (classes 0 blank, 1 positive, 2 negative, 3 uncertain) and one
two-way head for "No Finding" (0 blank, 1 positive), in :data:`medheval.labelers.CONDITIONS`
order. A label is the argmax of its head, mapped as upstream ``save_preds`` does:
``0 -> None``, ``1 -> 1``, ``2 -> 0``, ``3 -> -1``.

The embedding (:meth:`CheXbertLabeler.embed`) is what ``CXR-Report-Metric``'s
``CheXbert/src/encode.py`` returns with ``logits=False``: the raw final-layer ``[CLS]`` hidden
state, before dropout and heads, and not BERT's pooler output. Its cosine between a reference and
a generated report is "CheXbert vector similarity" (``semb_score``).

Weights: the original ``chexbert.pth`` (``{"epoch", "model_state_dict", "optimizer_state_dict"}``,
state-dict keys prefixed ``module.`` by ``nn.DataParallel``) plus a local bert-base-uncased folder
for the tokenizer (``vocab.txt`` or ``tokenizer.json``) and ``config.json``. Loading is strict: a
missing, unexpected or wrongly shaped tensor is an error that names it.

Text handling follows ``src/bert_tokenizer.py``: whitespace runs (newlines included) collapse to
one space, the text is stripped, ``[CLS] tokens [SEP]`` is cut to 512 ids by keeping the first
510 tokens, an empty report is ``[CLS] [SEP]``; batches are padded with id 0 under an attention
mask.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from medheval.labelers import CONDITIONS, Label

CHEXBERT_PATH_ENV = "MEDHEVAL_CHEXBERT_PATH"
CHEXBERT_TOKENIZER_ENV = "MEDHEVAL_CHEXBERT_TOKENIZER"

CLASS_NAMES: tuple[str, ...] = ("blank", "positive", "negative", "uncertain")  # CheXbert CLASS_MAPPING order
CLASS_TO_LABEL: dict[int, Label] = {0: None, 1: 1, 2: 0, 3: -1}
N_FOUR_WAY_HEADS = 13
MAX_LENGTH = 512
DROPOUT = 0.1
MODULE_PREFIX = "module."
# Constant buffers (arange / zeros) that transformers 3.x-4.30 wrote into state dicts; transformers 5
# keeps them out of ``state_dict()``. A checkpoint that carries them is accepted and they are ignored.
IGNORED_BUFFERS = frozenset({"bert.embeddings.position_ids", "bert.embeddings.token_type_ids"})

# bert-base-uncased's config.json values (used when the tokenizer folder has no config.json).
BERT_BASE_UNCASED = dict(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                         intermediate_size=3072, hidden_act="gelu", hidden_dropout_prob=0.1,
                         attention_probs_dropout_prob=0.1, max_position_embeddings=512, type_vocab_size=2,
                         initializer_range=0.02, layer_norm_eps=1e-12, pad_token_id=0)

TOKENIZER_FILES = ("vocab.txt", "tokenizer.json")

WEIGHTS_HELP = """\
CheXbert weights are not redistributed with this package. To get them:
  * the Stanford release: the checkpoint link in the README of https://github.com/stanfordmlgroup/CheXbert
    (https://stanfordmedicine.box.com/s/c3stck6w6dol3h36grdc97xoydzxd7w9, ~1.3 GB); its terms are in the
    repository's LICENSE.pdf, and the README points to a Stanford licence for commercial use. The model
    was trained on MIMIC-CXR reports (PhysioNet credentialed data): check those terms for your use;
  * or the same file on the Hugging Face Hub: StanfordAIMI/RRG_scorers, file chexbert.pth
    (`hf download StanfordAIMI/RRG_scorers chexbert.pth --local-dir /path/chexbert`; the Hub
    may ask you to accept its terms first).
Also put a bert-base-uncased tokenizer/config next to it (`hf download bert-base-uncased config.json
vocab.txt tokenizer.json tokenizer_config.json --local-dir /path/chexbert`), or pass its folder
separately.
Then point at the file with one of:
  Python / evaluate:  chexbert_path="/path/chexbert/chexbert.pth"
  run_eval.py:        --metric-option {metric}.chexbert_path=/path/chexbert/chexbert.pth
  environment:        export {path_env}=/path/chexbert/chexbert.pth
(tokenizer folder: tokenizer_path=..., or {tokenizer_env}=...)."""


def weights_help(metric: str = "chexbert_similarity") -> str:
    """Where to get CheXbert and how to point at it (``metric`` names the --metric-option target)."""
    return WEIGHTS_HELP.format(metric=metric, path_env=CHEXBERT_PATH_ENV, tokenizer_env=CHEXBERT_TOKENIZER_ENV)


class CheXbertError(ValueError):
    """The CheXbert weights or tokenizer are missing or do not match the expected layout."""


class CheXbertWeightsMissing(CheXbertError):
    """No CheXbert checkpoint was given, or the path does not exist."""


class CheXbertCheckpointError(CheXbertError):
    """The checkpoint file is not the original CheXbert layout (keys, shapes, container)."""


class CheXbertTokenizerMissing(CheXbertError):
    """No bert-base-uncased tokenizer/config folder could be found."""


# --------------------------------------------------------------------------------------------------
# The model


class CheXbertModel(nn.Module):
    """``bert_labeler``: BERT encoder -> [CLS] -> dropout -> 13 four-way heads + 1 two-way head.

    Parameter names match the original checkpoint after the ``module.`` prefix is stripped
    (``bert.*``, ``linear_heads.{0..13}.{weight,bias}``).
    """

    def __init__(self, config: Any, p: float = DROPOUT) -> None:
        from transformers import BertModel

        super().__init__()
        self.bert = BertModel(config, add_pooling_layer=True)  # the checkpoint holds bert.pooler.* too
        self.dropout = nn.Dropout(p)
        hidden = config.hidden_size
        heads = [nn.Linear(hidden, 4, bias=True) for _ in range(N_FOUR_WAY_HEADS)]
        heads.append(nn.Linear(hidden, 2, bias=True))  # "No Finding": blank / positive
        self.linear_heads = nn.ModuleList(heads)

    def cls_embedding(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Final-layer hidden state of token 0 (no pooler, no dropout): ``(batch, hidden)``."""
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0, :]

    def heads(self, cls_hidden: torch.Tensor) -> list[torch.Tensor]:
        """Logits of the 14 heads: 13 tensors ``(batch, 4)`` then one ``(batch, 2)``."""
        hidden = self.dropout(cls_hidden)
        return [head(hidden) for head in self.linear_heads]

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        return self.heads(self.cls_embedding(input_ids, attention_mask))


# --------------------------------------------------------------------------------------------------
# Finding the files


def resolve_chexbert_path(path: str | os.PathLike | None = None, *, what: str = "CheXbert",
                          metric: str = "chexbert_similarity") -> str:
    """The checkpoint to use: ``path``, else ``$MEDHEVAL_CHEXBERT_PATH``; a clear error when neither exists.

    ``hf://owner/repo/file.pth`` is downloaded with ``huggingface_hub`` (needs network, or the
    file already in the Hub cache).
    """
    chosen = os.fspath(path) if path not in (None, "") else os.environ.get(CHEXBERT_PATH_ENV, "")
    if not chosen:
        raise CheXbertWeightsMissing(f"{what} needs the CheXbert checkpoint (chexbert.pth), and none was given.\n"
                                     + weights_help(metric))
    if chosen.startswith("hf://"):
        return _hub_file(chosen, metric)
    resolved = Path(chosen).expanduser()
    if resolved.is_dir():
        candidate = resolved / "chexbert.pth"
        if candidate.is_file():
            return str(candidate)
        raise CheXbertWeightsMissing(f"{resolved} is a folder without chexbert.pth; pass the checkpoint file itself.\n"
                                     + weights_help(metric))
    if not resolved.is_file():
        source = "" if path not in (None, "") else f" (from ${CHEXBERT_PATH_ENV})"
        raise CheXbertWeightsMissing(f"CheXbert checkpoint not found: {resolved}{source}.\n" + weights_help(metric))
    return str(resolved)


def _hub_file(uri: str, metric: str) -> str:
    parts = uri[len("hf://"):].split("/")
    if len(parts) < 3:
        raise CheXbertWeightsMissing(f"{uri!r}: expected hf://OWNER/REPO/FILE, "
                                     f"e.g. hf://StanfordAIMI/RRG_scorers/chexbert.pth")
    from huggingface_hub import hf_hub_download

    try:
        return hf_hub_download(repo_id="/".join(parts[:2]), filename="/".join(parts[2:]))
    except Exception as error:  # offline, gated repo, missing file: one message with the way out
        raise CheXbertWeightsMissing(f"could not get {uri} from the Hugging Face Hub "
                                     f"({type(error).__name__}: {error}).\n" + weights_help(metric)) from error


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_FILES)


def resolve_tokenizer_dir(tokenizer_path: str | os.PathLike | None, checkpoint_path: str | os.PathLike) -> Path:
    """The bert-base-uncased folder: ``tokenizer_path``, else ``$MEDHEVAL_CHEXBERT_TOKENIZER``, else
    the checkpoint's folder or its ``bert-base-uncased/`` subfolder."""
    needed = (f"a bert-base-uncased folder with {' or '.join(TOKENIZER_FILES)} (and config.json), e.g. from "
              f"`hf download bert-base-uncased config.json vocab.txt tokenizer.json tokenizer_config.json "
              f"--local-dir DIR` on a networked machine")
    explicit = os.fspath(tokenizer_path) if tokenizer_path not in (None, "") else os.environ.get(CHEXBERT_TOKENIZER_ENV)
    if explicit:
        folder = Path(explicit).expanduser()
        if not folder.is_dir():
            raise CheXbertTokenizerMissing(f"CheXbert tokenizer folder not found: {folder}. Expected {needed}.")
        if not _has_tokenizer(folder):
            present = sorted(entry.name for entry in folder.iterdir())[:20]
            raise CheXbertTokenizerMissing(f"{folder} has no tokenizer file ({', '.join(TOKENIZER_FILES)}); it holds "
                                           f"{present or 'nothing'}. Expected {needed}.")
        return folder
    home = Path(checkpoint_path).expanduser().resolve().parent
    for folder in (home, home / "bert-base-uncased"):
        if folder.is_dir() and _has_tokenizer(folder):
            return folder
    raise CheXbertTokenizerMissing(
        f"CheXbert needs the bert-base-uncased tokenizer, and none was found next to the checkpoint (looked in "
        f"{home} and {home / 'bert-base-uncased'}). Put {needed} there, or pass tokenizer_path= (run_eval.py: "
        f"--metric-option <metric>.tokenizer_path=DIR; environment: {CHEXBERT_TOKENIZER_ENV}=DIR).")


def _load_config(folder: Path) -> Any:
    from transformers import BertConfig

    config_file = folder / "config.json"
    if not config_file.is_file():
        return BertConfig(**BERT_BASE_UNCASED)
    try:
        values = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as error:
        raise CheXbertTokenizerMissing(f"cannot read {config_file}: {error}") from error
    if values.get("model_type", "bert") != "bert":
        raise CheXbertCheckpointError(f"{config_file} describes a {values.get('model_type')!r} model; CheXbert is a "
                                      f"BERT (bert-base-uncased) model.")
    return BertConfig.from_json_file(str(config_file))


# --------------------------------------------------------------------------------------------------
# Strict checkpoint loading


def _describe(keys: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return f"{shown}, … ({len(keys)} in all)" if len(keys) > limit else shown


def read_state_dict(checkpoint_path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The ``model_state_dict`` of a CheXbert checkpoint with the ``module.`` prefix stripped."""
    path = Path(checkpoint_path)
    try:
        try:  # memory-mapped: the optimizer state in the original file (~2/3 of its 1.3 GB) is never read
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as error:
            if "mmap" not in str(error):
                raise
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # legacy (pre-zip) format
    except Exception as error:  # not a torch file, truncated, or pickled objects beyond tensors/containers
        raise CheXbertCheckpointError(
            f"cannot read {path} as a PyTorch checkpoint ({type(error).__name__}: {str(error).splitlines()[0][:300]}). "
            f"Expected the original CheXbert chexbert.pth (a dict with 'model_state_dict').") from error
    if not isinstance(checkpoint, Mapping) or "model_state_dict" not in checkpoint:
        found = sorted(map(str, checkpoint))[:10] if isinstance(checkpoint, Mapping) else type(checkpoint).__name__
        raise CheXbertCheckpointError(
            f"{path} has no 'model_state_dict' (found: {found}). Expected the original CheXbert chexbert.pth: "
            f"{{'epoch', 'model_state_dict', 'optimizer_state_dict'}} with keys like "
            f"'module.bert.embeddings.word_embeddings.weight' and 'module.linear_heads.13.weight'.")
    raw = checkpoint["model_state_dict"]
    if not isinstance(raw, Mapping) or not all(isinstance(value, torch.Tensor) for value in raw.values()):
        raise CheXbertCheckpointError(f"{path}: 'model_state_dict' is not a mapping of tensors.")
    prefixed = [key for key in raw if key.startswith(MODULE_PREFIX)]
    if prefixed and len(prefixed) != len(raw):
        plain = [key for key in raw if not key.startswith(MODULE_PREFIX)]
        raise CheXbertCheckpointError(f"{path}: some keys have the 'module.' prefix and some do not "
                                      f"(without: {_describe(plain)}); expected all of them prefixed.")
    strip = len(MODULE_PREFIX) if prefixed else 0
    return {key[strip:]: value for key, value in raw.items()}


def check_state_dict(state: Mapping[str, torch.Tensor], model: nn.Module, checkpoint_path: str,
                     config_source: str) -> None:
    """Raise :class:`CheXbertCheckpointError` naming every missing, unexpected and misshaped tensor."""
    expected = model.state_dict()
    missing = [key for key in expected if key not in state]
    unexpected = [key for key in state if key not in expected and key not in IGNORED_BUFFERS]
    misshaped = [f"{key} {tuple(state[key].shape)} (model: {tuple(value.shape)})"
                 for key, value in expected.items() if key in state and state[key].shape != value.shape]
    if not (missing or unexpected or misshaped):
        return
    problems = []
    if missing:
        problems.append(f"missing keys: {_describe(missing)}")
    if unexpected:
        problems.append(f"unexpected keys: {_describe(unexpected)}")
    if misshaped:
        problems.append(f"wrong shapes (checkpoint vs model): {_describe(misshaped, 4)}")
    raise CheXbertCheckpointError(
        f"{checkpoint_path} does not match the CheXbert architecture built from {config_source} — "
        + "; ".join(problems)
        + ". Expected the original CheXbert chexbert.pth (bert-base-uncased encoder 'module.bert.*', 13 four-way "
          "heads 'module.linear_heads.0-12' and a two-way 'No Finding' head 'module.linear_heads.13') and the "
          "bert-base-uncased config.json. Nothing was loaded: a mismatched checkpoint is never loaded partially.")


# --------------------------------------------------------------------------------------------------
# The labeler


def preprocess(report: str | None) -> str:
    """CheXbert's text clean-up: whitespace (newlines included) collapsed to single spaces, stripped."""
    return " ".join(str(report).split()) if report is not None else ""


class CheXbertLabeler:
    """CheXbert from a local ``chexbert.pth``: :meth:`label` (14 CheXpert values) and :meth:`embed` ([CLS]).

    Args:
        checkpoint_path: the original ``chexbert.pth`` (``hf://StanfordAIMI/RRG_scorers/chexbert.pth``
            also works where the Hub can be reached).
        tokenizer_path: a local bert-base-uncased folder (``vocab.txt`` or ``tokenizer.json``, and
            ``config.json``; without ``config.json`` bert-base-uncased's values are used). Default:
            ``$MEDHEVAL_CHEXBERT_TOKENIZER``, else the checkpoint's folder or its ``bert-base-uncased/``.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` … (default: CUDA when available).
        batch_size: reports per forward pass (reports are sorted by length to reduce padding).
        progress: show a tqdm bar (default: only for more than 16 batches).
    """

    name = "chexbert"

    def __init__(self, checkpoint_path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
                 device: str | torch.device | None = None, batch_size: int = 32,
                 progress: bool | None = None) -> None:
        from transformers import BertTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.checkpoint_path = resolve_chexbert_path(checkpoint_path)
        self.tokenizer_dir = resolve_tokenizer_dir(tokenizer_path, self.checkpoint_path)
        self.batch_size = batch_size
        self.progress = progress
        self.device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = BertTokenizer.from_pretrained(str(self.tokenizer_dir))
        config = _load_config(self.tokenizer_dir)
        config_source = str(self.tokenizer_dir / "config.json") if (self.tokenizer_dir / "config.json").is_file() \
            else "bert-base-uncased's default config (no config.json in " + str(self.tokenizer_dir) + ")"
        state = read_state_dict(self.checkpoint_path)
        model = CheXbertModel(config)
        check_state_dict(state, model, self.checkpoint_path, config_source)
        model.load_state_dict({key: value for key, value in state.items() if key not in IGNORED_BUFFERS}, strict=True)
        del state
        self.model = model.to(self.device).eval()
        self.config = config
        self.hidden_size = config.hidden_size
        self.max_length = min(MAX_LENGTH, config.max_position_embeddings)
        if self.tokenizer.vocab_size > config.vocab_size:
            raise CheXbertCheckpointError(f"the tokenizer in {self.tokenizer_dir} has {self.tokenizer.vocab_size} "
                                          f"tokens but the model only {config.vocab_size}; use the bert-base-uncased "
                                          f"tokenizer that matches the checkpoint.")

    def __repr__(self) -> str:
        return (f"CheXbertLabeler(checkpoint_path={self.checkpoint_path!r}, tokenizer_dir={str(self.tokenizer_dir)!r}, "
                f"device={str(self.device)!r}, hidden_size={self.hidden_size})")

    # -- encoding ---------------------------------------------------------------------------------

    def encode(self, reports: Sequence[str | None]) -> list[list[int]]:
        """Token ids per report: ``[CLS] tokens [SEP]``, at most 512 ids (first 510 tokens kept)."""
        texts = [preprocess(report) for report in reports]
        if not texts:
            return []
        return self.tokenizer(texts, add_special_tokens=True, truncation=True, max_length=self.max_length,
                              return_attention_mask=False, return_token_type_ids=False)["input_ids"]

    def _batches(self, ids: list[list[int]], batch_size: int):
        """(positions, input_ids, attention_mask) per batch, longest reports first."""
        order = sorted(range(len(ids)), key=lambda index: len(ids[index]), reverse=True)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        for start in range(0, len(order), batch_size):
            positions = order[start:start + batch_size]
            width = len(ids[positions[0]])
            input_ids = torch.full((len(positions), width), pad, dtype=torch.long)
            attention_mask = torch.zeros((len(positions), width), dtype=torch.long)
            for row, index in enumerate(positions):
                length = len(ids[index])
                input_ids[row, :length] = torch.tensor(ids[index], dtype=torch.long)
                attention_mask[row, :length] = 1
            yield positions, input_ids.to(self.device), attention_mask.to(self.device)

    def _run(self, reports: Sequence[str | None], batch_size: int | None, want_labels: bool,
             want_embeddings: bool) -> tuple[list[list[Label]] | None, torch.Tensor | None]:
        if isinstance(reports, str):
            raise TypeError("pass a list of reports, not a single string")
        ids = self.encode(reports)
        size = batch_size or self.batch_size
        n_batches = (len(ids) + size - 1) // size
        show = self.progress if self.progress is not None else n_batches > 16
        labels: list[list[Label] | None] = [None] * len(ids)
        embeddings = torch.empty((len(ids), self.hidden_size), dtype=torch.float32) if want_embeddings else None
        from tqdm.auto import tqdm

        with torch.inference_mode():
            for positions, input_ids, attention_mask in tqdm(self._batches(ids, size), total=n_batches,
                                                             disable=not show, desc="CheXbert", unit="batch"):
                cls_hidden = self.model.cls_embedding(input_ids, attention_mask)
                if embeddings is not None:
                    embeddings[positions] = cls_hidden.float().cpu()
                if want_labels:
                    classes = torch.stack([logits.argmax(dim=1) for logits in self.model.heads(cls_hidden)], dim=1)
                    for row, index in enumerate(classes.cpu().tolist()):
                        labels[positions[row]] = [CLASS_TO_LABEL[value] for value in index]
        return (labels if want_labels else None), embeddings  # type: ignore[return-value]

    # -- public API -------------------------------------------------------------------------------

    def label(self, reports: Sequence[str | None], batch_size: int | None = None) -> list[list[Label]]:
        """14 values per report in :data:`CONDITIONS` order: 1, 0, -1 or None ("No Finding": 1 or None)."""
        return self._run(reports, batch_size, want_labels=True, want_embeddings=False)[0]  # type: ignore[return-value]

    def embed(self, reports: Sequence[str | None], batch_size: int | None = None) -> torch.Tensor:
        """Final-layer [CLS] hidden states, ``(len(reports), hidden_size)`` float32 on the CPU."""
        return self._run(reports, batch_size, want_labels=False, want_embeddings=True)[1]  # type: ignore[return-value]

    def label_and_embed(self, reports: Sequence[str | None],
                        batch_size: int | None = None) -> tuple[list[list[Label]], torch.Tensor]:
        """Both in one pass over the encoder."""
        return self._run(reports, batch_size, want_labels=True, want_embeddings=True)  # type: ignore[return-value]

    def label_dicts(self, reports: Sequence[str | None], batch_size: int | None = None) -> list[dict[str, Label]]:
        """:meth:`label` as ``{condition: value}`` per report."""
        return [dict(zip(CONDITIONS, row)) for row in self.label(reports, batch_size)]


@functools.lru_cache(maxsize=4)
def _cached_labeler(checkpoint: str, stamp: tuple[int, int], tokenizer: str | None,
                    device: str | None) -> CheXbertLabeler:
    return CheXbertLabeler(checkpoint, tokenizer_path=tokenizer, device=device)


def get_chexbert_labeler(checkpoint_path: str | os.PathLike | None = None,
                         tokenizer_path: str | os.PathLike | None = None,
                         device: str | None = None) -> CheXbertLabeler:
    """A process-wide shared :class:`CheXbertLabeler` (loaded once per checkpoint/tokenizer/device).

    ``checkpoint_path`` defaults to ``$MEDHEVAL_CHEXBERT_PATH``; a replaced file (new mtime or
    size) is loaded again. Metrics use this so a run loads CheXbert once, not once per call.
    """
    checkpoint = resolve_chexbert_path(checkpoint_path)
    stat = os.stat(checkpoint)
    tokenizer = (os.fspath(tokenizer_path) if tokenizer_path not in (None, "")
                 else os.environ.get(CHEXBERT_TOKENIZER_ENV))
    return _cached_labeler(os.path.realpath(checkpoint), (stat.st_mtime_ns, stat.st_size),
                           os.path.realpath(tokenizer) if tokenizer else None, device)


# --------------------------------------------------------------------------------------------------
# A tiny random checkpoint with the real layout (tests, docs, benchmarks)

DEFAULT_VOCAB_WORDS: tuple[str, ...] = (
    "no", "acute", "cardiopulmonary", "process", "abnormality", "pleural", "effusion", "effusions", "pneumothorax",
    "cardiomegaly", "heart", "size", "is", "are", "normal", "enlarged", "mildly", "mild", "moderate", "severe",
    "large", "small", "left", "right", "bilateral", "lung", "lungs", "clear", "there", "the", "a", "and", "or", "of",
    "with", "without", "evidence", "edema", "pulmonary", "vascular", "congestion", "consolidation", "pneumonia",
    "atelectasis", "basilar", "opacity", "opacities", "lesion", "nodule", "mass", "fracture", "rib", "fractures",
    "tube", "line", "catheter", "pacemaker", "support", "device", "devices", "in", "place", "stable", "unchanged",
    "new", "since", "prior", "may", "possible", "likely", "cannot", "be", "excluded", "not", "seen", "identified",
    "cardiomediastinal", "silhouette", "contour", "within", "limits", "thickening", "findings", "impression",
    "##s", "##ed", "##ing", "##ly", ".", ",", ":", ";", "-", "(", ")", "1", "2", "3",
)
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def build_random_chexbert(directory: str | os.PathLike, hidden_size: int = 32, layers: int = 2, heads: int = 2,
                          vocab_words: Sequence[str] = DEFAULT_VOCAB_WORDS, intermediate_size: int | None = None,
                          seed: int = 0, head_classes: Sequence[int] | None = None) -> Path:
    """Write a tiny random-weight CheXbert to ``directory``; returns the ``chexbert.pth`` path.

    The files have the real layout: ``chexbert.pth`` is ``{"epoch", "model_state_dict",
    "optimizer_state_dict"}`` with ``module.``-prefixed keys (as ``nn.DataParallel`` saved them),
    next to a matching ``config.json`` and a WordPiece ``vocab.txt``. Weights are random (seeded;
    the global RNG is left untouched): the labels and embeddings mean nothing.

    ``head_classes`` (14 class indices) zeroes the head weights and sets their biases so every
    report gets exactly those classes (to test the class -> label mapping through the real file).
    """
    from transformers import BertConfig

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = list(SPECIAL_TOKENS) + [word for word in dict.fromkeys(vocab_words) if word not in SPECIAL_TOKENS]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    config = BertConfig(vocab_size=len(vocab), hidden_size=hidden_size, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=intermediate_size or 4 * hidden_size,
                        max_position_embeddings=MAX_LENGTH, type_vocab_size=2, pad_token_id=0)
    config.save_pretrained(str(folder))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CheXbertModel(config)
        if head_classes is not None:
            if len(head_classes) != len(CONDITIONS):
                raise ValueError(f"head_classes needs {len(CONDITIONS)} class indices, got {len(head_classes)}")
            with torch.no_grad():
                for head, cls in zip(model.linear_heads, head_classes):
                    if not 0 <= cls < head.out_features:
                        raise ValueError(f"class {cls} out of range for a {head.out_features}-way head")
                    head.weight.zero_()
                    head.bias.fill_(-1.0)
                    head.bias[cls] = 1.0
    optimizer = torch.optim.Adam(model.parameters())
    checkpoint = {"epoch": 1,
                  "model_state_dict": {MODULE_PREFIX + key: value.clone() for key, value in model.state_dict().items()},
                  "optimizer_state_dict": optimizer.state_dict()}
    path = folder / "chexbert.pth"
    torch.save(checkpoint, path)
    return path


__all__ = [
    "CHEXBERT_PATH_ENV", "CHEXBERT_TOKENIZER_ENV", "CLASS_NAMES", "CLASS_TO_LABEL", "CheXbertCheckpointError",
    "CheXbertError", "CheXbertLabeler", "CheXbertModel", "CheXbertTokenizerMissing", "CheXbertWeightsMissing",
    "WEIGHTS_HELP", "build_random_chexbert", "check_state_dict", "get_chexbert_labeler", "preprocess",
    "read_state_dict", "resolve_chexbert_path", "resolve_tokenizer_dir", "weights_help",
]
