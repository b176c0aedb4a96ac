"""The index's SQL is written in one module, ``agent/state/schema.py``: no other module of the
agent, the scripts or the simulated raylet holds a string that is a statement (read from the
sources: every string constant but docstrings)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TOP = Path(__file__).resolve().parent.parent
HOME = TOP / "agent" / "state" / "schema.py"
_STATEMENT = re.compile(
    r"\s*(SELECT|INSERT|UPDATE|DELETE|REPLACE|CREATE|ALTER|DROP|PRAGMA|BEGIN|COMMIT|ROLLBACK)"
    r"\s",
)


def _statements(source: str) -> list[str]:
    """The string constants of ``source`` that start like an SQL statement, docstrings aside."""
    tree = ast.parse(source)
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and _STATEMENT.match(node.value)
    ]


def test_the_check_finds_a_statement_and_passes_a_docstring_and_prose() -> None:
    source = '"""SELECT is told apart."""\nQ = "SELECT 1 FROM uris"\nW = "select a package"\n'
    assert _statements(source) == ["SELECT 1 FROM uris"]


def test_no_sql_is_written_outside_the_schema_module() -> None:
    found = {
        str(path.relative_to(TOP)): hits
        for folder in ("agent", "scripts", "raylet_sim")
        for path in sorted((TOP / folder).rglob("*.py"))
        if path != HOME and (hits := _statements(path.read_text()))
    }
    assert found == {}, "SQL belongs in agent/state/schema.py"
    assert _statements(HOME.read_text()), "the schema module holds the statements"
