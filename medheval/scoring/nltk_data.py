# Copyright 2025 The MedHEval-HF authors. Licensed under the Apache License, Version 2.0.
"""Offline NLTK data for the text-generation metrics: WordNet (METEOR) and the word tokenizer.

NLTK's downloader needs network access to ``raw.githubusercontent.com``, which this project's
machines (and many hospital machines) do not have. Two pieces of NLTK data matter here:

* **WordNet 3.0**, used by METEOR's synonym stage. Debian ships the WordNet 3.0 database
  (``wordnet-base`` + ``wordnet-sense-index``, files in ``/usr/share/wordnet``); NLTK's
  ``WordNetCorpusReader`` reads the same files, plus a ``lexnames`` file that no Debian package
  ships (its 45 lines are the table of the ``lexnames(5WN)`` man page, reproduced in
  :data:`LEXNAMES`). :func:`build_wordnet` copies the 13 needed files into
  ``<root>/corpora/wordnet/`` and writes ``lexnames`` and the WordNet licence next to them.
  Files are copied, never symlinked: NLTK >= 3.9.3 resolves corpus paths and refuses any that
  leave its data roots.
* **punkt_tab** (English sentence splitter), used by ``nltk.word_tokenize``. It is not on PyPI
  nor in Debian. :func:`word_tokenizer` splits sentences with the trained model when it is installed
  and otherwise with the data-free equivalent: an *untrained* ``PunktSentenceTokenizer`` (sentence
  breaks at ``.``/``?``/``!`` before white space; no learned abbreviation list); each sentence then
  gets NLTK 3.9's ``NLTKWordTokenizer`` rules (:mod:`medheval.scoring.nltk39`). The two splitters differ only where
  the trained English model knows an abbreviation
  (``e.g.``, ``Dr.``): the data-free splitter may end a sentence there, which moves the final
  period of that "sentence" into its own token. The metrics report which tokenizer ran.

Command line (the Makefile's install step runs it)::

    python -m medheval.scoring.nltk_data                    # build <venv>/nltk_data/corpora/wordnet if possible
    python -m medheval.scoring.nltk_data --apt              # ... and apt-get install the Debian packages (root only)
    python -m medheval.scoring.nltk_data --target DIR       # another NLTK data root
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

from medheval.scoring import nltk39

#: Where Debian's ``wordnet-base`` / ``wordnet-sense-index`` put the WordNet 3.0 database.
DEBIAN_WORDNET_DIR = Path("/usr/share/wordnet")
#: Debian packages that hold the 13 files below (``index.sense`` comes from the second one).
DEBIAN_PACKAGES = ("wordnet-base", "wordnet-sense-index")
#: The database files ``nltk.corpus.reader.WordNetCorpusReader`` opens (``data.*`` lazily).
WORDNET_FILES = (
    "data.adj",
    "data.adv",
    "data.noun",
    "data.verb",
    "index.adj",
    "index.adv",
    "index.noun",
    "index.verb",
    "index.sense",
    "adj.exc",
    "adv.exc",
    "noun.exc",
    "verb.exc",
)
#: WordNet 3.0 lexicographer files: (number, name, syntactic category 1 noun, 2 verb, 3 adj, 4 adv),
#: as listed in the ``lexnames(5WN)`` man page of WordNet 3.0 (Debian ``wordnet-base``).
LEXNAMES = (
    (0, "adj.all", 3), (1, "adj.pert", 3), (2, "adv.all", 4), (3, "noun.Tops", 1),
    (4, "noun.act", 1), (5, "noun.animal", 1), (6, "noun.artifact", 1), (7, "noun.attribute", 1),
    (8, "noun.body", 1), (9, "noun.cognition", 1), (10, "noun.communication", 1), (11, "noun.event", 1),
    (12, "noun.feeling", 1), (13, "noun.food", 1), (14, "noun.group", 1), (15, "noun.location", 1),
    (16, "noun.motive", 1), (17, "noun.object", 1), (18, "noun.person", 1), (19, "noun.phenomenon", 1),
    (20, "noun.plant", 1), (21, "noun.possession", 1), (22, "noun.process", 1), (23, "noun.quantity", 1),
    (24, "noun.relation", 1), (25, "noun.shape", 1), (26, "noun.state", 1), (27, "noun.substance", 1),
    (28, "noun.time", 1), (29, "verb.body", 2), (30, "verb.change", 2), (31, "verb.cognition", 2),
    (32, "verb.communication", 2), (33, "verb.competition", 2), (34, "verb.consumption", 2),
    (35, "verb.contact", 2), (36, "verb.creation", 2), (37, "verb.emotion", 2), (38, "verb.motion", 2),
    (39, "verb.perception", 2), (40, "verb.possession", 2), (41, "verb.social", 2), (42, "verb.stative", 2),
    (43, "verb.weather", 2), (44, "adj.ppl", 3),
)
_DEBIAN_COPYRIGHT = Path("/usr/share/doc/wordnet-base/copyright")
_WORDNET_NOTICE = (
    "WordNet 3.0 Copyright 2006 by Princeton University. All rights reserved.\n"
    "Distributed under the WordNet 3.0 license: https://wordnet.princeton.edu/license-and-commercial-use\n"
    "Files copied from Debian's wordnet-base / wordnet-sense-index packages by medheval.scoring.nltk_data;\n"
    "'lexnames' written from the lexnames(5WN) man page.\n"
)


def default_data_root() -> Path:
    """``<sys.prefix>/nltk_data``: inside the active virtual environment, and on NLTK's default search path."""
    return Path(sys.prefix) / "nltk_data"


def lexnames_text() -> str:
    """The content of WordNet's ``lexnames`` file (``NN<TAB>name<TAB>pos`` per line)."""
    return "".join(f"{number:02d}\t{name}\t{pos}\n" for number, name, pos in LEXNAMES)


def _missing(directory: Path, names) -> list[str]:
    return [name for name in names if not (directory / name).is_file()]


def build_wordnet(target_root: str | os.PathLike | None = None, source: str | os.PathLike = DEBIAN_WORDNET_DIR) -> Path:
    """Copy a WordNet 3.0 database (Debian layout) into ``<target_root>/corpora/wordnet``.

    Returns the corpus directory. Raises ``FileNotFoundError`` naming the missing files (and the
    Debian packages that provide them) when ``source`` is incomplete. The copy goes to a
    temporary sibling directory first, so an interrupted build never leaves a half corpus.
    """
    target_root = Path(target_root) if target_root is not None else default_data_root()
    source = Path(source)
    missing = _missing(source, WORDNET_FILES)
    if missing:
        raise FileNotFoundError(
            f"WordNet files missing in {source}: {', '.join(missing)}. Install them with "
            f"`apt-get install {' '.join(DEBIAN_PACKAGES)}` (Debian/Ubuntu) or pass source= a folder "
            f"holding the WordNet 3.0 dict files."
        )
    corpora = target_root / "corpora"
    corpora.mkdir(parents=True, exist_ok=True)
    final = corpora / "wordnet"
    staging = Path(tempfile.mkdtemp(prefix=".wordnet-", dir=corpora))
    try:
        for name in WORDNET_FILES:
            shutil.copyfile(source / name, staging / name)
        (staging / "lexnames").write_text(lexnames_text(), encoding="utf-8")
        notice = _WORDNET_NOTICE
        if _DEBIAN_COPYRIGHT.is_file():
            notice += "\n" + _DEBIAN_COPYRIGHT.read_text(encoding="utf-8", errors="replace")
        (staging / "LICENSE").write_text(notice, encoding="utf-8")
        os.chmod(staging, 0o755)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return final


def wordnet_dir_complete(corpus_dir: str | os.PathLike) -> bool:
    """True when ``corpus_dir`` holds every file NLTK's WordNet reader opens."""
    return not _missing(Path(corpus_dir), WORDNET_FILES + ("lexnames",))


def _nltk_search_roots() -> list[Path]:
    roots = []
    for var in ("MEDHEVAL_NLTK_DATA", "NLTK_DATA"):
        roots += [Path(p) for p in os.environ.get(var, "").split(os.pathsep) if p]
    try:
        import nltk.data

        roots += [Path(str(getattr(p, "path", p))) for p in nltk.data.path]
    except ImportError:
        pass
    roots.append(default_data_root())
    unique = []
    for root in roots:
        if root not in unique:
            unique.append(root)
    return unique


def find_wordnet(roots=None) -> Path | None:
    """The first ``<root>/corpora/wordnet`` holding a complete database. ``roots``: only these NLTK data
    roots; default ``$MEDHEVAL_NLTK_DATA``, ``$NLTK_DATA``, ``nltk.data.path``, ``<sys.prefix>/nltk_data``."""
    for root in [Path(r) for r in roots] if roots is not None else _nltk_search_roots():
        corpus = root / "corpora" / "wordnet"
        if wordnet_dir_complete(corpus):
            return corpus
    return None


@functools.lru_cache(maxsize=4)
def _load_wordnet_reader(corpus_dir: str):
    import nltk.data
    from nltk.corpus.reader.wordnet import WordNetCorpusReader

    root = str(Path(corpus_dir).parent.parent)
    # NLTK's path sandbox only opens files under a registered data root.
    if root not in [str(getattr(p, "path", p)) for p in nltk.data.path]:
        nltk.data.path.append(root)
    with warnings.catch_warnings():  # "multilingual functions are not available": no OMW, not needed
        warnings.simplefilter("ignore", UserWarning)
        reader = WordNetCorpusReader(corpus_dir, None)
    reader.synsets("effusion")  # touch the lazily read data files now, not mid-metric
    return reader


def load_wordnet(roots=None):
    """``(reader, None)`` with a ready ``WordNetCorpusReader``, or ``(None, reason)``.

    ``roots`` as in :func:`find_wordnet`. The reason says where it looked and how to build the
    corpus. Readers are cached per path (loading WordNet takes a few seconds).
    """
    try:
        import nltk  # noqa: F401
    except ImportError:
        return None, "nltk is not installed (pip install medheval: it is one of its dependencies)"
    corpus = find_wordnet(roots)
    if corpus is None:
        searched = [Path(r) for r in roots] if roots is not None else _nltk_search_roots()
        return None, (
            "WordNet (needed by METEOR) was not found under corpora/wordnet in any of: "
            f"{', '.join(str(r) for r in searched)}. Build it offline with "
            f"`apt-get install {' '.join(DEBIAN_PACKAGES)}` then `python -m medheval.scoring.nltk_data` "
            "(`make install` does both when run as root)."
        )
    try:
        return _load_wordnet_reader(str(corpus.resolve())), None
    except Exception as err:  # noqa: BLE001 -- a corrupt or partial corpus: say which and why
        return None, f"WordNet at {corpus} could not be read: {type(err).__name__}: {err}"


def word_tokenizer():
    """``(tokenize, name)``: ``nltk.word_tokenize`` as NLTK 3.9 tokenises (:func:`medheval.scoring.nltk39.word_tokenize`:
    trained Punkt sentences when punkt_tab is installed, else the data-free splitter described in the module
    docstring). ``name`` says which sentence splitter ran."""
    return nltk39.word_tokenize, nltk39.tokenizer_name()


def _apt_install(packages) -> str | None:
    """Run ``apt-get update`` + ``apt-get install -y``; return None on success, else why not."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root, so apt-get was not tried"
    if shutil.which("apt-get") is None:
        return "apt-get is not available on this machine"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *packages]):
        print("+ " + " ".join(cmd), flush=True)
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, check=False)
        if done.returncode != 0:
            return f"`{' '.join(cmd)}` failed ({done.returncode}): {done.stderr.strip()[-500:]}"
    return None


def prepare(target_root=None, source=DEBIAN_WORDNET_DIR, apt: bool = False, force: bool = False) -> tuple[Path | None, str]:
    """Make WordNet available offline in ``target_root`` (default ``<sys.prefix>/nltk_data``).

    Does nothing when a complete corpus is already there (unless ``force``). Otherwise copies it
    from ``source``; when ``source`` lacks the files and ``apt`` is true, installs
    :data:`DEBIAN_PACKAGES` first (root only). Returns ``(corpus_dir or None, message)``; never raises
    for a machine that cannot get WordNet, so an install step can go on (METEOR is then reported
    unavailable by the metric).
    """
    target_root = Path(target_root) if target_root is not None else default_data_root()
    existing = target_root / "corpora" / "wordnet"
    if not force and wordnet_dir_complete(existing):
        return existing, f"WordNet already present in {existing}"
    source = Path(source)
    if _missing(source, WORDNET_FILES) and apt:
        why = _apt_install(DEBIAN_PACKAGES)
        if why is not None:
            return None, f"WordNet not installed: {why}. METEOR will be reported as unavailable."
    try:
        corpus = build_wordnet(target_root, source)
    except FileNotFoundError as err:
        return None, f"{err} METEOR will be reported as unavailable until then."
    return corpus, f"WordNet 3.0 copied from {source} into {corpus}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m medheval.scoring.nltk_data", description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=None, help="NLTK data root (default: <sys.prefix>/nltk_data)")
    parser.add_argument("--source", default=str(DEBIAN_WORDNET_DIR), help="folder with the WordNet 3.0 dict files")
    parser.add_argument("--apt", action="store_true", help="apt-get install the Debian packages if missing (root only)")
    parser.add_argument("--force", action="store_true", help="rebuild even when a corpus is already there")
    parser.add_argument("--strict", action="store_true", help="exit 1 when WordNet could not be made available")
    args = parser.parse_args(argv)
    corpus, message = prepare(args.target, args.source, apt=args.apt, force=args.force)
    print(f"medheval.scoring.nltk_data: {message}", flush=True)
    if corpus is not None:
        reader, why = load_wordnet([corpus.parent.parent])
        if reader is None:
            print(f"medheval.scoring.nltk_data: {why}", file=sys.stderr)
            return 1
        print(f"medheval.scoring.nltk_data: WordNet {reader.get_version()} loads with NLTK", flush=True)
    print(
        "medheval.scoring.nltk_data: word tokenizer: "
        + ("nltk.word_tokenize (punkt_tab)" if nltk39.punkt_available() else "data-free Punkt + NLTKWordTokenizer (punkt_tab not installed)"),
        flush=True,
    )
    return 1 if corpus is None and args.strict else 0


if __name__ == "__main__":
    sys.exit(main())
