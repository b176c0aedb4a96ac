"""The agent's folders are its layers, and each imports only the layers below it.

    core < install < state < app < doors < ops < launcher

``agent/launcher`` is the top: the ``rtenv-agent`` entry point (``launcher/main.py``), which hands
ops' command line ``rtenv-agent ray ...`` and the host of Ray's plugins, both imported only when
used, and the only package that imports ``ray``; the agent itself (the server and everything it
imports) never imports it, nor ``ray`` (checked here by reading the sources, and by importing
the agent's command line and server in a fresh python).

``agent/crash.py`` (the crash points tests plant) sits beside the core and may be imported by
any layer. A module importing a layer above its own would make the layout lie: this test reads
every module's imports (``import`` and ``from ... import``, at any depth) and its loads by name
(a module's name given to ``importlib.import_module`` or ``__import__``, or after ``-m`` in a
command), and fails on one that climbs.
"""

from __future__ import annotations

import ast
import itertools
import re
import subprocess
import sys
from pathlib import Path

AGENT = Path(__file__).resolve().parent.parent / "agent"
LAYERS = ("core", "install", "state", "app", "doors", "ops", "launcher")
ANYWHERE = {"agent.crash", "agent.plant"}  # below every layer
TOP = {"agent.ray"}  # the driver's API (``agent.ray.install()``), over the launcher: above all


def _layer(module: str) -> int | None:
    """The layer's rank of ``agent.<layer>...``, or None for a module outside the layers."""
    if module in TOP:
        return len(LAYERS)
    parts = module.split(".")
    if len(parts) >= 2 and parts[0] == "agent" and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    return None


def _imports(source: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "agent":
                found.extend(f"agent.{alias.name}" for alias in node.names)
            else:
                found.append(node.module)
    return found


_LOADERS = {"import_module", "__import__"}
_DASH_M = re.compile(r"(?:^|\s)-m\s+([\w.]+)")


def loads_by_name(source: str) -> list[str]:
    """The modules ``source`` loads by name: a string given to ``importlib.import_module`` (or
    ``import_module``, ``__import__``), or after ``-m`` in a command (two items of a list, a
    tuple or a call's arguments, or one string: ``"python -m agent.x"``)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0] if node.args else None
            if name in _LOADERS and isinstance(first, ast.Constant):
                found.append(str(first.value))
        items: list[ast.expr] = []
        if isinstance(node, (ast.List, ast.Tuple)):
            items = node.elts
        elif isinstance(node, ast.Call):
            items = node.args
        for one, two in itertools.pairwise(items):
            if _text(one) == "-m" and isinstance(_text(two), str):
                found.append(str(_text(two)))
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.extend(_DASH_M.findall(node.value))
    return found


def _text(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def upward_imports(module: str, source: str) -> list[str]:
    """The imports and loads by name of ``module`` that reach a layer above its own."""
    own = _layer(module)
    if own is None:
        return []
    bad = []
    found = [("imports", n) for n in _imports(source)]
    found += [("loads", n) for n in loads_by_name(source)]
    for verb, name in found:
        if name in ANYWHERE or not name.startswith("agent."):
            continue
        target = _layer(name)
        if target is None and name.split(".")[1] not in LAYERS:
            bad.append(f"{module} {verb} {name}, which is in no layer")
        elif target is not None and target > own:
            bad.append(f"{module} ({LAYERS[own]}) {verb} {name} ({LAYERS[target]})")
    return sorted(set(bad))


def _modules() -> list[tuple[str, str]]:
    out = []
    for path in sorted(AGENT.rglob("*.py")):
        parts = path.relative_to(AGENT.parent).with_suffix("").parts
        out.append((".".join(p for p in parts if p != "__init__"), path.read_text()))
    return out


def test_every_module_of_the_agent_but_its_entry_points_is_in_a_layer_folder() -> None:
    outside = [
        name
        for name, _ in _modules()
        if _layer(name) is None and name not in {"agent", "agent.__main__", *ANYWHERE}
    ]
    assert outside == []


def test_no_module_imports_a_layer_above_its_own() -> None:
    problems = [p for name, source in _modules() for p in upward_imports(name, source)]
    assert problems == []


def test_the_check_sees_an_upward_import_and_a_module_outside_the_layers() -> None:
    assert upward_imports("agent.core.refs", "from agent.state.store import UriStore\n") == [
        "agent.core.refs (core) imports agent.state.store (state)"
    ]
    assert upward_imports("agent.install.fetch.fetcher", "import agent.ops.logs\n") == [
        "agent.install.fetch.fetcher (install) imports agent.ops.logs (ops)"
    ]
    assert upward_imports("agent.state.store", "from agent import service\n") == [
        "agent.state.store imports agent.service, which is in no layer"
    ]
    assert upward_imports("agent.ops.cli", "from agent.core.errors import echo\n") == []
    assert upward_imports("agent.core.refs", "from agent.crash import crash_point\n") == []


def test_the_check_sees_a_load_by_name_of_a_layer_above() -> None:
    by_importlib = 'import importlib\nhost = importlib.import_module("agent.launcher.plugins")\n'
    assert upward_imports("agent.ops.server", by_importlib) == [
        "agent.ops.server (ops) loads agent.launcher.plugins (launcher)"
    ]
    by_dash_m = 'ARGV = [sys.executable, "-I", "-m", "agent.ops.cli", "serve"]\n'
    assert upward_imports("agent.doors.metrics", by_dash_m) == [
        "agent.doors.metrics (doors) loads agent.ops.cli (ops)"
    ]
    in_a_line = 'LINE = "python -u -m agent.app.service --x"\n'
    assert upward_imports("agent.core.refs", in_a_line) == [
        "agent.core.refs (core) loads agent.app.service (app)"
    ]
    assert upward_imports("agent.ops.cli", '__import__("agent.state.store")\n') == []
    below = 'ARGV = ("-S", "-m", "agent.install.unpack.worker")\n'
    assert upward_imports("agent.install.unpack.procs", below) == []
    assert upward_imports("agent.ops.ray_swap", 'OURS = ("-I", "-m", "agent", "ray-agent")\n') == []


def ray_imports(module: str, source: str) -> list[str]:
    """The imports of ``ray`` (or a module of it) by ``module``, unless it is the launcher's."""
    if module == "agent.launcher" or module.startswith("agent.launcher."):
        return []
    return sorted(
        {
            f"{module} imports {name}"
            for name in _imports(source)
            if name == "ray" or name.startswith("ray.")
        }
    )


def test_no_module_but_the_launchers_imports_ray() -> None:
    problems = [p for name, source in _modules() for p in ray_imports(name, source)]
    assert problems == []


def test_the_ray_check_sees_an_import_of_ray_at_any_depth() -> None:
    nested = "def f() -> None:\n    if True:\n        from ray._private import services\n"
    assert ray_imports("agent.ops.cli", nested) == ["agent.ops.cli imports ray._private"]
    assert ray_imports("agent.app.x", "import ray\n") == ["agent.app.x imports ray"]
    assert ray_imports("agent.launcher.ray_cli", "import ray\n") == []
    assert ray_imports("agent.ops.cli", "import rayon\n") == []


def test_the_agents_entry_points_load_neither_ray_nor_the_launcher() -> None:
    code = (
        "import sys, agent.ops.cli, agent.ops.server, agent.ops.ray_agent\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] == 'ray' or "
        "m.startswith('agent.launcher'))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout
