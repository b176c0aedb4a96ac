"""A real Ray node whose raylet launches this agent with S3 credentials in its environment (as an
operator sets them on the node) runs a task and an actor whose working_dir and py_modules are
``s3://`` zips in moto's S3 server on 127.0.0.1: Ray's driver passes the URIs as they are
(remote URIs are not uploaded), and this agent reads them through obstore."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.harness.object_stores import S3Server, moto_s3
from tests.harness.packages import workdir_zip
from tests.harness.ray_nodes import (
    Json,
    drive,
    modules_zip,
    needs_ours,
    ray_nodes,
    wait_counts_zero,
)

pytestmark = [pytest.mark.timeout(300), needs_ours]  # Ray's own agent reads s3 with boto3


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with moto_s3() as server:
        yield server


def test_a_ray_task_and_actor_run_in_a_working_dir_and_py_modules_from_s3(s3: S3Server) -> None:
    s3.put("jobs/wd.zip", workdir_zip({"data.txt": "from s3"}))
    s3.put("jobs/mods.zip", modules_zip({"e2e_s3_mod": "s3 module"}))
    env = {
        "AWS_ACCESS_KEY_ID": s3.key_id,
        "AWS_SECRET_ACCESS_KEY": s3.secret,
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3.endpoint,
    }
    cases: list[Json] = [
        {
            "name": "s3",
            "runtime_env": {
                "working_dir": f"s3://{s3.bucket}/jobs/wd.zip",
                "py_modules": [f"s3://{s3.bucket}/jobs/mods.zip"],
            },
            "spec": {"files": ["data.txt"], "modules": ["e2e_s3_mod"]},
        }
    ]
    with ray_nodes(1, num_cpus=2, env=env) as (head,):
        got = drive(head, "probe", {"cases": cases})
        for kind in ("task", "actor"):
            seen = got["s3"][kind]
            assert "error" not in seen, seen
            assert seen["files"] == {"data.txt": "from s3"}, seen
            assert seen["modules"] == {"e2e_s3_mod": "s3 module"}, seen
        wait_counts_zero(head)
