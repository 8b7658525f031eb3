# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""NLTK 3.9's word tokenizer and METEOR, re-implemented so BLEU/METEOR do not move with the installed NLTK.

MedHEval scored Table 7 with NLTK 3.9 (``word_tokenize`` + ``meteor_score``). NLTK 3.10 changed the
word tokenizer: a single quote before a word is split off whenever the word is not a contraction
(``'mass'`` -> ``'``, ``mass``, ``'``), where 3.9 split it only before a one-character word
(``'a`` -> ``'``, ``a``) and kept ``'mass`` whole; 3.10 also runs every rule through the ``regex``
engine with a time limit. 3.10 rewrote METEOR's exact/synonym alignment with an index (same results
on our checks, but no longer the code MedHEval ran). This module holds the 3.9 rules:

* :func:`word_tokenize`: sentences from Punkt (NLTK's trained English model when installed,
  otherwise an untrained Punkt splitter), then per sentence the
  improved Treebank rules of ``NLTKWordTokenizer`` 3.9 (starting quotes, punctuation, brackets,
  double dashes, ending quotes, contractions), applied with the stdlib ``re``.
* :func:`meteor`: METEOR (Banerjee & Lavie, 2005) as NLTK 3.9 computes it. Words are lower-cased
  and aligned in three stages, each scanning hypothesis words from the last to the first and
  matching each to the *last* still-unmatched reference word that is (1) the same word, (2) the
  same Porter stem, (3) in the hypothesis word's WordNet synonym set (lemma names without ``_``,
  plus the word). With m matches, hypothesis length t, reference length r, and c chunks (runs of
  matches adjacent in both sentences, matches ordered by hypothesis position):

      P = m / t,  R = m / r,  Fmean = P R / (alpha P + (1 - alpha) R),
      penalty = gamma (c / m) ** beta,  METEOR = (1 - penalty) Fmean

  with alpha = 0.9, beta = 3, gamma = 0.5; 0 when m = 0. Several references: the maximum.

The Porter stemmer and WordNet lookups come from the installed NLTK (their results are the same in
3.9.4 and 3.10.4 on the cross-check in ``tests/test_metric_text_generation.py``).
"""

from __future__ import annotations

import functools
import re

#: Name recorded in results for the tokenizer below.
TOKENIZER_NAME = "NLTK 3.9 word_tokenize rules (medheval.scoring.nltk39)"

_CLOSE_QUOTES = "»”’"
# (pattern, replacement) rules of NLTK 3.9's NLTKWordTokenizer, in application order.
_STARTING_QUOTES = (
    (re.compile("([«“‘„]|[`]+)"), r" \1 "),
    (re.compile(r'^"'), r"``"),
    (re.compile(r"(``)"), r" \1 "),
    (re.compile(r"""([ \(\[{<])("|'{2})"""), r"\1 `` "),
    # 3.9: a quote is split from a following one-character word only (3.10 splits before any word).
    (re.compile(r"(?i)(')(?!re|ve|ll|m|t|s|d|n)(\w)\b"), r"\1 \2"),
)
_PUNCTUATION = (
    # NLTK's "([^\.])(\.)([\]\)}>\"'»”’ ]*)\s*$": its closers include the space, so a long blank run after a full
    # stop was split every way between the two before the end was found missing (quadratic). Only the longest
    # run of closers can be followed by blanks to the end, so the regex below, which tries no other, reads alike.
    (re.compile(r"""([^\.])(\.)([\]\)}>"'""" + _CLOSE_QUOTES + r""" ]*)(?![\]\)}>"'""" + _CLOSE_QUOTES
                + r" ])\s*$"), r"\1 \2 \3 "),
    (re.compile(r"([:,])([^\d])"), r" \1 \2"),
    (re.compile(r"([:,])$"), r" \1 "),
    (re.compile(r"\.{2,}"), r" \g<0> "),
    (re.compile(r"[;@#$%&]"), r" \g<0> "),
    (re.compile("[\u2012-\u2015]"), r" \g<0> "),
    (re.compile(r"""([^\.])(\.)([\]\)}>"']*)\s*$"""), r"\1 \2\3 "),
    (re.compile(r"[?!]"), r" \g<0> "),
    (re.compile(r"([^'])' "), r"\1 ' "),
    (re.compile(r"[*]"), r" \g<0> "),
)
_BRACKETS = (re.compile(r"[\]\[\(\)\{\}\<\>]"), r" \g<0> ")
_DOUBLE_DASH = (re.compile(r"--"), r" -- ")
_ENDING_QUOTES = (
    (re.compile("([" + _CLOSE_QUOTES + "])"), r" \1 "),
    (re.compile(r"''"), " '' "),
    (re.compile(r'"'), " '' "),
    (re.compile(r"\s+"), " "),
    (re.compile(r"([^' ])('[sS]|'[mM]|'[dD]|') "), r"\1 \2 "),
    (re.compile(r"([^' ])('ll|'LL|'re|'RE|'ve|'VE|n't|N'T) "), r"\1 \2 "),
)
# Two-part contractions (cannot, gimme, gonna, ...) and 'tis / 'twas, split as " \1 \2 ".
_CONTRACTIONS = tuple(
    re.compile(p)
    for p in (
        r"(?i)\b(can)(not)\b", r"(?i)\b(d)('ye)\b", r"(?i)\b(gim)(me)\b", r"(?i)\b(gon)(na)\b",
        r"(?i)\b(got)(ta)\b", r"(?i)\b(lem)(me)\b", r"(?i)\b(more)('n)\b", r"(?i)\b(wan)(na)(?=\s)",
        r"(?i) ('t)(is)\b", r"(?i) ('t)(was)\b",
    )
)


def tokenize_sentence(text: str) -> list[str]:
    """One sentence's word tokens under NLTK 3.9's ``NLTKWordTokenizer`` rules (no PTB bracket conversion)."""
    for pattern, replacement in _STARTING_QUOTES + _PUNCTUATION + (_BRACKETS, _DOUBLE_DASH):
        text = pattern.sub(replacement, text)
    text = f" {text} "
    for pattern, replacement in _ENDING_QUOTES:
        text = pattern.sub(replacement, text)
    for pattern in _CONTRACTIONS:
        text = pattern.sub(r" \1 \2 ", text)
    return text.split()


def punkt_available(language: str = "english") -> bool:
    """True when NLTK's trained Punkt model (``punkt_tab``) for ``language`` is installed."""
    try:
        from nltk.tokenize import punkt_model_available
    except ImportError:  # nltk < 3.9.3: probe the resource directly
        try:
            import nltk.data

            nltk.data.find(f"tokenizers/punkt_tab/{language}/")
            return True
        except (LookupError, ImportError):
            return False
    return bool(punkt_model_available(language))


@functools.lru_cache(maxsize=1)
def _sentence_splitter():
    """``(split, name)``: NLTK's trained English Punkt when installed, else an untrained Punkt splitter."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer

    if punkt_available():
        from nltk.tokenize import sent_tokenize

        return functools.partial(sent_tokenize, language="english"), "punkt_tab english"
    return PunktSentenceTokenizer().tokenize, "untrained Punkt, punkt_tab not installed"


def word_tokenize(text: str) -> list[str]:
    """``nltk.word_tokenize(text)`` as NLTK 3.9 returns it: Punkt sentences, then :func:`tokenize_sentence`."""
    split, _ = _sentence_splitter()
    return [token for sentence in split(text) for token in tokenize_sentence(sentence)]


def tokenizer_name() -> str:
    """The tokenizer recorded in results: these rules plus the sentence splitter that ran."""
    return f"{TOKENIZER_NAME}; sentences: {_sentence_splitter()[1]}"


def _align_stage(hypothesis, reference, candidates):
    """One alignment stage: for hypothesis words from last to first, match the last unmatched reference
    word in ``candidates(word)``. Returns (matches [(hyp index, ref index)], hyp left, ref left)."""
    hypothesis, reference, matches = list(hypothesis), list(reference), []
    for i in range(len(hypothesis) - 1, -1, -1):
        accepted = candidates(hypothesis[i][1])
        for j in range(len(reference) - 1, -1, -1):
            if reference[j][1] in accepted:
                matches.append((hypothesis[i][0], reference[j][0]))
                del hypothesis[i], reference[j]
                break
    return matches, hypothesis, reference


def _chunks(matches) -> int:
    """Runs of matches adjacent in both sentences (``matches`` sorted by hypothesis position)."""
    return 1 + sum(
        1 for (h0, r0), (h1, r1) in zip(matches, matches[1:]) if not (h1 == h0 + 1 and r1 == r0 + 1)
    )


def single_meteor(reference, hypothesis, wordnet, stemmer=None, alpha=0.9, beta=3.0, gamma=0.5) -> float:
    """METEOR of one tokenised hypothesis against one tokenised reference (formula in the module docstring)."""
    if isinstance(reference, str) or isinstance(hypothesis, str):
        raise TypeError("METEOR expects token lists, not strings: tokenise with medheval.scoring.nltk39.word_tokenize")
    if stemmer is None:
        from nltk.stem.porter import PorterStemmer

        stemmer = PorterStemmer()
    hyp = list(enumerate(w.lower() for w in hypothesis))
    ref = list(enumerate(w.lower() for w in reference))
    exact, hyp_left, ref_left = _align_stage(hyp, ref, lambda word: {word})
    # a degenerate hypothesis repeats a few words thousands of times: each is stemmed and looked up once
    stem_word = functools.lru_cache(maxsize=None)(stemmer.stem)
    stem = lambda pairs: [(k, stem_word(w)) for k, w in pairs]  # noqa: E731
    stemmed, hyp_left, ref_left = _align_stage(stem(hyp_left), stem(ref_left), lambda word: {word})

    @functools.lru_cache(maxsize=None)
    def synonyms(word):
        names = (lemma.name() for synset in wordnet.synsets(word) for lemma in synset.lemmas())
        return {name for name in names if "_" not in name} | {word}

    synonym, _, _ = _align_stage(hyp_left, ref_left, synonyms)
    matches = sorted(exact + stemmed + synonym, key=lambda pair: pair[0])
    m = len(matches)
    if m == 0 or not hyp or not ref:
        return 0.0
    precision = float(m) / len(hyp)
    recall = float(m) / len(ref)
    fmean = (precision * recall) / (alpha * precision + (1 - alpha) * recall)
    penalty = gamma * (float(_chunks(matches)) / m) ** beta
    return (1 - penalty) * fmean


def meteor(references, hypothesis, wordnet, **kwargs) -> float:
    """METEOR against several tokenised references: the maximum of :func:`single_meteor` (NLTK 3.9)."""
    return max(single_meteor(reference, hypothesis, wordnet, **kwargs) for reference in references)


__all__ = ["TOKENIZER_NAME", "meteor", "single_meteor", "tokenize_sentence", "tokenizer_name", "word_tokenize"]
