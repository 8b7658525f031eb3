"""The README and the pages under docs/ link to each other: every relative link names a file that exists and,
where it carries a ``#fragment``, a heading of that file (GitHub's anchor rule: lower-case, punctuation other
than ``-``/``_`` dropped, spaces to ``-``)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def github_anchor(heading: str) -> str:
    """GitHub's heading id: strip markup, lower-case, drop punctuation but ``-``/``_``, spaces become ``-``."""
    text = re.sub(r"`|\*\*?|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    body = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*)$", body, re.M)}


def test_github_anchor_known_answers():
    assert github_anchor("Run grids (`--config`)") == "run-grids---config"
    assert github_anchor("A split as a plain `datasets.Dataset` (local export, offline)") == \
        "a-split-as-a-plain-datasetsdataset-local-export-offline"
    assert github_anchor("Loading a metric module, online and offline") == "loading-a-metric-module-online-and-offline"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path):
    body = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(body):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, fragment = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading '#{fragment}' in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: broken link(s): " + "; ".join(broken)


def test_the_readme_links_every_docs_page_through_the_index():
    index = (ROOT / "docs" / "README.md").read_text(encoding="utf-8")
    linked = {(ROOT / "docs" / t.partition("#")[0]).resolve() for t in LINK.findall(index)}
    pages = {p.resolve() for p in (ROOT / "docs").glob("*.md") if p.name != "README.md"}
    assert not pages - linked, f"docs/README.md does not link: {sorted(p.name for p in pages - linked)}"
    assert "docs/README.md" in (ROOT / "README.md").read_text(encoding="utf-8")
