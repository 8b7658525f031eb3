# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""Text-generation metrics of MedHEval's Table 7: BERTScore, BLEU, METEOR, ROUGE-1/2/L (+ sacreBLEU), offline."""

import csv
import math
from pathlib import Path

import datasets
import evaluate
import medheval.publish.hub_access
import medheval.scoring.metric_inputs
import medheval.scoring.nltk39
import medheval.scoring.nltk_data
import medheval.scoring.parsing
import sacrebleu
import torch
import transformers
from nltk.translate.bleu_score import SmoothingFunction
from nltk.translate.bleu_score import sentence_bleu
from rouge_score import rouge_scorer
from tqdm.auto import tqdm


_CITATION = """\
@article{chang2025medheval,
  title   = {MedHEval: Benchmarking Hallucinations and Mitigation Strategies in Medical Large Vision-Language Models},
  author  = {Chang, Aofei and Huang, Le and Bhatia, Parminder and Kass-Hout, Taha and Ma, Fenglong and Xiao, Cao},
  journal = {arXiv preprint arXiv:2503.02157},
  year    = {2025}
}
@inproceedings{zhang2020bertscore,
  title     = {BERTScore: Evaluating Text Generation with BERT},
  author    = {Zhang, Tianyi and Kishore, Varsha and Wu, Felix and Weinberger, Kilian Q. and Artzi, Yoav},
  booktitle = {International Conference on Learning Representations},
  year      = {2020}
}
@inproceedings{papineni2002bleu,
  title     = {BLEU: a Method for Automatic Evaluation of Machine Translation},
  author    = {Papineni, Kishore and Roukos, Salim and Ward, Todd and Zhu, Wei-Jing},
  booktitle = {Proceedings of the 40th Annual Meeting of the Association for Computational Linguistics},
  pages     = {311--318},
  year      = {2002}
}
@inproceedings{chen2014smoothing,
  title     = {A Systematic Comparison of Smoothing Techniques for Sentence-Level {BLEU}},
  author    = {Chen, Boxing and Cherry, Colin},
  booktitle = {Proceedings of the Ninth Workshop on Statistical Machine Translation},
  pages     = {362--367},
  year      = {2014}
}
@inproceedings{post2018call,
  title     = {A Call for Clarity in Reporting {BLEU} Scores},
  author    = {Post, Matt},
  booktitle = {Proceedings of the Third Conference on Machine Translation: Research Papers},
  pages     = {186--191},
  year      = {2018}
}
@inproceedings{banerjee2005meteor,
  title     = {{METEOR}: An Automatic Metric for {MT} Evaluation with Improved Correlation with Human Judgments},
  author    = {Banerjee, Satanjeev and Lavie, Alon},
  booktitle = {Proceedings of the ACL Workshop on Intrinsic and Extrinsic Evaluation Measures for Machine Translation and/or Summarization},
  pages     = {65--72},
  year      = {2005}
}
@inproceedings{lin2004rouge,
  title     = {{ROUGE}: A Package for Automatic Evaluation of Summaries},
  author    = {Lin, Chin-Yew},
  booktitle = {Text Summarization Branches Out},
  pages     = {74--81},
  year      = {2004}
}
@article{miller1995wordnet,
  title   = {WordNet: A Lexical Database for English},
  author  = {Miller, George A.},
  journal = {Communications of the ACM},
  volume  = {38},
  number  = {11},
  pages   = {39--41},
  year    = {1995}
}
"""

_DESCRIPTION = """\
The generation metrics MedHEval reports for open-ended answers and reports (Table 7), on a 0-100
scale, computed offline:

- BERTScore F1 (greedy cosine matching of contextual token embeddings; default backbone
  roberta-large, layer 17, no idf, no baseline rescaling, as `bert_score.score(lang="en")`),
  implemented here on `transformers` (the `bert-score` package fails on transformers 5);
- word tokens for BLEU and METEOR: NLTK 3.9's `word_tokenize`, reproduced in `medheval.scoring.nltk39` so the
  numbers do not change with the installed NLTK (3.10 splits quotes differently);
- BLEU: NLTK sentence BLEU, uniform 4-gram weights, `SmoothingFunction().method4`, mean over items;
- sacreBLEU: corpus BLEU (13a tokenizer), an extra column for comparison with other papers;
- METEOR: NLTK 3.9's `meteor_score` (reproduced in `medheval.scoring.nltk39`) with WordNet 3.0 read offline
  (see `medheval.scoring.nltk_data`);
- ROUGE-1/2/L: `rouge-score` F1 with the Porter stemmer, reference as target (precision and recall
  also returned).

Without the BERTScore weights the other columns are still computed and BERTScore is reported as
unavailable with the reason (likewise METEOR without WordNet). `upstream_compat=True` reproduces
MedHEval's swapped ROUGE precision/recall and its `.strip("Assistant:")` answer cleaning; a report
(`answer_types` item "report") is cleaned as MedHEval's report CSV holds it, which its report metrics
script reads: the raw text where the strip leaves nothing, and "No report generated." under 10 characters.
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): generated answers / reports.
    references (`list` of `str`): reference answers / reports, one per prediction; `None`/"" means
        none (the item is left out and counted in n_empty_references).
    bertscore_model (`str`, *optional*): BERTScore backbone, a local folder or a Hub id (default
        "roberta-large", the papers' backbone). Loaded once per metric instance.
    bertscore_num_layers (`int`, *optional*): which layer's output to use (the model is cut after
        it). Default 17 for roberta-large (bert-score's table for a few known models); required for
        any other backbone.
    bertscore_baseline_path (`str`, *optional*): bert-score baseline file (`LAYER,P,R,F`, row i =
        layer i); when given, P/R/F are rescaled `(x - b) / (1 - b)`. Default: no rescaling (as MedHEval).
    bertscore_idf (`bool`, *optional*, defaults to `False`): idf-weight tokens, idf from the references.
    bertscore_batch_size (`int`, *optional*, defaults to 16): sentences per forward pass.
    device (`str`, *optional*): "cpu", "cuda", "cuda:1" ...; default CUDA when available.
    nltk_data_dir (`str`, *optional*): an NLTK data root holding `corpora/wordnet`; only that root
        is searched. Default: `$MEDHEVAL_NLTK_DATA`, `$NLTK_DATA`, `nltk.data.path`, `<venv>/nltk_data`.
    upstream_compat (`bool`, *optional*, defaults to `False`): reproduce MedHEval's code: predictions
        cleaned with `str.strip("Assistant:")` (a character set, not a prefix) and ROUGE called as
        `score(prediction, reference)`, which swaps ROUGE precision and recall (F1 unchanged).
    answer_types (`list` of `str`, *optional*): each item's answer type (`run_eval.py` passes the
        records'); with `upstream_compat`, "report" items are cleaned as MedHEval's report CSV holds them.

Returns (scores on a 0-100 scale; `None` where a column is unavailable):
    bertscore (`float`): mean BERTScore F1; also `bertscore_precision`, `bertscore_recall`.
    bleu (`float`): mean NLTK sentence BLEU-4 (method4 smoothing).
    sacrebleu (`float`): sacreBLEU corpus BLEU.
    meteor (`float`): mean NLTK METEOR.
    rouge1, rouge2, rougeL (`float`): mean ROUGE F1; also `<type>_precision`, `<type>_recall`.
    bleu_per_item, meteor_per_item, rouge1_per_item, rouge2_per_item, rougeL_per_item,
    bertscore_per_item (`list` of `float`, length n).
    n (`int`): pairs scored (those with a reference); n_empty_predictions (`int`): of them, empty
        predictions (scored 0); n_empty_references (`int`): items without a reference, left out of every
        column (their per-item values are `None`).
    tokenizer (`str`): the word tokenizer used for BLEU/METEOR.
    bertscore_model, bertscore_num_layers, bertscore_idf, bertscore_rescaled: the BERTScore settings.
    bertscore_note (`str`): set when the setting is not MedHEval's (roberta-large layer 17, no idf, no
        rescaling): the numbers are then not comparable with the paper's.
    bertscore_unavailable_reason, meteor_unavailable_reason (`str`): why a column is `None`.
    upstream_compat (`bool`).

Examples:
    >>> import evaluate
    >>> metric = evaluate.load("metrics/text_generation")  # doctest: +SKIP
    >>> results = metric.compute(
    ...     predictions=["small left pleural effusion"],
    ...     references=["no pleural effusion or pneumothorax"],
    ...     bertscore_model="/path/to/local/bert", bertscore_num_layers=4,
    ... )  # doctest: +SKIP
    >>> round(results["rouge1"], 2), round(results["rouge1_precision"], 2), round(results["rouge1_recall"], 2)  # doctest: +SKIP
    (44.44, 50.0, 40.0)
"""

#: The papers' backbone (bert_score `lang2model["en"]`) and its layer (`model2layers`).
DEFAULT_BERTSCORE_MODEL = "roberta-large"
#: Layers bert-score 0.3.13 uses for a few common backbones (`bert_score/utils.py::model2layers`).
KNOWN_NUM_LAYERS = {
    "roberta-large": 17,
    "roberta-base": 10,
    "distilroberta-base": 5,
    "bert-base-uncased": 9,
    "bert-large-uncased": 18,
    "microsoft/deberta-xlarge-mnli": 40,
    "allenai/scibert_scivocab_uncased": 8,
    "distilbert-base-uncased": 5,
}
_ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
_BYTE_LEVEL_TOKENIZERS = {"RobertaTokenizer", "RobertaTokenizerFast", "GPT2Tokenizer", "GPT2TokenizerFast"}


class BERTScoreConfigError(ValueError):
    """A BERTScore setting that cannot work with the chosen backbone (raised, never reported as unavailable)."""


def clean_prediction(text, upstream_compat=False, report=False):
    """See `medheval.scoring.parsing.clean_generated_text` (native role-prefix trim, or MedHEval's character-set
    strip; for a report under `upstream_compat`, also its report CSV's empty fallback and short-report sentence)."""
    return medheval.scoring.parsing.clean_generated_text(text, upstream_compat=upstream_compat,
                                                         report_csv=upstream_compat and report)


def _mean(values):
    return 100.0 * math.fsum(values) / len(values) if values else 0.0


class BERTScorer:
    """BERTScore (Zhang et al., ICLR 2020) on a `transformers` encoder, as bert-score 0.3.13 computes it.

    Each sentence is encoded with the tokenizer's special tokens (byte-level BPE tokenizers get a
    prefix space, as bert-score's `add_prefix_space=True`), truncated to the model's maximum
    length, and embedded by the encoder cut after `num_layers` layers. With L2-normalised token
    embeddings x (reference) and y (candidate):

        P = sum_j w(y_j) max_i x_i.y_j / sum_j w(y_j)      R = sum_i w(x_i) max_j x_i.y_j / sum_i w(x_i)
        F = 2PR / (P + R)

    Special tokens take part in the matching but have weight 0; other tokens weight 1, or their
    idf over the references, idf(t) = log((M + 1) / (df(t) + 1)) (unseen: log(M + 1)). A pair
    whose candidate or reference is empty scores 0. Rescaling with a baseline b: (s - b) / (1 - b)
    for each of P, R, F.
    """

    def __init__(self, model_name_or_path, num_layers, device=None, local_files_only=False):
        self.model_name_or_path = str(model_name_or_path)
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(self.model_name_or_path,
                                                                    local_files_only=local_files_only)
        model = transformers.AutoModel.from_pretrained(self.model_name_or_path, local_files_only=local_files_only)
        if hasattr(model, "encoder") and hasattr(model, "decoder") and hasattr(model, "get_encoder"):
            model = model.get_encoder()
        self.num_layers = int(num_layers)
        self._hidden_state_index = None
        layers = self._layer_list(model)
        total = len(layers[1]) if layers else getattr(model.config, "num_hidden_layers", None)
        if total is not None and not 0 <= self.num_layers <= total:
            raise BERTScoreConfigError(
                f"bertscore_num_layers={self.num_layers} is out of range for {self.model_name_or_path} "
                f"({total} layers): use 0..{total}"
            )
        if layers:
            owner, name = layers[0], layers[2]
            setattr(owner, name, torch.nn.ModuleList(list(layers[1])[: self.num_layers]))
        else:  # unknown layout: run the full model and read hidden_states[num_layers]
            self._hidden_state_index = self.num_layers
        self.model = model.to(self.device).eval()
        self._byte_level = any(c.__name__ in _BYTE_LEVEL_TOKENIZERS for c in type(self.tokenizer).__mro__)
        limit = getattr(self.tokenizer, "model_max_length", None) or 512
        self.max_length = int(limit) if limit < 100_000 else 512
        self.special_ids = {i for i in (self.tokenizer.cls_token_id, self.tokenizer.sep_token_id) if i is not None}

    @staticmethod
    def _layer_list(model):
        """(owner, ModuleList, attribute) of the transformer blocks, for the layouts bert-score handles."""
        for path in ("encoder.layer", "transformer.layer", "encoder.layers", "layers", "layer", "encoder.block", "h"):
            owner = model
            parts = path.split(".")
            for part in parts[:-1]:
                owner = getattr(owner, part, None)
                if owner is None:
                    break
            blocks = getattr(owner, parts[-1], None) if owner is not None else None
            if isinstance(blocks, torch.nn.ModuleList):
                return owner, blocks, parts[-1]
        return None

    def encode(self, sentence):
        """Token ids with special tokens, as bert-score's `sent_encode`."""
        sentence = sentence.strip()
        if sentence and self._byte_level:
            sentence = " " + sentence
        return self.tokenizer.encode(sentence, add_special_tokens=True, truncation=True, max_length=self.max_length)

    @torch.no_grad()
    def embed(self, sentences, batch_size=16):
        """{sentence: (ids, L2-normalised embeddings [T, d] on CPU)} for the unique sentences."""
        unique = sorted(set(sentences), key=lambda s: len(s.split(" ")), reverse=True)
        encoded = {s: self.encode(s) for s in unique}
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        out = {}
        starts = range(0, len(unique), max(1, int(batch_size)))
        for start in tqdm(starts, desc="BERTScore", unit="batch", disable=None if len(starts) > 1 else True):
            batch = unique[start : start + batch_size]
            ids = [encoded[s] for s in batch]
            width = max(len(x) for x in ids)
            input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
            mask = torch.zeros((len(ids), width), dtype=torch.long)
            for row, x in enumerate(ids):
                input_ids[row, : len(x)] = torch.tensor(x, dtype=torch.long)
                mask[row, : len(x)] = 1
            kwargs = {"attention_mask": mask.to(self.device)}
            if self._hidden_state_index is not None:
                hidden = self.model(input_ids.to(self.device), output_hidden_states=True, **kwargs).hidden_states
                states = hidden[self._hidden_state_index]
            else:
                states = self.model(input_ids.to(self.device), **kwargs)[0]
            states = states.float()
            states = states / states.norm(dim=-1, keepdim=True)
            for row, sentence in enumerate(batch):
                out[sentence] = (ids[row], states[row, : len(ids[row])].cpu())
        return out

    def idf_weights(self, references):
        """idf over the references, as bert-score's `get_idf_dict`."""
        df = {}
        for reference in references:
            for token in set(self.encode(reference)):
                df[token] = df.get(token, 0) + 1
        m = len(references)
        return {token: math.log((m + 1) / (count + 1)) for token, count in df.items()}, math.log(m + 1)

    def _weights(self, ids, idf):
        if idf is None:
            return torch.tensor([0.0 if t in self.special_ids else 1.0 for t in ids])
        table, unseen = idf
        return torch.tensor([table.get(t, unseen) for t in ids], dtype=torch.float)

    def score(self, candidates, references, idf=False, batch_size=16, baseline=None):
        """Per-pair (P, R, F) lists, fractions in [0, 1] (rescaled when `baseline` = (bP, bR, bF))."""
        embeddings = self.embed(list(candidates) + list(references), batch_size)
        idf_table = self.idf_weights(references) if idf else None
        precision, recall, f1 = [], [], []
        for candidate, reference in zip(candidates, references):
            cand_ids, cand_emb = embeddings[candidate]
            ref_ids, ref_emb = embeddings[reference]
            cand_w, ref_w = self._weights(cand_ids, idf_table), self._weights(ref_ids, idf_table)
            if not candidate.strip() or not reference.strip() or cand_w.sum() <= 0 or ref_w.sum() <= 0:
                p = r = f = 0.0
            else:
                sim = cand_emb @ ref_emb.T  # [cand tokens, ref tokens]
                p = float((sim.max(dim=1).values * cand_w).sum() / cand_w.sum())
                r = float((sim.max(dim=0).values * ref_w).sum() / ref_w.sum())
                f = 2 * p * r / (p + r) if p + r != 0 else 0.0
            if baseline is not None:
                p, r, f = ((x - b) / (1 - b) for x, b in zip((p, r, f), baseline))
            precision.append(p)
            recall.append(r)
            f1.append(f)
        return precision, recall, f1


def read_baseline(path, num_layers):
    """(bP, bR, bF) of layer `num_layers` from a bert-score baseline file (header LAYER,P,R,F)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"bertscore_baseline_path {str(path)!r} does not exist. bert-score ships the baselines in its wheel "
            f"(bert_score/rescale_baseline/en/<model>.tsv); point at that file, or leave the option out (MedHEval "
            f"did not rescale)."
        )
    text = path.read_text(encoding="utf-8")
    delimiter = "\t" if "\t" in text.splitlines()[0] else ","
    rows = list(csv.reader(text.splitlines(), delimiter=delimiter))
    header, body = [h.strip().upper() for h in rows[0]], [r for r in rows[1:] if r]
    if header[:1] != ["LAYER"] or not {"P", "R", "F"} <= set(header):
        raise ValueError(f"{path}: expected a header LAYER,P,R,F, got {rows[0]}")
    if num_layers >= len(body):
        raise ValueError(f"{path} has baselines for layers 0..{len(body) - 1}, not layer {num_layers}")
    row = dict(zip(header, body[num_layers]))
    if int(float(row["LAYER"])) != num_layers:
        raise ValueError(f"{path}: row {num_layers} is for layer {row['LAYER']}")
    return tuple(float(row[k]) for k in ("P", "R", "F"))


# Option types a default cannot tell (run_eval.py --metric-option checks values against them;
# the other options take the type of their bool/int/float/str default).
OPTION_TYPES = {"bertscore_model": str | None, "bertscore_num_layers": int | None,
                "bertscore_baseline_path": str | None, "device": str | None, "nltk_data_dir": str | None}


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class TextGeneration(medheval.scoring.metric_inputs.NoneChecked, evaluate.Metric):
    """BERTScore, BLEU, sacreBLEU, METEOR and ROUGE-1/2/L in one call, as MedHEval's Table 7."""
    MISSING_AS = {"references": ""}  # an item without a reference: left out, counted

    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Value("string"),
                }
            ),
            homepage="https://github.com/Aofei-Chang/MedHEval",
            codebase_urls=[
                "https://github.com/Tiiiger/bert_score",
                "https://github.com/nltk/nltk",
                "https://github.com/google-research/google-research/tree/master/rouge",
                "https://github.com/mjpost/sacrebleu",
            ],
            reference_urls=["https://arxiv.org/abs/2503.02157", "https://arxiv.org/abs/1904.09675"],
        )

    # ---- heavy resources, loaded once per metric instance -------------------------------------
    def _bertscorer(self, model, num_layers, device, local_files_only=False):
        cache = self.__dict__.setdefault("_bertscorers", {})
        key = (str(model), int(num_layers), str(device))
        if key not in cache:
            cache[key] = BERTScorer(model, num_layers, device, local_files_only=local_files_only)
        return cache[key]

    def _hub_scorer(self, model, num_layers, device):
        """A Hub id's scorer: from the local cache first; only when it is not there, from the Hub, and only
        when a quick probe (`medheval.publish.hub_access.hub_reachable`, once per process) finds the Hub reachable, so an
        offline machine without HF_HUB_OFFLINE learns it in seconds instead of a minute of retries.
        Returns (scorer, None) or (None, reason)."""
        try:
            return self._bertscorer(model, num_layers, device, local_files_only=True), None
        except BERTScoreConfigError:
            raise
        except Exception as err:  # noqa: BLE001 -- not cached (or a broken cache entry): try the Hub
            cached_error = err
        reachable, why = medheval.publish.hub_access.hub_reachable()
        if not reachable:
            return None, self._load_failure(model, cached_error, hub=why)
        try:
            return self._bertscorer(model, num_layers, device), None
        except BERTScoreConfigError:
            raise
        except Exception as err:  # noqa: BLE001 -- download failed, gated model, corrupt files ...
            return None, self._load_failure(model, err)

    @staticmethod
    def _num_layers(model, num_layers):
        if num_layers is not None:
            return int(num_layers)
        for key in (str(model), Path(str(model)).name):
            if key in KNOWN_NUM_LAYERS:
                return KNOWN_NUM_LAYERS[key]
        raise BERTScoreConfigError(
            f"bertscore_num_layers is required for bertscore_model={model!r} (known defaults: "
            + ", ".join(f"{k}={v}" for k, v in KNOWN_NUM_LAYERS.items())
            + "). bert-score's tuned layer for many models is in bert_score/utils.py::model2layers."
        )

    def _compute(
        self,
        predictions,
        references,
        bertscore_model=None,
        bertscore_num_layers=None,
        bertscore_baseline_path=None,
        bertscore_idf=False,
        bertscore_batch_size=16,
        device=None,
        nltk_data_dir=None,
        upstream_compat=False,
        answer_types=None,
    ):
        n = len(predictions)
        if len(references) != n:
            raise ValueError(f"Mismatch in the number of predictions ({n}) and references ({len(references)})")
        if answer_types is not None and len(answer_types) != n:
            raise ValueError(f"Mismatch in the number of predictions ({n}) and answer_types ({len(answer_types)})")
        reports = [kind == "report" for kind in answer_types] if answer_types is not None else [False] * n
        predictions = [clean_prediction(p, upstream_compat, report) for p, report in zip(predictions, reports)]
        references = ["" if r is None else str(r).strip() for r in references]
        # an item without a reference has nothing to be compared with: left out of every column, counted
        kept = [i for i, reference in enumerate(references) if reference]
        result = self._score([predictions[i] for i in kept], [references[i] for i in kept], bertscore_model,
                             bertscore_num_layers, bertscore_baseline_path, bertscore_idf, bertscore_batch_size,
                             device, nltk_data_dir, upstream_compat)
        result["n_empty_references"] = n - len(kept)
        for key in [k for k, v in result.items() if k.endswith("_per_item") and isinstance(v, list)]:
            values = iter(result[key])
            result[key] = [next(values) if reference else None for reference in references]
        return result

    def _score(self, predictions, references, bertscore_model, bertscore_num_layers, bertscore_baseline_path,
               bertscore_idf, bertscore_batch_size, device, nltk_data_dir, upstream_compat):
        """Every column over pairs that all have a reference."""
        n = len(predictions)
        result = {"n": n, "n_empty_predictions": sum(not p.strip() for p in predictions),
                  "upstream_compat": bool(upstream_compat)}
        if not n:  # nothing to score: every column is None, not 0
            return {**result, **dict.fromkeys(("bleu", "sacrebleu", "meteor", "bertscore", "bertscore_precision",
                                               "bertscore_recall", *_ROUGE_TYPES,
                                               *(f"{k}_{part}" for k in _ROUGE_TYPES
                                                 for part in ("precision", "recall")))),
                    **{f"{k}_per_item": [] for k in ("bleu", "meteor", "bertscore", *_ROUGE_TYPES)},
                    "no_reference_reason": "no item has a reference"}

        # BLEU and METEOR on NLTK word tokens (MedHEval: nltk.word_tokenize of NLTK 3.9).
        tokenize, tokenizer_name = medheval.scoring.nltk_data.word_tokenizer()
        pred_tokens = [tokenize(p) for p in predictions]
        ref_tokens = [tokenize(r) for r in references]
        smoothing = SmoothingFunction().method4
        bleu = [float(sentence_bleu([r], p, smoothing_function=smoothing)) if p and r else 0.0
                for p, r in zip(pred_tokens, ref_tokens)]
        result["tokenizer"] = tokenizer_name
        result["bleu"] = _mean(bleu)
        result["bleu_per_item"] = [100.0 * x for x in bleu]
        result["sacrebleu"] = float(sacrebleu.corpus_bleu(predictions, [references]).score) if n else 0.0

        roots = [nltk_data_dir] if nltk_data_dir is not None else None
        wordnet, why = medheval.scoring.nltk_data.load_wordnet(roots)
        if wordnet is None:
            result.update(meteor=None, meteor_per_item=None, meteor_unavailable_reason=why)
        else:
            meteor = [float(medheval.scoring.nltk39.meteor([r], p, wordnet)) if p and r else 0.0
                      for p, r in zip(pred_tokens, ref_tokens)]
            result.update(meteor=_mean(meteor), meteor_per_item=[100.0 * x for x in meteor],
                          meteor_unavailable_reason=None)

        # ROUGE: score(target, prediction). MedHEval passed (prediction, reference): P and R swapped.
        scorer = rouge_scorer.RougeScorer(list(_ROUGE_TYPES), use_stemmer=True)
        pairs = [(p, r) if upstream_compat else (r, p) for p, r in zip(predictions, references)]
        scores = [scorer.score(target, prediction) for target, prediction in pairs]
        for kind in _ROUGE_TYPES:
            result[kind] = _mean([s[kind].fmeasure for s in scores])
            result[f"{kind}_precision"] = _mean([s[kind].precision for s in scores])
            result[f"{kind}_recall"] = _mean([s[kind].recall for s in scores])
            result[f"{kind}_per_item"] = [100.0 * s[kind].fmeasure for s in scores]

        result.update(self._bertscore(predictions, references, bertscore_model, bertscore_num_layers,
                                      bertscore_baseline_path, bertscore_idf, bertscore_batch_size, device))
        return result

    def _bertscore(self, predictions, references, model, num_layers, baseline_path, idf, batch_size, device):
        model = str(model) if model is not None else DEFAULT_BERTSCORE_MODEL
        num_layers = self._num_layers(model, num_layers)
        changes = []
        if Path(model).name != DEFAULT_BERTSCORE_MODEL or num_layers != KNOWN_NUM_LAYERS[DEFAULT_BERTSCORE_MODEL]:
            changes.append(f"backbone {model} layer {num_layers} instead of roberta-large layer 17")
        if idf:
            changes.append("idf weighting")
        if baseline_path is not None:
            changes.append("baseline rescaling")
        out = {
            "bertscore": None, "bertscore_precision": None, "bertscore_recall": None, "bertscore_per_item": None,
            "bertscore_model": model, "bertscore_num_layers": num_layers, "bertscore_idf": bool(idf),
            "bertscore_rescaled": baseline_path is not None, "bertscore_unavailable_reason": None,
            "bertscore_note": None if not changes else (
                f"BERTScore computed with {' and '.join(changes)}; MedHEval used roberta-large layer 17 without idf "
                "or rescaling: the numbers are not comparable with the paper's."),
        }
        baseline = read_baseline(baseline_path, num_layers) if baseline_path is not None else None
        local = Path(model).expanduser()
        if not local.is_dir() and (local.is_absolute() or model.startswith((".", "~"))):
            out["bertscore_unavailable_reason"] = (
                f"BERTScore backbone folder {model!r} does not exist. Pass bertscore_model= a local folder with "
                "config.json, the weights and the tokenizer (e.g. a copy of roberta-large), or a Hub id when online. "
                "The other columns were computed.")
            return out
        if local.is_dir():
            try:
                scorer = self._bertscorer(str(local), num_layers, device)
            except BERTScoreConfigError:
                raise
            except Exception as err:  # noqa: BLE001 -- corrupt folder, missing tokenizer files ...
                out["bertscore_unavailable_reason"] = self._load_failure(model, err)
                return out
        else:
            scorer, why = self._hub_scorer(model, num_layers, device)
            if scorer is None:
                out["bertscore_unavailable_reason"] = why
                return out
        precision, recall, f1 = scorer.score(predictions, references, idf=idf, batch_size=batch_size, baseline=baseline)
        out.update(bertscore=_mean(f1), bertscore_precision=_mean(precision), bertscore_recall=_mean(recall),
                   bertscore_per_item=[100.0 * x for x in f1])
        return out

    @staticmethod
    def _load_failure(model, err, hub=None):
        message = " ".join(str(err).split())[:400]
        if hub is not None:
            return (
                f"the BERTScore backbone {model!r} is not in the local Hugging Face cache ({type(err).__name__}) "
                f"and the Hub is not reachable ({hub}). Offline, pass bertscore_model= a local folder (e.g. a copy "
                "of roberta-large; its layer 17 is the papers' setting), or run online once so the Hub id is "
                "cached. The other columns were computed."
            )
        return (
            f"could not load the BERTScore backbone {model!r} ({type(err).__name__}: {message}). Offline, pass "
            "bertscore_model= a local folder (e.g. a copy of roberta-large; its layer 17 is the papers' setting), "
            "or run online once so the Hub id is cached. The other columns were computed."
        )
