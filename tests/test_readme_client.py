"""The README's Python client, as a reader copies it: the block after its ``python-client``
marker runs, with only its ROOT and APP lines changed, against a real agent process (``serve
--root``) and a real package server on 127.0.0.1; its worker runs in the env, and the env's
reference is given back."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path

from tests.harness.agent_process import START_S, serving, stop, wait_health_serving
from tests.harness.package_server import package_server
from tests.harness.packages import workdir_zip

REPO = Path(__file__).resolve().parents[1]
MARKER = "<!-- python-client:"
MAIN = "import os\nprint(os.environ['GREETING'], 'from', os.getcwd())\n"


def readme_client() -> str:
    """The README's ```python block right after the python-client marker."""
    readme = (REPO / "README.md").read_text()
    assert MARKER in readme, "README.md lost its python-client marker"
    after = readme[readme.index(MARKER) :]
    match = re.match(r"<!--[^\n]*-->\n```python\n(.*?)\n```\n", after, re.S)
    assert match is not None, "no ```python block right after the README's python-client marker"
    return match.group(1)


def with_values(code: str, **values: str) -> str:
    """``code`` with each ``NAME = ...`` line (a single one each) set to ``NAME = repr(value)``."""
    for name, value in values.items():
        code = _set_line(code, name, f"{name} = {value!r}")
    return code


def _set_line(code: str, name: str, line: str) -> str:
    pattern = re.compile(rf"^{name} = .*$", re.M)
    assert len(pattern.findall(code)) == 1, f"the client has no single {name} = line"
    return pattern.sub(lambda _: line, code)


def test_the_readme_client_is_found_and_its_values_are_the_ones_it_names() -> None:
    code = readme_client()
    assert "from rtenv.v1 import agent_pb2, agent_pb2_grpc" in code
    changed = with_values(code, ROOT="/r", APP="http://127.0.0.1:1/a.zip")
    assert "ROOT = '/r'" in changed
    assert "APP = 'http://127.0.0.1:1/a.zip'" in changed


async def test_the_readme_client_runs_a_worker_in_its_env_and_gives_it_back(base: Path) -> None:
    root = base / "root"
    async with package_server() as pkgs:
        app = pkgs.add("app.zip", workdir_zip({"main.py": MAIN}))
        code = with_values(readme_client(), ROOT=str(root), APP=app)
        async with serving(base / "agent.log", "--root", str(root)) as agent:
            assert agent.address == f"unix:{root}/agent.sock"
            await wait_health_serving(agent.address)
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-c", code, cwd=base,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                out, err = await asyncio.wait_for(proc.communicate(), START_S * 2)
            finally:
                await stop(proc)
            assert proc.returncode == 0, err.decode() + agent.log_text()
            lines = out.decode().splitlines()
            greeting, held, left = lines
            assert greeting.startswith("hello from ")
            worker_cwd = Path(greeting.removeprefix("hello from "))
            assert worker_cwd.is_relative_to(root / "uris"), greeting
            assert (worker_cwd / "main.py").read_text() == MAIN
            assert re.fullmatch(r"1 env\(s\), [1-9]\d* bytes in use", held), held
            assert left == "references left: 0"
    assert pkgs.gets["app.zip"] == 1
