"""RaTEScore's two models, loaded with transformers from user-given paths, and the scoring pipeline around them.

The pipeline is RaTEScore's (``RaTEScore/scorer.py``, ``score.py``, ``utils.py``; 0.5.0 and 0.6.0
share it):

1. each report is split into sentences (medspacy's PyRuSH when installed, as upstream; otherwise a
   dependency-free rule splitter, see ``ratescore_scoring.split_sentences_rules``); sentences with
   no word or under 3 characters are dropped;
2. the NER model (``AutoModelForTokenClassification``; upstream ``Angelakeke/RaTE-NER-Deberta``)
   tags each sentence (``max_length=512``, truncated), argmax per token, tags from the checkpoint's
   ``config.id2label``; spans by ``decode_bio`` (the package's ``post_process``); the entity text is
   ``tokenizer.convert_tokens_to_string`` of the span's tokens; a report's entities are those of
   its sentences in order;
3. the synonym encoder (``AutoModel``; upstream ``FremyCompany/BioLORD-2023-C``) embeds each entity
   text (``max_length=30``, truncated) as its last-layer first-token (CLS) hidden state;
4. ``ratescore_scoring.pair_score`` per report pair.

Batching differs from upstream (sentences and distinct entity strings are batched across the whole
call; upstream runs the NER one sentence at a time by default and embeds per report). Tags are
read only over each sentence's own tokens, which is what upstream's default ``batch_size=1`` does,
so the entities are the same; embeddings agree to float rounding.

**Model folders**: the NER folder is a token-classification checkpoint whose ``id2label`` holds
``O`` and ``B-``/``I-`` tags over the five RaTEScore entity types; the embedding folder is any
encoder ``AutoModel`` loads (BioLORD-2023-C's sentence-transformers repo root works as it is). A Hub
id is accepted too and resolved by transformers (network or the Hugging Face cache).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from medheval.radiology import ratescore_scoring as scoring

RATESCORE_NER_ENV = "MEDHEVAL_RATESCORE_NER_PATH"
RATESCORE_EMBEDDING_ENV = "MEDHEVAL_RATESCORE_EMBEDDING_PATH"
NER_HUB_ID = "Angelakeke/RaTE-NER-Deberta"
EMBEDDING_HUB_ID = "FremyCompany/BioLORD-2023-C"
SENTENCE_SPLITTERS = ("auto", "medspacy", "rules")
NER_MAX_LENGTH = 512
ENTITY_MAX_LENGTH = 30

MODELS_HELP = """\
RaTEScore needs two models, which are not redistributed with this package:
  * the entity recognizer {ner_hub} (token classification):
      hf download {ner_hub} --local-dir /models/rate-ner
  * the synonym encoder {emb_hub}:
      hf download {emb_hub} --local-dir /models/biolord-2023-c
Point at them with one of:
  Python / evaluate:  ner_model_path="/models/rate-ner", embedding_model_path="/models/biolord-2023-c"
  run_eval.py:        --metric-option {metric}.ner_model_path=/models/rate-ner
                      --metric-option {metric}.embedding_model_path=/models/biolord-2023-c
  environment:        export {ner_env}=/models/rate-ner {emb_env}=/models/biolord-2023-c
(a Hub id such as {ner_hub} also works where the Hub or its cache can be reached)."""


class RaTEScoreError(ValueError):
    """A RaTEScore setup problem the user can fix (shown as one message)."""


class RaTEScoreWeightsMissing(RaTEScoreError):
    """A model path was not given or does not exist."""


class RaTEScoreCheckpointError(RaTEScoreError):
    """A given folder is not the kind of model RaTEScore needs."""


def models_help(metric: str = "ratescore") -> str:
    return MODELS_HELP.format(ner_hub=NER_HUB_ID, emb_hub=EMBEDDING_HUB_ID, metric=metric,
                              ner_env=RATESCORE_NER_ENV, emb_env=RATESCORE_EMBEDDING_ENV)


# --------------------------------------------------------------------------------------------------
# Finding and loading the models


def resolve_model_path(path: str | os.PathLike | None, env: str, option: str, what: str,
                       metric: str = "ratescore") -> str:
    """``path``, else ``$env``; a local folder must hold ``config.json``; ``owner/name`` is taken as a Hub id."""
    chosen = os.fspath(path) if path not in (None, "") else os.environ.get(env, "")
    if not chosen:
        raise RaTEScoreWeightsMissing(f"RaTEScore needs the {what} ({option}), and none was given.\n"
                                      + models_help(metric))
    local = Path(chosen).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise RaTEScoreCheckpointError(f"{option}: {local} has no config.json; expected a transformers model "
                                           f"folder ({what}).\n" + models_help(metric))
        return str(local)
    if local.exists():
        raise RaTEScoreCheckpointError(f"{option}: {local} is a file; expected a transformers model folder ({what})")
    looks_like_hub_id = chosen.count("/") == 1 and not chosen.startswith((".", "/", "~")) and "\\" not in chosen
    if not looks_like_hub_id:
        source = "" if path not in (None, "") else f" (from ${env})"
        raise RaTEScoreWeightsMissing(f"{option}: {local} not found{source}.\n" + models_help(metric))
    return chosen


def _from_pretrained(loader: Callable[..., Any], location: str, option: str, what: str) -> Any:
    local = Path(location).is_dir()
    try:
        return loader(location, local_files_only=local)
    except Exception as error:  # missing files, unreadable weights, unknown architecture: one clear message
        kind = RaTEScoreWeightsMissing if isinstance(error, OSError) and not local else RaTEScoreCheckpointError
        raise kind(f"{option}: cannot load the {what} from {location!r} "
                                       f"({type(error).__name__}: {error}).\n" + models_help()) from error


def validate_ner_labels(config: Any, location: str, affinity_types: Sequence[str]) -> dict[int, str]:
    """``id2label`` of a RaTE NER checkpoint: ``O`` plus ``B-``/``I-`` tags over the affinity matrix's types."""
    architectures = list(getattr(config, "architectures", None) or [])
    if architectures and not any(name.endswith("ForTokenClassification") for name in architectures):
        raise RaTEScoreCheckpointError(f"ner_model_path: {location} is a {', '.join(architectures)} checkpoint, not a "
                                       f"token-classification (NER) model such as {NER_HUB_ID}")
    id2label = {int(index): str(label) for index, label in (getattr(config, "id2label", None) or {}).items()}
    bad = sorted({label for label in id2label.values()
                  if label != "O" and not (label[:2] in ("B-", "I-") and label[2:] in affinity_types)})
    if bad or not any(label.startswith("B-") for label in id2label.values()):
        raise RaTEScoreCheckpointError(
            f"ner_model_path: {location} has labels {sorted(id2label.values())[:12]}; a RaTE NER model tags O and "
            f"B-/I- over {', '.join(affinity_types)} (unexpected: {bad[:6] or 'no B- tags'})")
    return id2label


_MEDSPACY_NLP: Any = None


def medspacy_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("medspacy") is not None


def _medspacy_nlp() -> Any:
    global _MEDSPACY_NLP
    if _MEDSPACY_NLP is None:
        try:
            import medspacy
        except ImportError as error:
            raise RaTEScoreError(f"sentence_splitter='medspacy' needs medspacy ({error}); install medspacy (with "
                                 f"spaCy), or use sentence_splitter='rules'") from error
        try:
            from loguru import logger

            logger.disable("PyRuSH")  # PyRuSH logs every token at DEBUG level
        except ImportError:  # pragma: no cover - loguru comes with PyRuSH
            pass
        # the components RaTEScore's score.py enables
        _MEDSPACY_NLP = medspacy.load(medspacy_enable=["medspacy_pyrush", "medspacy_context"])
    return _MEDSPACY_NLP


def make_sentence_splitter(name: str = "auto") -> tuple[str, Callable[[str], list[str]]]:
    """``(resolved name, split)``: ``medspacy`` (upstream), ``rules`` (built in), ``auto`` (medspacy if installed)."""
    if name not in SENTENCE_SPLITTERS:
        raise RaTEScoreError(f"sentence_splitter must be one of {', '.join(SENTENCE_SPLITTERS)}, got {name!r}")
    if name == "auto":
        name = "medspacy" if medspacy_available() else "rules"
    if name == "rules":
        return name, scoring.split_sentences_rules
    nlp = _medspacy_nlp()

    def split(text: str) -> list[str]:
        sentences = (str(sentence).strip() for sentence in nlp(text or "").sents)
        return [sentence for sentence in sentences if scoring.keep_sentence(sentence)]

    return name, split


# --------------------------------------------------------------------------------------------------
# The scorer


class RaTEScorer:
    """RaTEScore's NER and synonym models, loaded once; :meth:`score` runs the whole pipeline.

    Args:
        ner_model_path: the NER checkpoint folder (or Hub id); default ``$MEDHEVAL_RATESCORE_NER_PATH``.
        embedding_model_path: the synonym encoder folder (or Hub id); default
            ``$MEDHEVAL_RATESCORE_EMBEDDING_PATH``.
        device: ``"cpu"``, ``"cuda"``, … (default: CUDA when available).
        affinity_types: the entity types the NER labels may use (default: RaTEScore's five).
    """

    def __init__(self, ner_model_path: str | os.PathLike | None = None,
                 embedding_model_path: str | os.PathLike | None = None, device: str | None = None,
                 affinity_types: Sequence[str] = scoring.ENTITY_TYPES) -> None:
        import torch
        import transformers

        self.ner_location = resolve_model_path(ner_model_path, RATESCORE_NER_ENV, "ner_model_path",
                                               f"entity recognizer ({NER_HUB_ID})")
        self.embedding_location = resolve_model_path(embedding_model_path, RATESCORE_EMBEDDING_ENV,
                                                     "embedding_model_path", f"synonym encoder ({EMBEDDING_HUB_ID})")
        ner_config = _from_pretrained(transformers.AutoConfig.from_pretrained, self.ner_location, "ner_model_path",
                                      "NER model config")
        self.id2label = validate_ner_labels(ner_config, self.ner_location, affinity_types)
        self.ner_tokenizer = _from_pretrained(transformers.AutoTokenizer.from_pretrained, self.ner_location,
                                              "ner_model_path", "NER tokenizer")
        self.ner_model = _from_pretrained(transformers.AutoModelForTokenClassification.from_pretrained,
                                          self.ner_location, "ner_model_path", "NER model")
        self.embedding_tokenizer = _from_pretrained(transformers.AutoTokenizer.from_pretrained,
                                                    self.embedding_location, "embedding_model_path",
                                                    "synonym encoder tokenizer")
        self.embedding_model = _from_pretrained(transformers.AutoModel.from_pretrained, self.embedding_location,
                                                "embedding_model_path", "synonym encoder")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.ner_model.to(self.device).eval()
        self.embedding_model.to(self.device).eval()

    def __repr__(self) -> str:
        return (f"RaTEScorer(ner={self.ner_location!r}, embedding={self.embedding_location!r}, "
                f"device={str(self.device)!r})")

    def _tag_sentences(self, sentences: list[str], batch_size: int) -> list[list[tuple[str, str]]]:
        import torch

        tokenizer, model = self.ner_tokenizer, self.ner_model
        entities: list[list[tuple[str, str]]] = []
        for start in range(0, len(sentences), batch_size):
            batch = sentences[start:start + batch_size]
            encoded = tokenizer(batch, max_length=NER_MAX_LENGTH, padding=True, truncation=True, return_tensors="pt")
            with torch.no_grad():
                logits = model(**encoded.to(self.device)).logits
            predicted = logits.argmax(dim=-1).cpu()
            mask = encoded["attention_mask"].cpu().bool()
            ids = encoded["input_ids"].cpu()
            for row in range(len(batch)):
                tokens = tokenizer.convert_ids_to_tokens(ids[row][mask[row]].tolist())
                labels = [self.id2label[int(index)] for index in predicted[row][mask[row]].tolist()]
                entities.append([(tokenizer.convert_tokens_to_string(tokens[s:e + 1]), entity_type)
                                 for s, e, entity_type in scoring.decode_bio(tokens, labels)])
        return entities

    def extract_entities(self, reports: Sequence[str], split: Callable[[str], list[str]],
                         batch_size: int = 16) -> tuple[list[list[tuple[str, str]]], int]:
        """Per report, its ``(entity text, type)`` list; also the number of sentences tagged."""
        owners: list[int] = []
        sentences: list[str] = []
        for index, report in enumerate(reports):
            for sentence in split(report or ""):
                owners.append(index)
                sentences.append(sentence)
        per_report: list[list[tuple[str, str]]] = [[] for _ in reports]
        for owner, found in zip(owners, self._tag_sentences(sentences, batch_size)):
            per_report[owner].extend(found)
        return per_report, len(sentences)

    def embed(self, texts: Sequence[str], batch_size: int = 64) -> dict[str, Any]:
        """Entity text -> CLS embedding (1-d float tensor on CPU); each distinct text once."""
        import torch

        unique = list(dict.fromkeys(texts))
        vectors: dict[str, Any] = {}
        for start in range(0, len(unique), batch_size):
            batch = unique[start:start + batch_size]
            encoded = self.embedding_tokenizer(batch, truncation=True, padding=True, max_length=ENTITY_MAX_LENGTH,
                                               return_tensors="pt")
            with torch.no_grad():
                hidden = self.embedding_model(**encoded.to(self.device)).last_hidden_state[:, 0, :].float().cpu()
            vectors.update(zip(batch, hidden))
        return vectors

    def _embed_report(self, report: list[tuple[str, str]]) -> Any:
        """Upstream's ``process_embedding``: one padded batch holding exactly this report's entities."""
        import torch

        if not report:
            return torch.zeros(0, 1)
        encoded = self.embedding_tokenizer([text for text, _ in report], truncation=True, padding=True,
                                           max_length=ENTITY_MAX_LENGTH, return_tensors="pt")
        with torch.no_grad():
            return self.embedding_model(**encoded.to(self.device)).last_hidden_state[:, 0, :].float().cpu()

    def score(self, predictions: Sequence[str], references: Sequence[str], affinity: scoring.Affinity,
              split: Callable[[str], list[str]], batch_size: int = 16, upstream_batching: bool = False,
              progress: bool | None = None) -> dict[str, Any]:
        """Per pair: ``score``, ``ref_to_pred``, ``pred_to_ref``, entities of both sides; plus ``n_sentences``.

        ``upstream_batching=True`` batches as the package does (one sentence per NER call, one
        embedding batch per report), which makes the numbers bit-identical to it; the default
        batches ``batch_size`` sentences and each distinct entity text once (faster; the same up to
        float rounding, which can only matter for near-tied matches).
        """
        import torch
        from tqdm.auto import tqdm

        n = len(predictions)
        entities, n_sentences = self.extract_entities(list(predictions) + list(references), split,
                                                      1 if upstream_batching else batch_size)
        vectors = {} if upstream_batching else self.embed([text for report in entities for text, _ in report])

        def stack(report: list[tuple[str, str]]) -> Any:
            if upstream_batching:
                return self._embed_report(report)
            return torch.stack([vectors[text] for text, _ in report]) if report else torch.zeros(0, 1)

        rows = []
        show = progress if progress is not None else n >= 200
        for generated, reference in tqdm(zip(entities[:n], entities[n:]), total=n, desc="RaTEScore", disable=not show):
            row = scoring.pair_score(stack(generated), stack(reference), [t for _, t in generated],
                                     [t for _, t in reference], affinity)
            row["prediction_entities"], row["reference_entities"] = generated, reference
            rows.append(row)
        return {"rows": rows, "n_sentences": n_sentences}


__all__ = [
    "EMBEDDING_HUB_ID", "NER_HUB_ID", "RATESCORE_EMBEDDING_ENV", "RATESCORE_NER_ENV", "RaTEScoreCheckpointError",
    "RaTEScoreError", "RaTEScoreWeightsMissing", "RaTEScorer", "SENTENCE_SPLITTERS", "make_sentence_splitter",
    "medspacy_available", "models_help", "resolve_model_path", "validate_ner_labels",
]
