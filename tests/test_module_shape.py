"""Every module of ``agent/`` is used, and small enough to read as one concept.

Read from the sources, nothing imported:

- A module that nothing imports is dead code: each module of ``agent/`` (but a package's
  ``__init__``/``__main__``) is imported by another module of ``agent/`` or ``raylet_sim/``, or
  started by name (``-m agent.x.y``, ``importlib.import_module("agent.x.y")``), or is an entry
  point in ``pyproject.toml``.
- A module of more than ``MAX_LINES`` lines mixes concepts unless its docstring says why it is
  one: it then carries a paragraph starting ``One concept:``.
- A private name (``_x``) is its module's own: no module of ``agent/`` imports another's.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450
_BY_NAME = re.compile(r"""["'](agent(?:\.\w+)+)["']""")


def module_name(path: Path) -> str:
    """``agent/state/store.py`` -> ``agent.state.store``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(source: str, importer: str) -> set[str]:
    """Every module name ``source`` (the module ``importer``) may load: ``import a.b`` gives a.b,
    ``from a import b`` gives a and a.b (b may be a module), relative imports resolved; and names
    started by string (``-m agent.x``, ``import_module("agent.x")``)."""
    found: set[str] = set()
    package = importer.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    found.update(_BY_NAME.findall(source))
    return found


def unused_modules(sources: dict[str, str], entry_points: set[str]) -> list[str]:
    """The modules of ``agent`` among ``sources`` (module name -> text) that no other source
    imports or starts by name and no entry point names."""
    used: set[str] = set(entry_points)
    for name, text in sources.items():
        used.update(imported_names(text, name) - {name})
    return sorted(
        name
        for name in sources
        if name.startswith("agent.")
        and not name.endswith(".__main__")
        and not _is_package(name, sources)
        and name not in used
    )


def _is_package(name: str, sources: dict[str, str]) -> bool:
    return any(other.startswith(name + ".") for other in sources)


def too_long(path: Path, text: str) -> str | None:
    """Why ``text`` (the module at ``path``) breaks the size rule, or None."""
    lines = text.count("\n")
    if lines <= MAX_LINES:
        return None
    doc = ast.get_docstring(ast.parse(text)) or ""
    if re.search(r"^One concept:", doc, re.MULTILINE):
        return None
    return f"{path.relative_to(ROOT)}: {lines} lines, and its docstring says no 'One concept:'"


def _sources() -> dict[Path, str]:
    return {
        path: path.read_text()
        for folder in ("agent", "raylet_sim")
        for path in sorted((ROOT / folder).rglob("*.py"))
    }


def _entry_points() -> set[str]:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {target.split(":")[0] for target in scripts.values()}


def test_every_module_of_the_agent_is_imported_or_started() -> None:
    sources = {module_name(path): text for path, text in _sources().items()}
    assert unused_modules(sources, _entry_points()) == []


@pytest.mark.parametrize(
    "path", sorted((ROOT / "agent").rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT))
)
def test_a_long_module_says_why_it_is_one_concept(path: Path) -> None:
    assert too_long(path, path.read_text()) is None


def test_the_dead_module_oracle_sees_a_module_nothing_imports() -> None:
    sources = {
        "agent.core.used": "X = 1\n",
        "agent.core.dead": "Y = 2\n",
        "agent.core.started": "",
        "agent.app.user": (
            "from agent.core import used\n"
            "ARGV = ('-m', 'agent.core.started')\n"
            "from agent.core.dead import Y  # noqa\n"
        ),
        "agent.ops.cli": "",
    }
    assert unused_modules(sources, {"agent.ops.cli"}) == ["agent.app.user"]
    del sources["agent.app.user"]
    assert unused_modules(sources, {"agent.ops.cli"}) == [
        "agent.core.dead",
        "agent.core.started",
        "agent.core.used",
    ]


def test_relative_imports_count_as_imports() -> None:
    assert "agent.state.index" in imported_names("from . import index\n", "agent.state.store")
    assert "agent.core.refs" in imported_names("from ..core.refs import X\n", "agent.state.store")


def test_the_size_oracle_sees_a_long_module_without_a_reason(tmp_path: Path) -> None:
    body = "x = 1\n" * (MAX_LINES + 1)
    path = ROOT / "agent" / "planted.py"
    assert too_long(path, f'"""Things."""\n{body}') is not None
    reason = '"""Things.\n\nOne concept: the table and its rules.\n"""\n'
    assert too_long(path, reason + body) is None
    assert too_long(path, "x = 1\n" * MAX_LINES) is None


def private_imports(source: str) -> list[str]:
    """The private names (``_x``) ``source`` imports from a module of ``agent``: a private is
    its module's own."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent"):
            found += [
                f"{node.module}.{alias.name}"
                for alias in node.names
                if alias.name.startswith("_") and not alias.name.startswith("__")
            ]
    return found


def test_no_module_of_the_agent_imports_another_ones_private_name() -> None:
    found = {
        str(path.relative_to(ROOT)): names
        for path, text in _sources().items()
        if (names := private_imports(text))
    }
    assert found == {}


def test_the_private_import_oracle_sees_one_in_a_parenthesised_import() -> None:
    source = "from agent.ops.cli import (\n    main,\n    _HelpFormatter,\n)\n"
    assert private_imports(source) == ["agent.ops.cli._HelpFormatter"]
    assert private_imports("from agent.ops import __version__\nfrom os import _exit\n") == []
