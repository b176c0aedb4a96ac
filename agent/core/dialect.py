"""The doors' dialects: how each front door reads a runtime env, as one value it picks once.

Pure: no I/O. A door (the gRPC servicer, the Ray door) parses every env it is sent with its
``Dialect``, and the parsed env carries it (``RuntimeEnv.dialect``): no layer below the doors
asks which door an env came through; each difference is a column here, read where it applies.
The two dialects, side by side:

=====================  ===========================  ===========================================
column                 ``GRPC`` (this agent's)      ``RAY`` (Ray's agent's protocol)
=====================  ===========================  ===========================================
``unknown_fields``     refused, named               ignored, as Ray's agent does (it warns), at
                                                    most ``MAX_IGNORED_FIELDS``
``plugin_fields``      refused (no plugin host)     run by the node's runtime env plugins
``pip_kind``           ``pip``: an isolated venv    ``ray_pip``: a venv that sees the node's
``uv_kind``            ``uv``: likewise             ``ray_uv``: likewise     packages (Ray's)
``py_modules_zip``     ``py_modules``: unpacked     ``ray_py_modules``: a single top folder
                       as it is                     dropped, as Ray's agent unpacks it (a gcs://
                                                    upload is unpacked as it is by both)
``wd_requirements``    refused: no working dir to   ``-r ${RAY_RUNTIME_ENV_CREATE_WORKING_DIR}/f``
                       read from                    read from the installed working dir
``context``            the ``.proto``'s             Ray's ``RuntimeEnvContext`` JSON
                       ``WorkerContext``
=====================  ===========================  ===========================================

``tests/test_dialect.py`` walks the columns: each is in this table and read somewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from agent.core.uris import UriKind


class UnknownFields(Enum):
    """What a door does with a field no parser knows."""

    REFUSE = "refuse"  # InvalidRuntimeEnv naming it
    IGNORE = "ignore"  # kept out of the env, named in its identity and warned about


class PluginFields(Enum):
    """What a door does with the fields of the node's runtime env plugins."""

    REFUSE = "refuse"  # InvalidRuntimeEnv: this door has no plugin host
    RUN = "run"  # part of the env's identity, run by the plugin host


class ContextFormat(Enum):
    """The format a door answers a worker's context in."""

    WORKER = "worker"  # the .proto's WorkerContext (``agent.core.context``)
    RAY = "ray"  # Ray's RuntimeEnvContext JSON (``agent.doors.ray_context``)


@dataclass(frozen=True, slots=True)
class Dialect:
    """How one door reads a runtime env (see the module docstring's table)."""

    name: str  # for messages and for the parse cache, which remembers each dialect apart
    unknown_fields: UnknownFields
    plugin_fields: PluginFields
    pip_kind: UriKind  # the kind of the venv a ``pip`` set makes
    uv_kind: UriKind  # the kind of the venv a ``uv`` set makes
    py_modules_zip: UriKind  # a py_modules zip's kind, from a scheme that does not keep its
    # zips' single top folder (``Scheme.keeps_top_level``)
    wd_requirements: bool  # ``pip`` and ``uv`` may read requirements files of the working dir
    context: ContextFormat

    def venv_kind(self, tool: str) -> UriKind:
        """The kind of the venv the ``tool`` field ("pip" or "uv") makes."""
        return self.pip_kind if tool == "pip" else self.uv_kind


GRPC = Dialect(
    name="grpc",
    unknown_fields=UnknownFields.REFUSE,
    plugin_fields=PluginFields.REFUSE,
    pip_kind=UriKind.PIP,
    uv_kind=UriKind.UV,
    py_modules_zip=UriKind.PY_MODULES,
    wd_requirements=False,
    context=ContextFormat.WORKER,
)
RAY = Dialect(
    name="ray",
    unknown_fields=UnknownFields.IGNORE,
    plugin_fields=PluginFields.RUN,
    pip_kind=UriKind.RAY_PIP,
    uv_kind=UriKind.RAY_UV,
    py_modules_zip=UriKind.RAY_PY_MODULES,
    wd_requirements=True,
    context=ContextFormat.RAY,
)
