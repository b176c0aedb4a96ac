"""Ray's per-kind cache sizes (``RAY_RUNTIME_ENV_<NAME>_CACHE_SIZE_GB``), honoured when set: a
cap on the unused bytes of that kind's packages besides the root's budget; Ray's http(s)
download headers (``RAY_RUNTIME_ENV_HTTP_USER_AGENT``, ``RAY_RUNTIME_ENV_BEARER_TOKEN``) and
their refusals (issue 31); Ray's ``RUNTIME_ENV_RETRY_TIMES``, the setup timeouts a create waits
(issue 39)."""

from __future__ import annotations

import json
import os

import pytest

from agent.core.errors import ConfigError
from agent.ops.ray_knobs import (
    MAX_HEADER_CHARS,
    RAYS_USER_AGENT,
    cache_size_var,
    kind_groups,
    ray_cache_budgets,
    ray_http_headers,
    ray_setup_attempts,
)
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
    assert budget.kinds == frozenset(k.value for k in kind_groups()["py_modules"])
    assert "py_modules_wheel" in budget.kinds
    assert "ray_py_modules" in budget.kinds


def test_rays_caches_are_listed_in_rays_order_and_uv_caps_uv_run_project_venvs() -> None:
    """What Ray's ``uv`` folder shows is what its variable caps: a uv run project's venv too,
    and the uv of a uv_version (Ray installs it into the uv venv, which that variable caps)."""
    groups = kind_groups()
    assert list(groups) == ["working_dir", "py_modules", "pip", "uv", "java_jars"]
    (budget,) = ray_cache_budgets({"RAY_RUNTIME_ENV_UV_CACHE_SIZE_GB": "1"})
    assert budget.kinds == {"uv", "ray_uv", "uv_project", "uv_tool"}


@pytest.mark.parametrize("value", ["x", "-1", "nan", "inf", ""])
def test_a_cache_size_that_is_no_size_is_refused_naming_the_variable(value: str) -> None:
    with pytest.raises(ConfigError, match="RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB"):
        ray_cache_budgets({"RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB": value})


def test_the_download_headers_are_rays_user_agent_and_the_token_only_when_set() -> None:
    assert RAYS_USER_AGENT == "ray-runtime-env-curl/1.0"
    assert ray_http_headers({}) == (("User-Agent", RAYS_USER_AGENT),)
    assert ray_http_headers({"RAY_RUNTIME_ENV_BEARER_TOKEN": ""}) == ray_http_headers({})
    got = ray_http_headers(
        {"RAY_RUNTIME_ENV_HTTP_USER_AGENT": "lab/2", "RAY_RUNTIME_ENV_BEARER_TOKEN": "s3cr3t"}
    )
    assert got == (("User-Agent", "lab/2"), ("Authorization", "Bearer s3cr3t"))


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("a\r\nX-Injected: 1", "control character"),
        ("caf\u00e9", "not ASCII"),
        ("x" * (MAX_HEADER_CHARS + 1), f"the limit is {MAX_HEADER_CHARS}"),
    ],
)
def test_a_header_value_no_header_can_carry_is_refused_naming_the_variable(
    value: str, why: str
) -> None:
    with pytest.raises(ConfigError, match="RAY_RUNTIME_ENV_HTTP_USER_AGENT") as refused:
        ray_http_headers({"RAY_RUNTIME_ENV_HTTP_USER_AGENT": value})
    assert why in refused.value.message
    assert len(refused.value.message) < 400  # the value is echoed truncated
    with pytest.raises(ConfigError, match="RAY_RUNTIME_ENV_BEARER_TOKEN") as refused:
        ray_http_headers({"RAY_RUNTIME_ENV_BEARER_TOKEN": "s3cr3t" + value})
    assert why in refused.value.message
    assert "s3cr3t" not in refused.value.message  # a token is never echoed


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


async def test_a_kind_budget_counts_what_is_in_use_as_rays_uri_cache_does() -> None:
    """Ray's TestGC::test_hit_cache_size_limit: an unused 800 kB working dir fits a 1 MB cap
    alone; once a 400 kB one is in use, the kind holds 1.2 MB and the unused one goes. What is
    in use is never evicted, even over the cap."""
    cap = KindBudget("RAY_RUNTIME_ENV_WORKING_DIR_CACHE_SIZE_GB", frozenset({"working_dir"}), 10**6)
    async with package_server() as pkgs, running_agent(kind_budgets=(cap,)) as a:
        big = pkgs.add("big.zip", make_zip({"app/big.bin": os.urandom(800_000)}))
        small = pkgs.add("small.zip", make_zip({"app/small.bin": os.urandom(400_000)}))

        async def cached() -> set[str]:
            return {u.uri for u in (await a.info()).uris}

        first = await a.create(json.dumps({"working_dir": big}))
        await a.delete(first.runtime_env_id)
        await a.service.store.enforce_budget()
        assert await cached() == {big}, "alone, the unused one fits the cap"
        second = await a.create(json.dumps({"working_dir": small}))
        await a.service.store.enforce_budget()
        assert await cached() == {small}, "with the used one counted, the unused one went"
        again = await a.create(json.dumps({"working_dir": big}))  # both in use: 1.2 MB
        await a.service.store.enforce_budget()
        assert await cached() == {big, small}, "what is in use stays, over the cap"
        for reply in (second, again):
            await a.delete(reply.runtime_env_id)
        a.service.check_invariants()


def test_a_create_under_ray_waits_as_many_setup_timeouts_as_rays_agent_tries() -> None:
    """Ray's agent tries 3 times unless RUNTIME_ENV_RETRY_TIMES says otherwise; 0 still waits
    one timeout (the build runs once); a value that is no count is refused, naming it."""
    assert ray_setup_attempts({}) == 3
    assert ray_setup_attempts({"RUNTIME_ENV_RETRY_TIMES": "5"}) == 5
    assert ray_setup_attempts({"RUNTIME_ENV_RETRY_TIMES": "0"}) == 1
    for bad in ("-1", "three", "101", ""):
        with pytest.raises(ConfigError, match=r"RUNTIME_ENV_RETRY_TIMES=.*0 to 100"):
            ray_setup_attempts({"RUNTIME_ENV_RETRY_TIMES": bad})
