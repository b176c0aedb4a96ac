"""Every relative link in the README and docs/*.md leads somewhere: the file it names exists, and
the heading its ``#anchor`` names is in that file, spelled as GitHub spells heading anchors (a
section moved or renamed would otherwise leave a link to nothing)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: lower case, every character but
    letters, digits, ``_``, ``-`` and spaces dropped, spaces made ``-``; a repeated one gets
    ``-1``, ``-2``..."""
    seen: Counter[str] = Counter()
    found = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(f"{slug}-{seen[slug]}" if seen[slug] else slug)
        seen[slug] += 1
    return found


def broken(doc: Path, text: str) -> list[str]:
    """The relative links of ``text`` (a file at ``doc``) whose file or anchor is missing."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return [
        target
        for target in LINK.findall(prose)
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # https:, mailto: ...
        and not _resolves(doc, text, target)
    ]


def _resolves(doc: Path, text: str, target: str) -> bool:
    name, _, anchor = target.partition("#")
    if not name:
        return anchor in anchors(text)
    path = (doc.parent / name).resolve()
    if not path.exists():
        return False
    return not anchor or (path.suffix == ".md" and anchor in anchors(path.read_text()))


def test_every_relative_link_of_the_docs_resolves_anchors_included() -> None:
    links = sum(len(LINK.findall(doc.read_text())) for doc in DOCS)
    assert links >= 60  # the README and docs link to each other throughout
    assert {doc.name: broken(doc, doc.read_text()) for doc in DOCS} == {d.name: [] for d in DOCS}


def test_a_link_to_a_missing_file_or_heading_is_reported() -> None:
    readme = ROOT / "README.md"
    text = (
        "# Top\n\n## A `code` heading: yes\n\n## A `code` heading: yes\n\n"
        "[ok](#top) [ok](#a-code-heading-yes-1) [ok](docs/ray.md#token-auth) "
        "[ok](https://example.com/x#y) `[not a link](nowhere.md)`\n"
        "[bad](#no-such-heading) [bad](docs/nowhere.md) [bad](docs/ray.md#no-such-part) "
        "[bad](LICENSE#section)\n```\n[in a code block](nowhere.md)\n```\n"
    )
    assert broken(readme, text) == [
        "#no-such-heading",
        "docs/nowhere.md",
        "docs/ray.md#no-such-part",
        "LICENSE#section",
    ]
