"""What a test file needs from elsewhere in tests/ comes from the harness (``tests/harness/``),
never from another test file: importing ``tests.test_x`` runs that file's module code and hides a
shared helper among tests. Read from the sources with ``ast``; nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imports_of_test_files(source: str) -> list[str]:
    """The modules named ``tests.test_*`` (or ``test_*``, relatively) that ``source`` imports,
    at any depth (a function's own imports too), each as ``LINE: MODULE``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ("." * node.level) + (node.module or "")
            joint = "." if node.module else ""
            names = [base, *(f"{base}{joint}{alias.name}" for alias in node.names)]
        else:
            continue
        named = [name for name in names if name.lstrip(".").split(".")[-1].startswith("test_")]
        found += [(node.lineno, name) for name in named[:1]]
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_no_file_in_tests_imports_a_test_file() -> None:
    sources = sorted(TESTS.rglob("*.py"))
    assert len(sources) > 100
    offenders = {
        str(path.relative_to(TESTS)): imports_of_test_files(path.read_text()) for path in sources
    }
    assert {path: lines for path, lines in offenders.items() if lines} == {}


def test_tests_holds_test_files_conftest_and_the_harness_only() -> None:
    others = [
        path.name
        for path in TESTS.iterdir()
        if path.suffix == ".py" and not path.name.startswith("test_")
    ]
    assert sorted(others) == ["__init__.py", "conftest.py"]
    assert (TESTS / "harness" / "__init__.py").is_file()


def test_an_import_of_a_test_file_is_found_in_every_spelling() -> None:
    source = (
        "import tests.test_a\n"
        "from tests.test_b import x\n"
        "from tests import test_c\n"
        "from . import test_d\n"
        "from .test_e import y\n"
        "def f():\n"
        "    from tests.test_f import z\n"
        "from tests.harness.agent_process import serving\n"
        "import pytest\n"
    )
    assert imports_of_test_files(source) == [
        "1: tests.test_a",
        "2: tests.test_b",
        "3: tests.test_c",
        "4: .test_d",
        "5: .test_e",
        "7: tests.test_f",
    ]
