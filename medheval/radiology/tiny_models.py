"""Tiny random-weight models with the real layouts, for tests, docs and demos (the numbers mean nothing).

:func:`write_tiny_bert` writes a folder that ``from_pretrained`` loads like a real checkpoint: ``config.json``,
``model.safetensors``, a WordPiece ``vocab.txt`` and the tokenizer files. The vocabulary holds the
single letters and digits (plus ``##`` forms) so any lower-case text tokenizes without ``[UNK]``,
and a few radiology words. The global RNG is left untouched (seeded in a forked RNG).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

RADIOLOGY_WORDS: tuple[str, ...] = (
    "no", "acute", "cardiopulmonary", "process", "abnormality", "pleural", "effusion", "pneumothorax", "cardiomegaly",
    "heart", "size", "is", "normal", "enlarged", "mild", "moderate", "small", "large", "left", "right", "bilateral",
    "lung", "lungs", "clear", "there", "the", "and", "or", "of", "with", "in", "edema", "pulmonary", "vascular",
    "consolidation", "pneumonia", "atelectasis", "basilar", "opacity", "opacities", "nodule", "tube", "stable",
    "unchanged", "since", "prior", "et", "terminates", "cm", "above", "carina", "evidence", "hiatal", "hernia",
    ".", ",", ":", ";", "-", "/", "(", ")", "##s", "##ed", "##ing",
)
SPECIAL_TOKENS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_tiny_bert(folder: str | os.PathLike, architecture: str = "BertModel",
                    id2label: Mapping[int, str] | None = None, vocab_words: Iterable[str] = RADIOLOGY_WORDS,
                    hidden_size: int = 16, layers: int = 1, heads: int = 2, seed: int = 0) -> Path:
    """A tiny random BERT saved with ``save_pretrained`` (``BertModel`` or ``BertForTokenClassification``)."""
    import torch
    import transformers

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    characters = "abcdefghijklmnopqrstuvwxyz0123456789"
    words = list(dict.fromkeys([*SPECIAL_TOKENS, *characters, *(f"##{c}" for c in characters), *vocab_words]))
    (folder / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    transformers.BertTokenizer(vocab=str(folder / "vocab.txt"), do_lower_case=True).save_pretrained(str(folder))
    extra = {}
    if id2label is not None:
        extra = {"id2label": {int(k): v for k, v in id2label.items()},
                 "label2id": {v: int(k) for k, v in id2label.items()}}
    config = transformers.BertConfig(vocab_size=len(words), hidden_size=hidden_size, num_hidden_layers=layers,
                                     num_attention_heads=heads, intermediate_size=2 * hidden_size,
                                     max_position_embeddings=512, pad_token_id=0, **extra)
    model_class = getattr(transformers, architecture)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model_class(config).save_pretrained(str(folder))
    return folder


# --------------------------------------------------------------------------------------------------
# RadGraph (DyGIE++) model folder

V1_ENTITY_LABELS: tuple[str, ...] = ("ANAT-DP", "OBS-DP", "OBS-U", "OBS-DA")
RELATION_LABELS: tuple[str, ...] = ("modify", "located_at", "suggestive_of")
ENCODER_HUB_NAME = "microsoft/BiomedNLP-PubMedBERT-base-uncased-abstract-fulltext"


def tiny_dygie_config(encoder_name: str = ENCODER_HUB_NAME, max_span_width: int = 8, feature_size: int = 8,
                      hidden_dims: int = 16) -> dict:
    """A DyGIE config.json shaped like the RadGraph archives' (dygiepp template values, smaller widths)."""
    bert = {"type": "pretrained_transformer_mismatched", "model_name": encoder_name, "max_length": 512}
    return {
        "dataset_reader": {"type": "dygie", "max_span_width": max_span_width, "token_indexers": {"bert": dict(bert)}},
        "model": {
            "type": "dygie",
            "embedder": {"token_embedders": {"bert": dict(bert)}},
            "initializer": {"regexes": [["_span_width_embedding.weight", {"type": "xavier_normal"}]]},
            "module_initializer": {"regexes": [[".*weight", {"type": "xavier_normal"}],
                                               [".*weight_matrix", {"type": "xavier_normal"}]]},
            "feature_size": feature_size,
            "max_span_width": max_span_width,
            "target_task": "relation",
            "feedforward_params": {"num_layers": 2, "hidden_dims": hidden_dims, "dropout": 0.4},
            "loss_weights": {"ner": 1.0, "relation": 1.0, "coref": 0.0, "events": 0.0},
            "modules": {
                "coref": {"spans_per_word": 0.3, "max_antecedents": 100, "coref_prop": 0},
                "ner": {},
                "relation": {"spans_per_word": 0.5},
                "events": {"trigger_spans_per_word": 0.3, "argument_spans_per_word": 0.8,
                           "loss_weights": {"trigger": 1.0, "arguments": 1.0}},
            },
        },
    }


def build_random_radgraph(directory: str | os.PathLike, model_type: str = "radgraph", seed: int = 0,
                          entity_labels: Sequence[str] = V1_ENTITY_LABELS,
                          relation_labels: Sequence[str] = RELATION_LABELS,
                          encoder_name: str = ENCODER_HUB_NAME, hidden_size: int = 16, feature_size: int = 8,
                          hidden_dims: int = 16) -> Path:
    """Write a tiny random-weight RadGraph model folder with the real layout; returns the folder.

    ``hidden_size`` (encoder), ``feature_size`` (span-width embedding) and ``hidden_dims`` (head
    feed-forwards) set the widths; 768 / 20 / 150 give the real models' head sizes.

    ``config.json`` names the encoder by its Hub id (as the real archives do) and the tiny encoder
    sits in ``encoder/``, which is where an offline user puts it. Weights are random (seeded; the
    global RNG is left untouched): the graphs mean nothing.
    """
    import torch

    from medheval.radiology.radgraph_model import ENCODER_SUBDIR, build_dygie

    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    write_tiny_bert(folder / ENCODER_SUBDIR, hidden_size=hidden_size, seed=seed)
    config = tiny_dygie_config(encoder_name, feature_size=feature_size, hidden_dims=hidden_dims)
    (folder / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    vocab = folder / "vocabulary"
    vocab.mkdir(exist_ok=True)
    (vocab / "non_padded_namespaces.txt").write_text("*tags\n*labels\n", encoding="utf-8")
    (vocab / f"{model_type}__ner_labels.txt").write_text("\n" + "\n".join(entity_labels) + "\n", encoding="utf-8")
    (vocab / f"{model_type}__relation_labels.txt").write_text("\n".join(relation_labels) + "\n", encoding="utf-8")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, _, _ = build_dygie(folder, str(folder / ENCODER_SUBDIR), model_type)
    torch.save(model.state_dict(), folder / "weights.th")
    return folder


# --------------------------------------------------------------------------------------------------
# RaTEScore's two models

RATE_NER_LABELS: tuple[str, ...] = (
    "O", "B-ABNORMALITY", "I-ABNORMALITY", "B-NON-ABNORMALITY", "I-NON-ABNORMALITY", "B-DISEASE", "I-DISEASE",
    "B-NON-DISEASE", "I-NON-DISEASE", "B-ANATOMY", "I-ANATOMY",
)


def build_random_ratescore_models(directory: str | os.PathLike, seed: int = 0,
                                  labels: Sequence[str] = RATE_NER_LABELS) -> tuple[Path, Path]:
    """Write a tiny random NER model (``BertForTokenClassification`` with RaTE's IOB label set) in
    ``<directory>/ner`` and a tiny random synonym encoder (``BertModel``) in ``<directory>/embedding``."""
    folder = Path(directory)
    ner = write_tiny_bert(folder / "ner", architecture="BertForTokenClassification",
                          id2label=dict(enumerate(labels)), seed=seed)
    embedding = write_tiny_bert(folder / "embedding", architecture="BertModel", hidden_size=24, seed=seed + 1)
    return ner, embedding


__all__ = ["RADIOLOGY_WORDS", "RATE_NER_LABELS", "RELATION_LABELS", "SPECIAL_TOKENS", "V1_ENTITY_LABELS",
           "build_random_radgraph", "build_random_ratescore_models", "tiny_dygie_config", "write_tiny_bert"]
