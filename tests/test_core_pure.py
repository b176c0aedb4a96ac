"""``agent/core`` does no I/O: read from its sources, no module imports a module that does it
(asyncio, subprocess, sockets, sqlite, shutil...), opens a file, or calls an ``os`` function
other than the pure path and environment ones; the one exception is named: resolving a path a
runtime env names against the allowed roots (``realpath``, ``isdir``), in the modules listed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parent.parent / "agent" / "core"
# modules that do I/O, or wait on it
_IO_MODULES = {
    "asyncio", "subprocess", "socket", "sqlite3", "shutil", "tempfile", "io", "aiofiles",
    "aiohttp", "grpc", "http", "select", "selectors", "signal", "threading",
    "multiprocessing", "mmap", "fcntl", "glob", "stat",
}  # fmt: skip
# ``os`` names that touch nothing outside the process: path arithmetic, the environment
_PURE_OS = {
    "os.path.basename", "os.path.join", "os.path.isabs", "os.path.normpath",
    "os.path.abspath", "os.pathsep", "os.sep", "os.environ", "os.fspath",
}  # fmt: skip
# the one I/O the core does, where: a path a runtime env names resolved against the allowed
# roots at parse (a lookup, nothing read nor written)
_PATH_LOOKUPS = {
    "os.path.realpath": {"roots.py", "places.py", "install_options.py", "uv_project.py"},
    "os.path.isdir": {"install_options.py"},
}
# what a module may do that the check would take for I/O, and why it is none
_NOT_IO = {
    ("errors.py", "imports asyncio"): "stray_cancellation asks the running task, awaits nothing",
}
# methods of a path or a file that read or write
_IO_METHODS = {
    "read_text", "read_bytes", "write_text", "write_bytes", "open", "iterdir", "mkdir",
    "unlink", "rmdir", "rename", "touch", "urlopen", "stat", "lstat", "exists", "is_dir",
    "is_file", "resolve", "glob", "rglob", "walk", "chmod", "symlink_to", "readlink",
}  # fmt: skip


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr}"
    return None


def io_in(name: str, source: str) -> list[str]:
    """What the module ``name`` (its ``source``) does that is I/O, each as a short line."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [f"imports {a.name}" for a in node.names if a.name in _IO_MODULES]
        elif isinstance(node, ast.ImportFrom) and node.module in _IO_MODULES:
            found.append(f"imports from {node.module}")
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted is None:
                continue
            if dotted.startswith("os.") and not any(
                dotted == ok or dotted.startswith(ok + ".") for ok in _PURE_OS
            ):
                if name not in _PATH_LOOKUPS.get(dotted, set()) and dotted != "os.path":
                    found.append(f"uses {dotted}")
            elif node.attr in _IO_METHODS and isinstance(node.ctx, ast.Load):
                found.append(f"calls .{node.attr}()")
        elif isinstance(node, ast.Call) and _dotted(node.func) == "open":
            found.append("calls open()")
    return found


@pytest.mark.parametrize("path", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_a_core_module_does_no_io(path: Path) -> None:
    found = io_in(path.name, path.read_text())
    assert [what for what in found if (path.name, what) not in _NOT_IO] == []


def test_the_check_sees_file_reads_processes_and_path_lookups_outside_their_modules() -> None:
    planted = (
        "import os, subprocess\nfrom pathlib import Path\n"
        "def f(p: Path) -> str:\n"
        "    os.open('x', 0)\n    open('y')\n    os.path.realpath('z')\n"
        "    return p.read_text()\n"
    )
    assert sorted(io_in("uris.py", planted)) == [
        "calls .read_text()",
        "calls open()",
        "imports subprocess",
        "uses os.open",
        "uses os.path.realpath",
    ]
    assert io_in("roots.py", "import os\nos.path.realpath('z')\n") == []
