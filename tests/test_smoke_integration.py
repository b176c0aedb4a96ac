"""In-process integration: a real agent on a unix socket, packages from a real HTTP server."""

from __future__ import annotations

import os

from tests.helpers import env_json, module_zip, package_server, running_agent, workdir_zip


async def test_create_returns_a_context_whose_paths_hold_the_packages() -> None:
    async with package_server() as pkgs, running_agent() as a:
        wd = pkgs.add("wd.zip", workdir_zip({"main.py": "print('hi')\n", "data/x.txt": "x"}))
        mod = pkgs.add("mod.zip", module_zip("mymod", "one"))
        reply = await a.create(env_json(wd, [mod], {"A": "1"}))
        ctx = reply.context
        assert os.path.isfile(os.path.join(ctx.cwd, "main.py"))
        assert os.path.isfile(os.path.join(ctx.cwd, "data", "x.txt"))
        paths = ctx.env_vars["PYTHONPATH"].split(os.pathsep)
        assert paths[0] == ctx.cwd
        assert os.path.isfile(os.path.join(paths[1], "mymod", "__init__.py"))
        assert ctx.env_vars["A"] == "1"
        assert list(reply.uris) == [f"working_dir:{wd}", f"py_modules:{mod}"]
        info = await a.info()
        assert info.total_envs == 1
        assert info.envs[0].references == 1
        assert await a.delete(reply.runtime_env_id) == 0
        info = await a.info()
        assert info.total_envs == 0
        assert {u.state for u in info.uris} == {"unused"}
        a.service.check_invariants()
