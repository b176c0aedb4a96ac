"""The agent's settings: every limit is a named field with its default."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from agent.core.runtime_env import EnvLimits
from agent.install.disk.root import DiskFloor
from agent.install.fetch.base import FetchLimits
from agent.install.unpack.plan import ArchiveLimits
from agent.state.index import KindBudget

GiB = 1024**3


@dataclass(frozen=True)
class RaySettings:
    """The Ray door: Ray 2.60's runtime env agent protocol over HTTP, on the same tables and
    store as the gRPC door, for a Ray node's raylet (``rtenv-agent ray-agent``) or any client of
    that protocol (``serve --ray-address``)."""

    host: str = "127.0.0.1"  # the node's IP (Ray's --node-ip-address)
    port: int = 0  # Ray's --runtime-env-agent-port; 0 = a free port, told by port_file
    port_file: Path | None = None  # <session>/runtime_env_agent_port_<node>, once listening
    token: str | None = None  # Ray's auth token (RAY_AUTH_MODE=token): requests must carry it
    gcs_address: str = ""  # HOST:PORT of the node's GCS, for gcs:// packages ("" = none)
    cluster_id_hex: str = ""  # sent to the GCS as ray_cluster_id
    node_id: str = ""  # Ray's --node-id, for logs and the port file
    named_by: str = "--ray-address"  # the flag that gives host and port, named in refusals
    # Ray's --log-dir: each job's runtime_env_setup-<job>.log there gets the progress lines of
    # the builds its creates wait on (``doors/ray_setup_log.py``); None = no such file
    log_dir: Path | None = None


@dataclass(frozen=True)
class Settings:
    root: Path
    address: str = ""  # "" = unix:<root>/agent.sock
    cache_budget_bytes: int = 10 * GiB
    allow_remote: bool = False  # TCP binds loopback only unless set
    parent_pid: int | None = None
    py_executable: str = sys.executable
    default_setup_timeout_s: float = 600.0
    max_setup_timeout_s: float = 3600.0
    # a create fails after this many setup timeouts in a row, its build going on through them
    # all (``AgentService._setup_timeout``): 1, or Ray's RUNTIME_ENV_RETRY_TIMES under Ray, whose
    # agent tries that many times, each under the timeout (``agent.ops.ray_knobs``)
    setup_attempts: int = 1
    request_log_capacity: int = 10_000  # request ids remembered for idempotent retries
    max_info_envs: int = 10_000  # GetRuntimeEnvsInfo lists at most this many envs
    max_message_bytes: int = 4 * 1024 * 1024
    persist: bool = True  # keep the cache index in <root>/state.db (off: forget on restart)
    reset_state: bool = False  # move an unusable state.db aside and start from an empty cache
    token_file: str = ""  # with a token, every RPC but health checks must carry it
    allow_file_roots: tuple[str, ...] = ()  # file:// packages only from under these ("" = any)
    min_free_disk: DiskFloor = field(default_factory=DiskFloor)
    max_concurrent_installs: int = 8  # more wait in a queue
    extract_workers: int | None = (
        None  # unpack processes; None: one per core (at most 4); 0: a thread
    )
    overlap_downloads: bool = True  # extract a large http(s) zip while it downloads
    metrics_address: str = ""  # HOST:PORT for Prometheus; "" = off
    log_format: str = "text"  # or "json"
    log_level: str = "INFO"
    pip_installer: str = "auto"  # "pip", "uv", or auto: uv when there is one, else pip
    env: EnvLimits = field(default_factory=EnvLimits)
    archive: ArchiveLimits = field(default_factory=ArchiveLimits)
    fetch: FetchLimits = field(default_factory=FetchLimits)
    ray: RaySettings | None = None  # the Ray door; None = gRPC only
    # caps on some kinds' bytes, used or not, besides the root's budget (under Ray: Ray's per-plugin
    # cache sizes, ``agent.ops.ray_knobs``); () = the root's budget only
    kind_budgets: tuple[KindBudget, ...] = ()
    # sent with every http(s) GET of a package (under Ray: Ray's User-Agent and bearer token,
    # ``agent.ops.ray_knobs``); () = aiohttp's own User-Agent, no credentials
    http_headers: tuple[tuple[str, str], ...] = ()
    # under Ray, the node's runtime_resources (whatever the root): its Ray folders
    # (working_dir_files, py_modules_files, pip...) show the packages (``state.ray_folders``)
    ray_folders: Path | None = None

    def resolved_address(self) -> str:
        return self.address or f"unix:{self.root / 'agent.sock'}"
