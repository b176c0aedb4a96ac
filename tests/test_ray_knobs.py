"""Ray's per-kind cache sizes (``RAY_RUNTIME_ENV_<NAME>_CACHE_SIZE_GB``), honoured when set: a
cap on the unused bytes of that kind's packages besides the root's budget (issue 31)."""

from __future__ import annotations

import json

import pytest

from agent.core.errors import ConfigError
from agent.ops.ray_knobs import KIND_GROUPS, cache_size_var, ray_cache_budgets
from agent.state.index import KindBudget
from tests.harness.in_process import running_agent
from tests.harness.package_server import package_server
from tests.harness.packages import make_zip, module_zip
from tests.harness.polling import wait_until


def test_rays_variable_names_are_rays_spelling() -> None:
    assert cache_size_var("working_dir") == "RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB"
    assert cache_size_var("py_modules") == "RAY_RUNTIME_ENV_PY_MODULES_CACHE_SIZE_GB"


def test_only_the_variables_set_add_a_budget_in_bytes_of_their_kinds() -> None:
    assert ray_cache_budgets({}) == ()
    (budget,) = ray_cache_budgets({"RAY_RUNTIME_ENV_PY_MODULES_CACHE_SIZE_GB": "0.5"})
    assert budget.budget_bytes == 512 * 1024**2
    assert budget.kinds == frozenset(k.value for k in KIND_GROUPS["py_modules"])
    assert "py_modules_wheel" in budget.kinds
    assert "ray_py_modules" in budget.kinds


@pytest.mark.parametrize("value", ["x", "-1", "nan", "inf", ""])
def test_a_cache_size_that_is_no_size_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB"):
        ray_cache_budgets({"RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB": value})


async def test_a_kind_budget_of_0_deletes_that_kinds_unused_packages_and_keeps_the_others() -> None:
    """working_dir capped at 0 bytes: its package goes once unused; the py_modules package,
    under the root's budget only, stays cached."""
    budget = KindBudget("RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB", frozenset({"working_dir"}), 0)
    async with package_server() as pkgs, running_agent(kind_budgets=(budget,)) as a:
        wd = pkgs.add("wd.zip", make_zip({"app/main.py": b"x = 1\n"}))
        mod = pkgs.add("mod.zip", module_zip("kbmod", "one"))
        reply = await a.create(json.dumps({"working_dir": wd, "py_modules": [mod]}))
        assert reply.context.cwd
        await a.delete(reply.runtime_env_id)

        async def kinds() -> set[str]:
            return {u.kind for u in (await a.info()).uris}

        async def only_modules_left() -> bool:
            return await kinds() == {"py_modules"}

        await wait_until(only_modules_left, timeout_s=10.0, what="the unused working_dir evicted")
        a.service.check_invariants()
