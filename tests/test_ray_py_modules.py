"""py_modules on a stock Ray node whose raylet launches this agent, as Ray's own agent serves
them (issue 31): a local ``.whl`` named in a job's env (Ray's driver uploads it as
``gcs://<wheel name>``) is pip-installed and imported by a task and an actor; a remote zip with a
single top folder loses it. The same test passes on Ray's own agent (``RTENV_E2E_AGENT=ray``)."""

from __future__ import annotations

import shutil

import pytest

from tests.harness.packages import make_zip
from tests.harness.ray_nodes import OURS, agent_info, drive, ray_nodes, wait_counts_zero
from tests.harness.tempdirs import short_tempdir
from tests.harness.uv_wheels import module_wheel

pytestmark = pytest.mark.timeout(300)


def test_a_local_wheel_and_a_remote_zip_in_py_modules_are_served_as_rays_agent_serves_them() -> (
    None
):
    work = short_tempdir()
    try:
        wheel = module_wheel(work, "e2e_wheelmod", "from a wheel")
        top = work / "top.zip"
        top.write_bytes(make_zip({"top/e2e_topmod/__init__.py": b"VALUE = 'top dropped'\n"}))
        args = {
            "job_env": {"py_modules": [str(wheel), top.as_uri()]},
            "spec": {"modules": ["e2e_wheelmod", "e2e_topmod"]},
        }
        want = {"e2e_wheelmod": "from a wheel", "e2e_topmod": "top dropped"}
        with ray_nodes(1) as (node,):
            seen = drive(node, "job", args)
            assert seen["task"].get("modules") == want, seen["task"]
            assert seen["actor"].get("modules") == want, seen["actor"]
            if OURS:
                kinds = {u.kind for u in agent_info(node).uris}
                assert {"py_modules_wheel", "ray_py_modules"} <= kinds, kinds
            wait_counts_zero(node)
    finally:
        shutil.rmtree(work, ignore_errors=True)
