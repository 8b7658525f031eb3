"""A fast, dependency-free CheXpert-14 rule labeler (the offline default for report metrics).

It follows the *conventions* of the Stanford CheXpert labeler (Irvin et al., AAAI 2019;
``stanfordmlgroup/chexpert-labeler``) with its own vocabulary and a NegEx/ConText-style scope
algorithm instead of CheXpert's dependency parses (BLLIP + Stanford dependencies, Java):

1. **Mentions** — per observation, a vocabulary of regular expressions written for this module
   (synonyms, inflections, abbreviations: "ETT", "PICC", "NG tube", "PTX", "airspace disease",
   "pleural fluid" …), word-bounded. *Unmention* phrases win where they overlap a mention
   ("pericardial effusion" is not a pleural effusion, "calcified nodule" is not a lung lesion,
   "plate-like" is not a device). Neutral descriptors of the heart and mediastinum ("heart size",
   "cardiac silhouette", "mediastinal contours") count only when a size/appearance word is near
   them ("enlarged", "normal", "stable", "borderline" …), so "leads over the heart" is no mention.
   A list of *other abnormalities* (emphysema, granuloma, hernia, scoliosis …) gives no label but,
   like in CheXpert, stops "No Finding".
2. **Negation / uncertainty** — trigger phrases with a direction (forward / backward) and an
   optional word window, classified and applied in CheXpert's order: *pre-negation uncertainty*
   ("cannot exclude", "X cannot be excluded", "no new X"), then *negation* ("no", "without",
   "no evidence of", "free of", "X has resolved", "X is normal" …), then *post-negation
   uncertainty* ("possible", "likely", "may represent", "suggestive of", "concerning for",
   "X versus Y", "X or Y", "borderline", the always-uncertain congestion terms, and "stable /
   unchanged" for the neutral heart/mediastinum descriptors). Otherwise the mention is positive.
   A scope ends at the sentence end, at a terminator ("but", "however", "although", "which",
   ";", "and there …"), at a hedge/negation trigger that opens a new phrase ("no pneumonia,
   possible atelectasis"; not "no suspicious nodules"), and — forward — at a comma that opens
   a new assertion ("no pneumothorax, mild cardiomegaly"), or — backward — at a verb or a comma
   that starts a new clause ("mild edema, heart size is normal"). "X or Y" / "X, Y, or Z"
   makes every member uncertain unless all name the same observation ("pacemaker/ICD").
   Sentences starting "Findings: no" / "Impression: no" negate every mention (CheXpert's
   sentence rule).
3. **Aggregation** (CheXpert's ``aggregate.py`` rules) — per observation over its mentions:
   positive beats uncertain beats negative ({0, -1} → -1, {0, 1} → 1, {-1, 1} → 1); never
   mentioned → blank (``None``). A positive or uncertain mention of congestive heart failure
   ("CHF", "heart failure") adds an *uncertain* Cardiomegaly. "No Finding" is 1 when no mention
   of any observation other than Support Devices (Fracture and the other-abnormality list
   included) is positive or uncertain, else blank; it is never 0.

Deliberate differences from the upstream labeler (documented, tested):
"likely", "probably", "suggests/suggesting/suggestive of", "possibility of", "potential" hedge a
finding (uncertain; CheXpert's patterns leave "likely X" and "findings suggest X" positive);
"X is not appreciated" is negative (CheXpert: uncertain); an explicit enlargement word beats
"stable" ("heart mildly enlarged but stable" → positive); "X or Y" of one observation is not a
hedge; hilar contours are not mediastinal contours; "cardiac and mediastinal silhouettes"
mentions both observations; pleural plaques are Pleural Other; "port-a-cath", stents and other
devices missing from CheXpert's list are Support Devices; tracheostomy tubes are devices only
(CheXpert also blocks "No Finding" with them); "pericardial effusion" blocks "No Finding"; an
empty report is all blank.

Speed: one pass of word-keyed pre-compiled regexes per report (no per-sentence loops over the
vocabulary): several thousand reports per second on one core.

Usage::

    from medheval.labelers.chexpert_rules import RuleLabeler, as_dict, label_report
    RuleLabeler().label(["No pneumothorax. Possible small left effusion."])
    as_dict(label_report("Mild cardiomegaly. ET tube in place."))
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections import defaultdict
from functools import lru_cache
from typing import Iterable, NamedTuple, Sequence

from medheval.labelers import CONDITIONS, Label
from medheval.scoring.text_cues import CHEXPERT_SENTENCES, CHEXPERT_TRIGGERS, FORWARD, sentence_ends
from medheval.scoring.text_cues import expand as _x
from medheval.scoring.text_cues import split_sentences as _split_sentences

__all__ = ["RuleLabeler", "label_report", "as_dict", "split_sentences", "POSITIVE", "NEGATIVE", "UNCERTAIN"]

POSITIVE, NEGATIVE, UNCERTAIN = 1, 0, -1

_IDX = {name: i for i, name in enumerate(CONDITIONS)}
_NO_FINDING = _IDX["No Finding"]
_SUPPORT = _IDX["Support Devices"]
_CARDIO = _IDX["Cardiomegaly"]
_OTHER = -1  # another abnormality: no label of its own, but it stops "No Finding"

# mention flags
_DESC = 1  # neutral heart/mediastinum descriptor: needs a size/appearance word; "stable" → uncertain
_ALWAYS_UNC = 2  # uncertain unless negated (vascular congestion …)
_CHF = 4  # congestive heart failure: a positive/uncertain mention adds an uncertain Cardiomegaly


# --------------------------------------------------------------------------------------------
# Mention vocabulary (this module's own lists). Each entry: (observation or _OTHER or None for a
# pure unmention, flags, patterns). Patterns are regexes over lower-cased text that start with a
# literal word; they are matched at word starts and must end at a word boundary.
# --------------------------------------------------------------------------------------------
_ECM, _CM = "Enlarged Cardiomediastinum", "Cardiomegaly"
_MENTIONS: list[tuple] = [
    # --- Enlarged Cardiomediastinum
    (_ECM, _DESC, ["mediastinum", "superior mediastinum", "cardiomediastinum", "pericardial silhouette",
                   *_x("contours?|contour|silhouettes?|configuration|width|shadows?|outlines?|size|borders?",
                       head="mediastinal "),
                   *_x("contours?|silhouettes?|shadows?|size|outlines?|borders?|configuration",
                       head="cardiomediastinal "),
                   *_x("contours?|silhouettes?", head="cardiomediastinal and hilar "),
                   *_x("contours?|silhouettes?", head="mediastinal and hilar ")]),
    (_ECM, 0, ["mediastinal widening", "mediastinal enlargement", "widened mediastinum"]),
    # --- Cardiomegaly
    (_CM, 0, ["cardiomegaly", "cardiac enlargement", "cardiac hypertrophy", "enlarged heart"]),
    (_CM, _DESC, ["heart", "heart sizes?", "size of the heart", "size of the cardiac silhouette",
                  *_x("silhouettes?|contours?|shadows?|size|outlines?", head="cardiac "),
                  "heart shadow", "heart contours?", "cardiothoracic ratio"]),
    # both at once: "cardiac and mediastinal silhouettes/contours"
    ((_CM, _ECM), _DESC, _x("silhouettes?|contours?|shadows?", head="cardiac and mediastinal ")
     + _x("silhouettes?|contours?", head="heart and mediastinal ")
     + _x("silhouettes?|contours?|shadows?", head="mediastinal and cardiac ")),
    # --- Lung Opacity
    ("Lung Opacity", 0, [
        r"opaci\w*", "haziness", "hazy", "haze", r"infiltrat\w*", r"reticula\w*", "reticulonodular",
        "ground glass", "ground-glass", "groundglass", r"scar", r"scars", r"scarring", r"scarred",
        *_x("disease|process|opaci\\w*|filling|abnormality", head="airspace "),
        *_x("disease|process|opaci\\w*|filling", head="air space "),
        *_x("disease|process|opaci\\w*|filling", head="air-space "),
        *_x("disease|process|filling", head="alveolar "),
        *_x("markings?|pattern|prominence|thickening|changes?|abnormalit\\w*|disease|lung disease|process"
            "|opaci\\w*|infiltrat\\w*", head="interstitial "),
        *_x("increased|patchy|hazy|streaky|linear|airspace|parenchymal|retrocardiac|basilar|bibasilar|"
            "perihilar|ill-defined|confluent|focal|mild|subtle", " densit\\w*"),
        "peribronchial thickening", "bronchial wall thickening", "peribronchovascular thickening",
        "decreased lucency", "decreased translucency", r"parenchymal abnormalit\w*",
    ]),
    # --- Lung Lesion
    ("Lung Lesion", 0, [
        r"mass", r"masses", r"nodules?", r"micronodul\w*", r"lumps?", "cavitary", "cavitation", "cavitating",
        r"carcinomas?", r"cancers?", r"neoplas\w*", r"tumou?rs?", r"malignan\w*",
        *_x("lesions?|foci|focus", head="nodular "),
        *_x("lung|pulmonary|parenchymal|spiculated|cavitary|cavitating|focal|nodular|apical", " lesions?"),
    ]),
    # "nodular opacity" is also an opacity (the lesion entry above consumes the words, so say it here)
    (("Lung Lesion", "Lung Opacity"), 0, [r"nodular opaci\w*", r"nodular densit\w*"]),
    # --- Edema
    ("Edema", 0, ["edema", "edematous", "oedema", "fluid overload", "volume overload",
                  "kerley lines", "kerley b lines", "kerley b-lines"]),
    ("Edema", _CHF, ["chf", "heart failure", "congestive heart failure", "cardiac failure",
                     "congestive cardiac failure", "congestive failure"]),
    ("Edema", _ALWAYS_UNC, [
        *_x("vascular|venous|pulmonary|central|hilar|perihilar|central venous|pulmonary vascular|"
            "pulmonary venous|interstitial", " congestion"),
        *_x("prominence|engorgement|redistribution|plethora|indistinctness|congestion|blurring",
            head="vascular "),
        *_x("engorged|prominent|indistinct|congested|distended|enlarged|blurred|ill-defined",
            " (?:pulmonary |hilar |central |central pulmonary )?(?:vascul\\w*|vessels?)"),
        "indistinctness", "indistinct hila", "indistinct hilar",
        "hilar indistinctness", "perihilar indistinctness",
    ]),
    # --- Consolidation
    ("Consolidation", 0, [r"consolidat\w*"]),
    # --- Pneumonia
    ("Pneumonia", 0, [r"pneumonias?", r"bronchopneumonias?", r"infections?", r"infectious", "infectious process",
                      "infective", "pneumonic"]),
    # --- Atelectasis
    ("Atelectasis", 0, [r"atelecta\w*", r"collaps\w*", "subsegmental atelectasis"]),
    # --- Pneumothorax
    ("Pneumothorax", 0, [r"pneumothora(?:x|xes|ces)", "ptx", "pneumothoracies",
                         r"air (?:in|within) the (?:left |right )?pleural spaces?"]),
    (("Pneumothorax", "Pleural Effusion"), 0, [r"hydropneumothora(?:x|xes|ces)"]),
    # --- Pleural Effusion
    ("Pleural Effusion", 0, [r"effusions?", "pleural fluid", r"hydrothora(?:x|ces)", r"hemothora(?:x|ces)",
                             r"haemothora(?:x|ces)", r"empyemas?",
                             "fluid in the fissure", "fluid in the fissures", "fluid within the fissure",
                             r"fluid (?:in|within) the (?:left |right )?pleural spaces?"]),
    # --- Pleural Other
    ("Pleural Other", 0, [
        *_x("thickening|scar|scars|scarring|plaques?|calcifications?|calcified plaques?|fibrosis|nodularity",
            head="pleural "),
        "fibrothorax", "fibrosis",
        *_x("scar|scars|scarring|thickening|changes?|opaci\\w*", head="pleuroparenchymal "),
        *_x("scar|scars|scarring|thickening|changes?", head="pleuro-parenchymal "),
        *_x("scar|scars|scarring|thickening|changes?", head="pleural-parenchymal "),
        *_x("cap|caps|capping|thickening|pleural cap|pleural caps|pleural capping|pleural thickening",
            head="apical "),
    ]),
    # --- Fracture
    ("Fracture", 0, [r"fractur\w*", "fx", "fxs"]),
    # --- Support Devices
    ("Support Devices", 0, [
        r"tubes?", "endotracheal", "ett", "et", "ng", "ngt", "og", "ogt", r"nasogastric", r"orogastric",
        "enteric", r"dobb?hoff", r"tracheostomy", r"trach", r"tracheotomy", "picc", "piccs", "cvc", "cvl",
        *_x("central|venous|arterial|ij|jugular|subclavian|femoral|dialysis|hickman|tunneled|tunnelled|"
            "swan-ganz|swan ganz|midline|infusion|pa|pulmonary artery|triple lumen|double lumen|"
            "catheter|vascular|access|support|monitoring", " lines?"),
        *_x("tips?|terminat\\w*|ends?|courses?|coursing|projects?|projecting|extends?|extending|"
            "overlies|overlying|in place|in position|in standard position|in unchanged position",
            head="lines? "),
        "lines and tubes", "tubes and lines", r"catheters?", r"cannula\w*", r"pacemakers?", r"pacers?",
        *_x("wires?|leads?|devices?|generator", head="pacing "),
        "icd", "aicd", r"defibrillators?", r"devices?", "apparatus", "hardware", r"plates?", r"screws?",
        r"arthroplast\w*", r"prosthe\w*", r"implants?", r"stents?", r"stent-grafts?", r"drains?", r"pigtails?",
        r"coils?", r"markers?", r"ports?", "port-a-cath", "portacath", r"mediports?", "lvad", "iabp",
        "intra-aortic balloon pump", "intraaortic balloon pump", "balloon pump", "impella", "ecmo",
        "loop recorder", r"electrodes?", "equipment", "tavr", "tavi", "mitraclip", "annuloplasty",
        *_x("replacement|prosthesis|repair", head="valve "),
        *_x("wires?|leads?", head="epicardial "), *_x("wires?|leads?", head="transvenous "),
        *_x("leads?|wires?", head="ekg "), *_x("leads?|wires?", head="ecg "),
        "guidewire", "guide wire", "sternal closure device",
    ]),
    # --- Other abnormalities: no label, but they stop "No Finding"
    (_OTHER, 0, [
        r"emphysema\w*", "copd", r"hyperinfla\w*", r"hyperexpan\w*", r"overinfla\w*", r"hyperluc\w*", r"bulla\w*",
        "bullous", r"blebs?", r"granulom\w*", r"calcifi\w*", "scoliosis", r"kyphos\w*", "kyphotic",
        r"degenerat\w*", r"spondylo\w*", r"osteophyt\w*", r"osteopeni\w*", r"osteoporo\w*", r"hernia\w*",
        "eventration", r"elevat\w*", "pneumomediastinum", "pneumoperitoneum", "free air", "free intraperitoneal air",
        *_x("air|emphysema|gas", head="subcutaneous "), r"metasta\w*", r"contusions?", r"hematomas?",
        r"haematomas?", r"hemorrhag\w*", r"haemorrhag\w*", "aspiration", r"bronchiecta\w*", "bronchitis",
        "bronchiolitis", "asthma", "airway disease", "airways disease", "reactive airway", "cuffing",
        "pulmonary hypertension", "pulmonary arterial hypertension", r"adenopath\w*", r"lymphadenopath\w*",
        "mediastinal shift", "tracheal deviation", r"deformit\w*", "volume loss", "lytic", "sclerotic",
        r"osteodystroph\w*", r"arthropath\w*", "arthritis", "foreign body", r"bullets?", "shrapnel",
        *_x("enlargement|prominence|fullness", head="hilar "), *_x("hila|hilum|hilus|hilar", head="prominent "),
        "azygos distension", "azygos distention", "pneumonitis", r"abscess\w*", "cephalization",
        "cephalisation",
        "fibrotic", r"aneurysm\w*", r"pneumatoceles?", "septal thickening", "septal lines", "thickening",
        "density", "densities",
        *_x("effusions?", head="pericardial "), *_x("effusions?", head="joint "),
        *_x("granulomas?|nodules?|nodular densit\\w*|lymph nodes?|nodes?", head="calcified "),
    ]),
    # --- pure unmentions (no observation)
    (None, 0, ["mass effect", "plate-like", "platelike", "plate like", "vertebral collapse",
               "vertebral body collapse", r"collapse of (?:a |the )?(?:\w+ )?vertebra\w*", "massive",
               r"fractured (?:\w+ ){0,2}wires?", r"wire fractures?"]),
]

# Triggers (negation, uncertainty, stable, terminators): medheval.scoring.text_cues.CHEXPERT_TRIGGERS, where the
# roles and entry kinds are described.
_TRIGGERS = CHEXPERT_TRIGGERS

# words after a comma that open a new assertion (end a forward scope there)
_ASSERT_WORDS = frozenset(
    "mild mildly moderate moderately severe severely small large minimal trace stable unchanged persistent "
    "new increased increasing decreased decreasing improved improving worsened worsening residual chronic "
    "slight slightly the there a an enlarged significant marked markedly extensive diffuse multiple several "
    "numerous few".split())
# verbs that separate a backward trigger from an earlier clause
_BACK_VERBS = frozenset("is are was were remains remain appears appear has have shows show demonstrates "
                        "demonstrate measures persists persist".split())
_CHAIN_WORDS = frozenset(("or",))
_VERSUS = frozenset(("versus", "vs"))
_ANDOR = frozenset(("and", "or", "nor"))
_CLAUSE_OPENERS = frozenset("the there this these it its".split())
_PREPOSITIONS = frozenset("and at in of on within with to from by for near along over".split())
_QUAL_POS = ("enlarg", "increas", "prominen", "widen", "dilat")
_QUAL_POS_WORDS = frozenset(("large", "larger", "big", "wide", "cardiomegaly", "hypertroph"))
_QUAL_OTHER_WORDS = frozenset(
    "normal normally unremarkable stable stably unchanged similar borderline top upper limits limit change "
    "changed changes constant wnl".split())

_WORD_RE = re.compile(r"[a-z0-9]+")
_CLAUSE_PUNCT_RE = re.compile(r"[;:,]")
_SLASH_RE = re.compile(r"\band/or\b|(?<=[a-z])/(?=[a-z])")
_PARA_RE = re.compile(r"\n[ \t\r\f\v]*\n|\n(?=[ \t]*(?:\d+[.)]|[-*\u2022]) )")
_HEADER_NO_RE = re.compile(r"\s*(?:findings|impression)\s*:\s*no\b")
_LEADING_LOOKBEHIND = re.compile(r"^(?:\(\?<[!=][^)]*\))+")
_LITERAL = re.compile(r"[a-z0-9]+")


def _key(pattern: str) -> str:
    """The dispatch key of a pattern: the first four letters of its leading literal word."""
    body = _LEADING_LOOKBEHIND.sub("", pattern)
    lit = _LITERAL.match(body)
    if lit is None:
        raise ValueError(f"pattern must start with a literal word: {pattern!r}")
    word = lit.group()
    if len(word) >= 4:
        return word[:4]
    rest = body[len(word):]
    if rest and not (rest[0] in " -'" or rest.startswith(("\\b", "(?=", "(?: ", "[- ]", "[ -]", "(?!"))):
        raise ValueError(f"pattern {pattern!r}: a leading word shorter than 4 letters must end there")
    return word


class _Table(NamedTuple):
    regexes: dict  # key -> compiled alternation (one capturing group per alternative)
    payloads: dict  # key -> list of payloads, by group number - 1


def _compile(entries: Iterable[tuple[str, object, int]]) -> _Table:
    """Group patterns by key; within a key, higher priority then longer patterns are tried first."""
    by_key: dict[str, list] = defaultdict(list)
    for pattern, payload, priority in entries:
        if re.compile(pattern).groups:
            raise ValueError(f"use non-capturing groups only: {pattern!r}")
        by_key[_key(pattern)].append((-priority, -len(pattern), pattern, payload))
    regexes, payloads = {}, {}
    for key, items in by_key.items():
        items.sort(key=lambda item: (item[0], item[1]))
        regexes[key] = re.compile("|".join(f"({pattern}(?![a-z0-9]))" for _, _, pattern, _ in items))
        payloads[key] = [payload for _, _, _, payload in items]
    return _Table(regexes, payloads)


@lru_cache(maxsize=None)
def _tables() -> tuple[_Table, _Table]:
    mentions = []
    for target, flags, patterns in _MENTIONS:
        if target is None:
            outputs, priority = (), 2
        else:
            names = target if isinstance(target, tuple) else (target,)
            outputs = tuple((_OTHER if n == _OTHER else _IDX[n], flags) for n in names)
            priority = 1 if target == _OTHER else 0
        mentions.extend((p, outputs, priority) for p in patterns)
    triggers = []
    for kind, roles, patterns in _TRIGGERS:
        priority = 1 if kind == "pseudo" else 0
        triggers.extend((p, (kind, roles), priority) for p in patterns)
    return _compile(mentions), _compile(triggers)


def _normalize(text: str) -> str:
    text = text.lower()
    if "\n" in text:
        text = _PARA_RE.sub(" . ", text)
    if "/" in text:
        text = _SLASH_RE.sub(lambda m: "or" if m.group() == "and/or" else " or ", text)
    if "." in text:
        text = text.replace("vs.", "vs").replace("e.g.", "eg").replace("i.e.", "ie").replace("approx.", "approx")
    return " ".join(text.split())


def split_sentences(text: str) -> list[str]:
    """Sentences of a report as this labeler sees them (after its normalisation, lower case)."""
    return _split_sentences(_normalize(text), CHEXPERT_SENTENCES)


class _Trig(NamedTuple):
    start: int
    end: int
    ws: int
    we: int
    roles: tuple


class _Mention(NamedTuple):
    start: int
    end: int
    ws: int
    we: int
    outputs: tuple
    text: str


_OPENERS = (",", " and", " or", " with")


def _opens_phrase(text: str, start: int) -> bool:
    """A hedge or negation ends an earlier forward scope only where it opens a new phrase
    ("no pneumonia, possible atelectasis"), not inside one ("no suspicious nodules")."""
    end = start  # the text before ``start`` less its trailing blanks, found without copying it
    while end and text[end - 1].isspace():
        end -= 1
    return text.endswith(_OPENERS, 0, end) or start == 0


def _clause_after(words: list[str], wstarts: list[int], comma: int) -> bool:
    """", and the …" / ", and there …" after a comma open a new clause (not the end of a list)."""
    j = bisect_left(wstarts, comma)
    return j + 1 < len(words) and words[j] in _ANDOR and words[j + 1] in _CLAUSE_OPENERS


def _free(cuts: list[int], a: int, b: int) -> bool:
    """True when no cut position lies in [a, b)."""
    i = bisect_left(cuts, a)
    return i == len(cuts) or cuts[i] >= b


class _Scan(NamedTuple):
    """Phase 1 of labelling: words, vocabulary hits and the word positions later phases need."""

    words: list[str]
    wstarts: list[int]
    mentions: list[tuple]  # (start, end, word index, outputs, text)
    triggers: list[tuple]  # (start, end, word index, (kind, roles))
    verb_pos: list[int]
    andor_pos: list[int]


class _Cuts(NamedTuple):
    """Phase 2: sentence bounds and the positions where scopes stop, per direction."""

    bounds: list[int]  # sentence starts
    soft: list[int]  # ";" and ":" (cut both directions)
    commas: list[int]
    fcuts: list[int]  # forward scopes stop here
    bcuts: list[int]  # backward scopes stop here
    pre_cuts: list[int]  # "pre" (forward) scopes stop here
    chain_cuts: list[int]  # "X or Y" chains stop here
    triggers: list[_Trig]  # triggers with roles


def _scan(text: str) -> _Scan:
    """One pass over the words: at each word start try the trigger and the mention tables (keyed by
    the word's first four letters), and note verbs and conjunctions."""
    mention_table, trigger_table = _tables()
    m_rx, m_pay = mention_table
    t_rx, t_pay = trigger_table
    scan = _Scan([], [], [], [], [], [])
    m_until = t_until = -1
    for i, wm in enumerate(_WORD_RE.finditer(text)):
        s = wm.start()
        w = wm.group()
        scan.words.append(w)
        scan.wstarts.append(s)
        key = w[:4]
        if s >= t_until:
            rx = t_rx.get(key)
            if rx is not None:
                hit = rx.match(text, s)
                if hit is not None:
                    t_until = hit.end()
                    scan.triggers.append((s, t_until, i, t_pay[key][hit.lastindex - 1]))
        if s >= m_until:
            rx = m_rx.get(key)
            if rx is not None:
                hit = rx.match(text, s)
                if hit is not None:
                    m_until = hit.end()
                    outputs = m_pay[key][hit.lastindex - 1]
                    if outputs:
                        scan.mentions.append((s, m_until, i, outputs, hit.group()))
        if w in _BACK_VERBS:
            scan.verb_pos.append(s)
        elif w in _ANDOR:
            scan.andor_pos.append(s)
    return scan


def _cuts(text: str, scan: _Scan) -> _Cuts:
    """Sentence bounds (:data:`medheval.scoring.text_cues.CHEXPERT_SENTENCES`) and scope cuts: ";"/":" both
    ways, a comma before an assertion word forward, terminators and phrase-opening triggers."""
    words, wstarts = scan.words, scan.wstarts
    bounds = [0, *sentence_ends(text, CHEXPERT_SENTENCES)]
    soft: list[int] = []
    commas: list[int] = []
    for pm in _CLAUSE_PUNCT_RE.finditer(text):
        (commas if pm.group() == "," else soft).append(pm.start())
    # "No pneumothorax, mild cardiomegaly": a comma followed by an assertion word ends forward scopes
    fcuts = list(soft)
    for c in commas:
        j = bisect_left(wstarts, c)
        if j < len(words) and words[j] in _ASSERT_WORDS:
            fcuts.append(c)
    bcuts = list(soft)
    pre_cuts: list[int] = []
    triggers: list[_Trig] = []
    for s, e, i, (kind, roles) in scan.triggers:
        if kind == "term":
            fcuts.append(s)
            bcuts.append(s)
        elif kind == "term_f":
            fcuts.append(s)
        else:
            if kind == "break" or (kind == "trig" and _opens_phrase(text, s)):
                fcuts.append(s)
            elif kind == "soft_pre":
                pre_cuts.append(s)
            if roles:
                triggers.append(_Trig(s, e, i, bisect_left(wstarts, e), roles))
    fcuts.extend(bounds[1:])
    bcuts.extend(bounds[1:])
    fcuts.sort()
    bcuts.sort()
    pre_cuts = sorted(fcuts + pre_cuts) if pre_cuts else fcuts
    chain_cuts = sorted(set(soft) | set(bounds[1:])
                        | {t[0] for t in scan.triggers if t[3][0] in ("term", "term_f")})
    return _Cuts(bounds, soft, commas, fcuts, bcuts, pre_cuts, chain_cuts, triggers)


def _or_members(text: str, words: list[str], mentions: list[_Mention], chain_cuts: list[int]) -> set[int]:
    """Indices of the mentions in an "X or Y", "X versus Y", "X, Y, or Z" chain: each is uncertain."""
    or_members: set[int] = set()
    order = sorted(range(len(mentions)), key=lambda k: mentions[k].start)
    group: list[int] = [order[0]]
    has_or = False
    for a, b in zip(order, order[1:]):
        ma, mb = mentions[a], mentions[b]
        link = None
        if mb.start >= ma.end and mb.ws - ma.we <= 4 and _free(chain_cuts, ma.end, mb.start):
            gap_words = set(words[ma.we:mb.ws])
            gap = text[ma.end:mb.start]
            if {o for o, _ in ma.outputs} == {o for o, _ in mb.outputs}:
                link = ","  # "pacemaker/ICD", "atelectasis or collapse": the same finding either way
            elif gap_words & _VERSUS:
                or_members.update((a, b))  # "versus" pairs two findings, it does not end a list
            elif gap_words & _CHAIN_WORDS and "with or without" not in gap and "whether or not" not in gap:
                link = "or"
            elif "," in gap and len(gap_words) <= 2 and not gap_words & _PREPOSITIONS:
                link = ","
            elif mb.start == ma.start or not gap_words - {"of", "the", "left", "right", "bilateral"}:
                link = ","
        if link is None:
            if has_or:
                or_members.update(group)
            group, has_or = [b], False
        else:
            group.append(b)
            has_or = has_or or link == "or"
    if has_or:
        or_members.update(group)
    return or_members


def _in_scope(m: _Mention, t: _Trig, kind: str, direction: str, window: int | None,
              scan: _Scan, cuts: _Cuts) -> bool:
    """Whether trigger ``t``'s role (kind, direction, window) reaches mention ``m``."""
    if direction == FORWARD:
        if t.end > m.start or (window is not None and m.ws - t.we > window):
            return False
        return _free(cuts.pre_cuts if kind == "pre" else cuts.fcuts, t.end, m.start)
    if m.end > t.start or (window is not None and t.ws - m.we > window):
        return False
    if not _free(cuts.bcuts, m.end, t.start):
        return False
    # a verb of an earlier clause separates them ("effusion is small and X has resolved");
    # the copula of the trigger's own clause ("X is now stable") does not
    if scan.verb_pos and not _free(scan.verb_pos, m.end, scan.wstarts[max(m.we, t.ws - 3)]):
        return False
    # a comma between them starts a new clause unless a list ("A, B and C are …") runs on
    commas = cuts.commas
    ci = bisect_left(commas, t.start) - 1
    if ci >= 0 and commas[ci] >= m.end and (_free(scan.andor_pos, commas[ci], t.start)
                                             or _clause_after(scan.words, scan.wstarts, commas[ci])):
        return False
    return True


class _Reach(NamedTuple):
    """The triggers of :class:`_Cuts` arranged so that a mention is checked against the few that can reach it.

    Forward, per role ``(kind, window)``: a later trigger reaches every mention an earlier one reaches (its
    window counts from nearer the mention, and a cut between it and the mention also lies between the
    earlier one and the mention), so only the last one ending before the mention is checked. Backward: only
    the triggers starting within the largest backward window after the mention (each starts at its own
    word). Checking every trigger of the sentence cost mentions x triggers checks in a long sentence of
    both ("no effusion no effusion …").
    """

    forward: dict[tuple[str, int | None], tuple[list[int], list[_Trig]]]  # role -> (ends, triggers), text order
    backward: list[_Trig]  # triggers with a backward role, text order
    backward_starts: list[int]
    backward_window: int | None  # the largest backward window (None: unbounded)


def _reach(triggers: list[_Trig]) -> _Reach:
    forward: dict[tuple[str, int | None], tuple[list[int], list[_Trig]]] = {}
    backward: list[_Trig] = []
    windows: list[int | None] = []
    for t in triggers:  # in text order, not overlapping
        for kind, direction, window in t.roles:
            if direction == FORWARD:
                ends, found = forward.setdefault((kind, window), ([], []))
                if not found or found[-1] is not t:
                    ends.append(t.end)
                    found.append(t)
            else:
                windows.append(window)
                if not backward or backward[-1] is not t:
                    backward.append(t)
    widest = None if None in windows else max(windows, default=0)
    return _Reach(forward, backward, [t.start for t in backward], widest)


_FEW_TRIGGERS = 16  # a report with no more triggers checks them all for each mention (cheaper than _Reach)


def _context(m: _Mention, s_start: int, s_end: int, scan: _Scan, cuts: _Cuts, reach: _Reach | None) -> set[str]:
    """The trigger kinds ("pre", "neg", "post", "stable") whose scope reaches mention ``m``: of the triggers
    overlapping its sentence, those whose role :func:`_in_scope` accepts (all of them checked when ``reach``
    is ``None``, else those :class:`_Reach` selects)."""
    kinds: set[str] = set()
    if reach is None:
        for t in cuts.triggers:
            if t.end > s_start and t.start < s_end:
                for kind, direction, window in t.roles:
                    if _in_scope(m, t, kind, direction, window, scan, cuts):
                        kinds.add(kind)
        return kinds
    for (kind, window), (ends, found) in reach.forward.items():
        last = bisect_right(ends, m.start) - 1
        if kind not in kinds and last >= 0:
            t = found[last]
            if t.end > s_start and _in_scope(m, t, kind, FORWARD, window, scan, cuts):
                kinds.add(kind)
    later = reach.backward
    j = bisect_left(reach.backward_starts, m.end)
    while j < len(later) and later[j].start < s_end and (
            reach.backward_window is None or later[j].ws - m.we <= reach.backward_window):
        t = later[j]
        for kind, direction, window in t.roles:
            if direction != FORWARD and _in_scope(m, t, kind, direction, window, scan, cuts):
                kinds.add(kind)
        j += 1
    return kinds


def _mention_value(kinds: set[str], unc: bool) -> int:
    """CheXpert's order: pre-negation uncertainty, then negation, then post-negation uncertainty."""
    if "pre" in kinds:
        return UNCERTAIN
    if "neg" in kinds:
        return NEGATIVE
    return UNCERTAIN if unc else POSITIVE


def _aggregate(labels: list[list[int]], no_finding: bool) -> list[Label]:
    """Per observation: positive beats uncertain beats negative; "No Finding" is 1 or blank."""
    out: list[Label] = [None] * len(CONDITIONS)
    for obs, values in enumerate(labels):
        if values:
            out[obs] = POSITIVE if POSITIVE in values else (UNCERTAIN if UNCERTAIN in values else NEGATIVE)
    out[_NO_FINDING] = POSITIVE if no_finding else None
    return out


def _label_text(raw: str) -> list[Label]:
    """Label one report: 14 values in CONDITIONS order.

    Phases: normalise; scan words for mentions and triggers (:func:`_scan`); sentence bounds and
    scope cuts (:func:`_cuts`); "X or Y" chains (:func:`_or_members`); per mention, the triggers
    in scope (:func:`_context`) and its value; aggregation (:func:`_aggregate`).
    """
    text = _normalize(raw)
    n_cond = len(CONDITIONS)
    if not text.strip(" .,;:!?"):
        return [None] * n_cond
    scan = _scan(text)
    mentions = [_Mention(s, e, i, bisect_left(scan.wstarts, e), outputs, txt)
                for s, e, i, outputs, txt in scan.mentions]
    if not mentions:
        out: list[Label] = [None] * n_cond
        out[_NO_FINDING] = POSITIVE
        return out
    cuts = _cuts(text, scan)
    bounds = cuts.bounds
    # sentence-level "Findings: no …" / "Impression: no …" rule
    header_no = {k for k, b in enumerate(bounds) if _HEADER_NO_RE.match(text, b)}
    or_members = _or_members(text, scan.words, mentions, cuts.chain_cuts)
    reach = _reach(cuts.triggers) if len(cuts.triggers) > _FEW_TRIGGERS else None

    labels: list[list[int]] = [[] for _ in range(n_cond)]
    no_finding = True
    for k, m in enumerate(mentions):
        sent = bisect_left(bounds, m.start + 1) - 1
        s_start = bounds[sent]
        s_end = bounds[sent + 1] if sent + 1 < len(bounds) else len(text)
        kinds = {"neg"} if sent in header_no else _context(m, s_start, s_end, scan, cuts, reach)
        post = "post" in kinds or k in or_members
        for obs, flags in m.outputs:
            if flags & _DESC:
                qual = _qualifier(scan.words, scan.wstarts, m, s_start, s_end, cuts.soft, cuts.commas)
                if qual is None:
                    continue  # a bare "heart" / "mediastinum": not a mention
                unc = post or ("stable" in kinds and qual != "pos")
            else:
                unc = post or bool(flags & _ALWAYS_UNC)
            value = _mention_value(kinds, unc)
            if value != NEGATIVE and obs != _SUPPORT:
                no_finding = False
            if obs == _OTHER:
                continue
            labels[obs].append(value)
            if flags & _CHF and value != NEGATIVE:
                labels[_CARDIO].append(UNCERTAIN)
    return _aggregate(labels, no_finding)


def _qualifier(words: list[str], wstarts: list[int], m: _Mention, s_start: int, s_end: int,
               soft: list[int], commas: list[int]) -> str | None:
    """For a neutral descriptor: "pos" (enlarged, widened …), "other" (normal, stable …) or None.

    Looks up to 6 words after and 4 before, inside the sentence and clause; an enlargement word
    behind a comma ("stable heart size, a widened mediastinum") only proves the mention exists."""
    found = None
    lo = max(0, m.ws - 4)
    hi = min(len(words), m.we + 6)
    for j in list(range(m.we, hi)) + list(range(m.ws - 1, lo - 1, -1)):
        pos = wstarts[j]
        if pos < s_start or pos >= s_end:
            continue
        if j >= m.we and not _free(soft, m.end, pos):
            continue
        if j < m.ws and not _free(soft, pos, m.start):
            continue
        w = words[j]
        if w.startswith(_QUAL_POS) or w in _QUAL_POS_WORDS:
            if (_free(commas, m.end, pos) if j >= m.we else _free(commas, pos, m.start)):
                return "pos"
            found = "other"
        if w in _QUAL_OTHER_WORDS:
            found = "other"
    return found


def label_report(text: str) -> list[Label]:
    """The 14 CheXpert labels of one report (CONDITIONS order): 1, 0, -1 or None."""
    return _label_text(text or "")


def as_dict(labels: Sequence[Label]) -> dict[str, Label]:
    """``{condition: label}`` for one 14-value label list."""
    if len(labels) != len(CONDITIONS):
        raise ValueError(f"expected {len(CONDITIONS)} labels (CONDITIONS order), got {len(labels)}")
    return dict(zip(CONDITIONS, labels))


class RuleLabeler:
    """CheXpert-14 rule labeler (no model, no network). See the module docstring for the rules."""

    name = "chexpert_rules"

    def __init__(self) -> None:
        _tables()  # compile once, up front

    def label(self, reports: Sequence[str]) -> list[list[Label]]:
        """One 14-value list per report, in :data:`medheval.labelers.CONDITIONS` order."""
        if isinstance(reports, str):
            raise TypeError("label() takes a sequence of reports; use label_report() for one string")
        return [_label_text(r or "") for r in reports]

    def __call__(self, reports: Sequence[str]) -> list[list[Label]]:
        return self.label(reports)

    def __repr__(self) -> str:
        return "RuleLabeler()"
