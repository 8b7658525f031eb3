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
from bisect import bisect_left
from collections import defaultdict
from functools import lru_cache
from typing import Iterable, NamedTuple, Sequence

from medheval.labelers import CONDITIONS, Label

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


def _x(heads: str, tail: str = "", head: str = "") -> list[str]:
    """Expand ``head + h + tail`` for every ``h`` in the ``|``-separated ``heads``."""
    return [f"{head}{h}{tail}" for h in heads.split("|")]


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

# --------------------------------------------------------------------------------------------
# Triggers. Roles: (kind, direction, window in words or None), kinds "pre" (pre-negation
# uncertainty), "neg", "post" (post-negation uncertainty), "stable" (post uncertainty for the
# neutral descriptors only). Entry kinds: "trig" (ends earlier forward scopes where it opens a new
# phrase: after a comma, "and", "or", "with"), "break" (always ends them), "soft" (never does),
# "soft_pre" (ends "pre" scopes only), "pseudo" (looks like a trigger, is none; consumes the text),
# "term" (ends scopes in both directions), "term_f" (ends forward scopes only).
# --------------------------------------------------------------------------------------------
_F, _B = "f", "b"
_END = r"(?=\s*(?:[.,;:!?]|$|(?:and|but|or|with|although|however)\b))"  # end of a clause
_COPULA = "is|are|was|were|remains?|remain|appears?|appear|seems?|seem|looks?|look|has been|have been|is now|are now"
_ADV = r"(?:(?:now|otherwise|again|still|overall|grossly|essentially|relatively|largely|entirely|completely|" \
       r"within|stably|also|likely|probably|largely) )?"

_TRIGGERS: list[tuple] = [
    # ---- pseudo triggers (consume the text; "no change" is a stable-appearance trigger)
    ("pseudo", (), ["not only", "whether or not", "with or without", "gram negative", "no sooner",
                    "not necessarily"]),
    ("trig", (("stable", _F, 6),), [
        r"no (?:(?:significant|substantial|appreciable|definite|major|interval|other|gross|notable|"
        r"significant interval|appreciable interval|relevant) )?(?:changes?|difference)",
        r"without (?:(?:significant|substantial|appreciable|interval|significant interval) )?(?:changes?|difference)",
    ]),
    ("trig", (), [  # "no increase in effusion": the effusion is there
        r"no (?:(?:significant|substantial|appreciable|definite|interval|further|significant interval|"
        r"appreciable interval|radiographic) )?(?:increase|decrease|worsening|progression|improvement|shift|"
        r"evolution|growth|reduction|enlargement in size)",
        r"without (?:(?:significant|substantial|appreciable|interval|further) )?"
        r"(?:increase|decrease|worsening|progression|improvement|evolution|growth)",
    ]),
    # ---- stable / unchanged (uncertain for the neutral heart/mediastinum descriptors only)
    ("trig", (("stable", _F, 5), ("stable", _B, 8)), [
        "stable", "stably", "unchanged", "similar", "constant", "grossly stable", "grossly unchanged",
        "little changed", "not changed", "essentially unchanged", "essentially stable",
        *_x("stable|unchanged|similar", " in appearance"), *_x("stable|unchanged|similar", " appearance"),
    ]),
    ("trig", (("stable", _B, 8),), [
        *_x("has|have", r" not (?:significantly |substantially |appreciably )?changed"),
        r"not (?:been )?(?:significantly |substantially |appreciably )?changed",
        *_x("is|are", r" similar to (?:the )?(?:prior|previous)"),
    ]),
    # ---- pre-negation uncertainty
    ("trig", (("pre", _F, None),), [
        *_x("cannot|can not|could not|can't|may not|is not possible to|not able to|unable to|difficult to",
            r" (?:entirely |completely |definitely |totally |reliably )?(?:exclude|rule out)"),
        r"no evidence to rule out", "not excluding", "not ruling out",
    ]),
    ("trig", (("pre", _B, 10),), [
        *_x("cannot|can not|could not|can't|may not", r" be (?:entirely |completely |definitely |totally |"
            r"reliably |fully )?(?:excluded|ruled out)"),
        r"not (?:be )?(?:entirely |completely |definitely |totally |fully )?(?:excluded|ruled out)",
        r"is not (?:entirely |completely |definitely |totally |fully )?(?:excluded|ruled out)",
    ]),
    # "no new X" is uncertain (CheXpert); the "no" still negates what follows further on
    ("trig", (("pre", _F, None), ("neg", _F, None)), [
        r"no (?:(?:definite|significant|other|focal|acute|obvious|convincing|large|appreciable|clear|"
        r"definitive|gross) )?new",
        r"no new (?:areas?|foci|focus|sites?|regions?) of",
        "without new", "without any new",
    ]),
    # ---- negation, forward
    ("trig", (("neg", _F, None),), [
        "no", "without", "neither", "nor", "no evidence of", "no evidence for", "no signs? of",
        "negative for", "free of", "clear of", "clearing of", "absence of", "resolution of",
        "interval resolution of", "removal of", "interval removal of", "rule out", "to exclude", "exclude",
        "excludes", "none", "lack of", "lacks", "no longer any", "no sign of",
    ]),
    ("trig", (("neg", _F, 4),), ["not", "rather than", "instead of", "normal", "unremarkable"]),
    ("trig", (("neg", _F, 4), ("neg", _B, 8)), ["top normal", "top-normal", "high normal", "high-normal",
                                               "upper normal"]),
    ("trig", (("neg", _F, 3),), ["history of", "absent"]),
    # "no opacity to suggest pneumonia": what the absent finding would have suggested is absent too
    ("break", (("neg", _F, 6),), _x("suggest|indicate|explain|account for|support|represent", head="to ")),
    ("trig", (("neg", _F, 3), ("neg", _B, 8)), ["resolved", "removed"]),
    # ---- negation, backward
    ("trig", (("neg", _B, 8),), [
        r"not (?:definitely |clearly |convincingly |definitively |significantly |substantially |currently )?"
        r"(?:seen|identified|demonstrated|present|evident|detected|observed|noted|visible|apparent|"
        r"appreciated|appreciable|enlarged|widened|increased|dilated|shown|found|depicted|visualised)",
        r"no longer (?:clearly )?(?:seen|visualized|visualised|visible|present|evident|identified|"
        r"demonstrated|apparent|noted|appreciated|detected|appreciable)",
        "no longer", *_x("has|have", r" (?:since |now |completely |nearly )?(?:resolved|cleared|disappeared)"),
        *_x("has|have", r" been (?:removed|withdrawn|discontinued|resolved|taken out)"),
        "cleared", "disappeared", "ruled out", "excluded", "is absent", "are absent",
        *_x("is|are|was|were", r" (?:now )?(?:gone|negative)"),
        *_x(_COPULA, f" {_ADV}(?:normal|unremarkable|within normal limits|within the normal range|"
                     r"normal in (?:size|caliber|configuration|appearance|contour))"),
        *_x("appears?|appear|seems?|seem", r" to be (?:normal|unremarkable|within normal limits)"),
        "within normal limits", "within the normal range", "within normal range", "wnl",
        *_x("at|near", r" (?:the )?upper limits? of normal"), r"upper limits? of normal",
        "normal in size", "normal in caliber", "normal" + _END, "unremarkable" + _END,
        r"of normal (?:size|caliber|configuration|appearance|contours?|width)",
        r"normal (?:size|caliber|configuration|appearance|contours?|width)" + _END,
    ]),
    # ---- post-negation uncertainty, forward (hedges: they end other forward scopes)
    ("trig", (("post", _F, None),), [
        "possible", "possibly", "probable", "probably", "likely", "most likely", "more likely", "less likely",
        "presumed", "presumably", "presumptive", "questionable", "questionably", "question of", "suspect",
        "suspected", "suspicious", "suspicion of", "suspicion for",
        "cannot be determined", "perhaps", "maybe", "favor", "favored", "favoring", "favour", "favoured",
        "consider", "considered", "considering", "possibility of", "possibilities include", "equivocal",
        "indeterminate", "uncertain", "differential diagnosis", "differential",
        "correlate clinically", "clinical correlation", "correlate", "concern", "query",
        "can represent", "can reflect", "versus", "potential", "potentially",
    ]),
    # "suggesting" ends a "no new" scope but not a negation: "no new opacity suggesting pneumonia" → 0
    ("soft_pre", (("post", _F, 6),), [r"suggest\w*"]),
    ("soft", (("post", _F, 6),), [  # non-breaking: "no findings concerning for pneumonia" stays negative
        "concerning for", r"concerns? for", r"concerns? of", "worrisome for", "worrying for",
        "secondary to", "raising the possibility of", "raises the possibility of", "representing",
        "may", "might", "could", "would",
    ]),
    ("soft", (("post", _F, 3),), [r"obscur\w*"]),
    ("trig", (("post", _F, None), ("post", _B, 4)), ["borderline"]),
    ("soft", (("post", _F, 3), ("post", _B, 3)), ["if any"]),
    # ---- post-negation uncertainty, backward
    ("trig", (("post", _B, 8),), [
        *_x("is|are|was|were", r" (?:most |more |less |also |very )?(?:likely|possible|probable|suspected|"
            r"questioned|favored|favoured|considered|uncertain|equivocal|questionable|not excluded)" + _END),
        *_x("may|might|could|can", r" (?:also )?be (?:present|seen|noted|considered|possible|included)"),
        *_x("is|are", r" (?:partially |partly |largely |completely )?obscured"),
        r"poorly (?:seen|visualized|visualised|evaluated|assessed)",
        r"incompletely (?:seen|visualized|visualised|evaluated|assessed)",
        r"not (?:well|clearly|adequately|fully|optimally) (?:seen|visualized|visualised|evaluated|assessed|"
        r"appreciated|demonstrated|characterized)",
        r"not (?:visualized|visualised|evaluated|assessed)",
        *_x("cannot|can not|could not", r" be (?:evaluated|assessed|excluded with certainty)"),
        r"difficult to (?:evaluate|assess|see)", *_x("likely|possible|suspected|questionable", _END),
    ]),
    # ---- terminators
    ("term", (), ["but", "however", "although", "though", "whereas", "which", "except", "aside from",
                  "apart from", "other than", "besides", "while", "yet"]),
    ("term", (), [r"and(?= (?:there|this|these|it|its)\b)"]),
    ("term_f", (), [
        r"there (?:is|are|was|were|has been|have been|remains?)",
        r"and(?= (?:the|a|an|mild|mildly|moderate|moderately|severe|severely|small|large|"
        r"minimal|trace|stable|unchanged|persistent|new|increased|increasing|decreased|decreasing|improved|"
        r"improving|worsened|worsening|residual|chronic|slight|slightly|enlarged|significant)\b)",
        r"and(?=(?: [a-z0-9-]+){1,3}? (?:is|are|was|were|remains?|appears?|has|have|persists?|demonstrates?)\b)",
        r"(?<!consistent )(?<!compatible )(?<!associated )(?<!along )with",
    ]),
]

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
_PUNCT_RE = re.compile(r"[.!?](?=\s|$)|[;:,]")
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
    text = _normalize(text)
    out, start = [], 0
    for m in _PUNCT_RE.finditer(text):
        if m.group() in ".!?":
            piece = text[start:m.end()].strip()
            if piece.strip(" .!?"):
                out.append(piece)
            start = m.end()
    piece = text[start:].strip()
    if piece.strip(" .!?"):
        out.append(piece)
    return out


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
    return text[:start].rstrip().endswith(_OPENERS) or start == 0


def _clause_after(words: list[str], wstarts: list[int], comma: int) -> bool:
    """", and the …" / ", and there …" after a comma open a new clause (not the end of a list)."""
    j = bisect_left(wstarts, comma)
    return j + 1 < len(words) and words[j] in _ANDOR and words[j + 1] in _CLAUSE_OPENERS


def _free(cuts: list[int], a: int, b: int) -> bool:
    """True when no cut position lies in [a, b)."""
    i = bisect_left(cuts, a)
    return i == len(cuts) or cuts[i] >= b


def _label_text(raw: str) -> list[Label]:
    """Label one report: 14 values in CONDITIONS order."""
    text = _normalize(raw)
    n_cond = len(CONDITIONS)
    if not text.strip(" .,;:!?"):
        return [None] * n_cond
    mention_table, trigger_table = _tables()
    m_rx, m_pay = mention_table
    t_rx, t_pay = trigger_table

    words: list[str] = []
    wstarts: list[int] = []
    raw_mentions: list[tuple] = []
    raw_triggers: list[tuple] = []
    verb_pos: list[int] = []
    andor_pos: list[int] = []
    m_until = t_until = -1
    for i, wm in enumerate(_WORD_RE.finditer(text)):
        s = wm.start()
        w = wm.group()
        words.append(w)
        wstarts.append(s)
        key = w[:4]
        if s >= t_until:
            rx = t_rx.get(key)
            if rx is not None:
                hit = rx.match(text, s)
                if hit is not None:
                    t_until = hit.end()
                    raw_triggers.append((s, t_until, i, t_pay[key][hit.lastindex - 1]))
        if s >= m_until:
            rx = m_rx.get(key)
            if rx is not None:
                hit = rx.match(text, s)
                if hit is not None:
                    m_until = hit.end()
                    outputs = m_pay[key][hit.lastindex - 1]
                    if outputs:
                        raw_mentions.append((s, m_until, i, outputs, hit.group()))
        if w in _BACK_VERBS:
            verb_pos.append(s)
        elif w in _ANDOR:
            andor_pos.append(s)

    n = len(text)
    bounds = [0]  # sentence starts
    soft: list[int] = []  # cuts in both directions
    commas: list[int] = []
    for pm in _PUNCT_RE.finditer(text):
        ch = pm.group()
        if ch == ",":
            commas.append(pm.start())
        elif ch in ";:":
            soft.append(pm.start())
        else:
            bounds.append(pm.end())
    # "No pneumothorax, mild cardiomegaly": a comma followed by an assertion word ends forward scopes
    fcuts = list(soft)
    for c in commas:
        j = bisect_left(wstarts, c)
        if j < len(words) and words[j] in _ASSERT_WORDS:
            fcuts.append(c)
    bcuts = list(soft)
    pre_cuts: list[int] = []
    triggers: list[_Trig] = []
    for s, e, i, (kind, roles) in raw_triggers:
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
    chain_cuts = sorted(set(soft) | set(bounds[1:]) | {t[0] for t in raw_triggers if t[3][0] in ("term", "term_f")})

    mentions = [_Mention(s, e, i, bisect_left(wstarts, e), outputs, txt) for s, e, i, outputs, txt in raw_mentions]
    if not mentions:
        out: list[Label] = [None] * n_cond
        out[_NO_FINDING] = POSITIVE
        return out

    # sentence-level "Findings: no …" / "Impression: no …" rule
    header_no = {k for k, b in enumerate(bounds) if _HEADER_NO_RE.match(text, b)}

    # "X or Y", "X versus Y", "X, Y, or Z": every member of such a chain is uncertain
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

    labels: list[list[int]] = [[] for _ in range(n_cond)]
    no_finding = True
    for k, m in enumerate(mentions):
        sent = bisect_left(bounds, m.start + 1) - 1
        s_start = bounds[sent]
        s_end = bounds[sent + 1] if sent + 1 < len(bounds) else n
        pre = neg = post = stable = False
        if sent in header_no:
            neg = True
        else:
            for t in triggers:
                if t.end <= s_start or t.start >= s_end:
                    continue
                for kind, direction, window in t.roles:
                    if direction == _F:
                        if t.end > m.start or (window is not None and m.ws - t.we > window):
                            continue
                        if not _free(pre_cuts if kind == "pre" else fcuts, t.end, m.start):
                            continue
                    else:
                        if m.end > t.start or (window is not None and t.ws - m.we > window):
                            continue
                        if not _free(bcuts, m.end, t.start):
                            continue
                        # a verb of an earlier clause separates them ("effusion is small and X has resolved");
                        # the copula of the trigger's own clause ("X is now stable") does not
                        if verb_pos and not _free(verb_pos, m.end, wstarts[max(m.we, t.ws - 3)]):
                            continue
                        # a comma between them starts a new clause unless a list ("A, B and C are …") runs on
                        ci = bisect_left(commas, t.start) - 1
                        if ci >= 0 and commas[ci] >= m.end and (_free(andor_pos, commas[ci], t.start)
                                                                 or _clause_after(words, wstarts, commas[ci])):
                            continue
                    if kind == "pre":
                        pre = True
                    elif kind == "neg":
                        neg = True
                    elif kind == "post":
                        post = True
                    else:
                        stable = True
        if k in or_members:
            post = True
        for obs, flags in m.outputs:
            if flags & _DESC:
                qual = _qualifier(words, wstarts, m, s_start, s_end, soft, commas)
                if qual is None:
                    continue  # a bare "heart" / "mediastinum": not a mention
                unc = post or (stable and qual != "pos")
            else:
                unc = post or bool(flags & _ALWAYS_UNC)
            if pre:
                value = UNCERTAIN
            elif neg:
                value = NEGATIVE
            elif unc:
                value = UNCERTAIN
            else:
                value = POSITIVE
            if value != NEGATIVE and obs != _SUPPORT:
                no_finding = False
            if obs == _OTHER:
                continue
            labels[obs].append(value)
            if flags & _CHF and value != NEGATIVE:
                labels[_CARDIO].append(UNCERTAIN)

    out = [None] * n_cond
    for obs, values in enumerate(labels):
        if values:
            out[obs] = POSITIVE if POSITIVE in values else (UNCERTAIN if UNCERTAIN in values else NEGATIVE)
    out[_NO_FINDING] = POSITIVE if no_finding else None
    return out


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
