"""Every test the docs cite as evidence exists: a claim in docs/security.md, docs/architecture.md
or the README that names ``tests/<file>.py::<test>`` must point at a test that is there (a
rename or a move would otherwise leave a claim with nothing behind it)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CITATION = re.compile(r"(tests/[\w/]+\.py)::(\w+)")


def missing(text: str) -> list[str]:
    """The citations in ``text`` whose file or test function does not exist."""
    gone = []
    for file, name in CITATION.findall(text):
        path = ROOT / file
        if not path.is_file() or not re.search(rf"^(async )?def {name}\(", path.read_text(), re.M):
            gone.append(f"{file}::{name}")
    return gone


def test_every_test_the_docs_cite_exists() -> None:
    cited = {doc.name: CITATION.findall(doc.read_text()) for doc in DOCS}
    assert sum(map(len, cited.values())) >= 100  # security.md alone cites about a hundred
    assert {doc.name: missing(doc.read_text()) for doc in DOCS} == {doc.name: [] for doc in DOCS}


def test_a_citation_of_a_test_that_is_gone_is_reported() -> None:
    text = (
        "held (`tests/test_refs.py::no_such_test_here`, `tests/nowhere.py::test_x`, "
        "`tests/test_doc_citations.py::test_every_test_the_docs_cite_exists`)"
    )
    assert missing(text) == ["tests/test_refs.py::no_such_test_here", "tests/nowhere.py::test_x"]
