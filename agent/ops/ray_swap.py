"""The swap of a raylet's runtime env agent for this one, and the switch that applies it in a
whole Python environment. Standard library only, and nothing of ``agent``: ``rtenv-agent ray
enable`` copies this very file into the target environment's site-packages (as
``_rtenv_agent_switch.py``, beside a ``.pth`` file whose one line calls ``arm``), where the agent
is not installed; ``agent.launcher`` imports it for ``install()`` and the launcher.

- ``swap_agent_command`` (pure): a raylet's argv with ``--runtime_env_agent_command=`` naming
  ``<python> -u -I -m agent ray-agent [--root=DIR] <Ray's flags>`` instead of Ray's
  ``runtime_env/agent/main.py``; ``agent_command_problem`` says why a command cannot be swapped.
- ``swapping``: a wrapper of Ray's ``ray._private.services.start_ray_process`` applying the swap
  to raylets (and warning, naming what it holds, for a raylet command it does not know); on a
  Ray older than ``SUPPORTED_RAY`` (``ray_version_problem``) the raylet keeps Ray's own agent,
  with one warning saying why.
- ``announcement`` (pure): the one line a node started on this agent says (whose agent, its
  root, and the ``info`` command that shows what the root holds, with the full path of
  ``rtenv-agent``); the switch prints it on stderr once per process, as the first raylet it
  swapped starts (the driver that starts its node; workers start none).
- ``longest_socket_path``/``socket_path_warning`` (pure): Ray's own unix socket paths
  (``<temp_dir>/session_<date>_<pid>/sockets/plasma_store`` and ``raylet``) against AF_UNIX's
  107 bytes, and the warning that names the limit and the fix.
- ``arm(python, root)``, run by the ``.pth`` at interpreter start: it only puts a finder first on
  ``sys.meta_path``, which does nothing until ``ray._private.services`` or ``ray._private.node``
  is imported; it then patches them as they load (the swap, with ``python`` and ``root`` baked in
  by ``enable``, and the announcement; the socket path warning before Ray checks a node's socket
  paths). Nothing it does may stop an interpreter from starting: a failure is one warning, never
  an exception.

It runs on the target environment's Python (3.9 or later): no syntax or call newer than that.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

AGENT_FLAG = "--runtime_env_agent_command="  # the raylet's flag naming its agent's command
RAY_AGENT_SCRIPT = ("runtime_env", "agent", "main.py")  # ray/_private/runtime_env/agent/main.py
# -I (isolated): neither the raylet's working directory nor PYTHONPATH (which the raylet passes
# on, and may hold a user's own "agent" package) nor the user site is on sys.path, so nothing of
# the user's can stand in for this package. The agent still reads os.environ["PYTHONPATH"]: the
# node's path that workers' contexts carry.
OUR_AGENT = ("-I", "-m", "agent", "ray-agent")
ROOT_FLAG = "--root="  # ray-agent's own flag: the root, unless RTENV_ROOT names one
VERSION_FLAG = "--ray-version="  # ray-agent's own flag: the Ray of the raylet (its rules differ)
# The Rays whose raylet this agent serves: the oldest, and the newest a node was started on.
# Every release from 2.51 launches a separate runtime env agent over HTTP with a flag set
# ray-agent knows (agent/ops/ray_flags.py); a later Ray is tried (its new flags are logged).
SUPPORTED_RAY = ((2, 51, 1), (2, 60, 0))
PROCESS_TYPE_RAYLET = "raylet"  # ray_constants.PROCESS_TYPE_RAYLET
MAX_UNIX_PATH_BYTES = 107  # sun_path is 108 bytes with the terminating NUL (Ray checks 107)
RAY_SOCKETS = ("plasma_store", "raylet")  # what Ray binds in <session>/sockets/
# A session's name: session_<%Y-%m-%d_%H-%M-%S_%f>_<pid of the process starting the node>
SESSION_DATE = "2026-01-01_00-00-00_000000"  # always this many characters
SERVICES = "ray._private.services"
NODE = "ray._private.node"
LOGGER = "agent.ray"  # the warnings' name, as users have read it (not a module's)
PROBLEM_CHARS = 500  # of the agent command quoted in a warning
ROOT_CHARS = 300  # of the root's path in the announcement
CLI = "rtenv-agent"  # the agent's console script, beside its python (pip, pipx, uv tool)
RUNTIME_ENV_DIR_FLAG = "--runtime-env-dir="  # Ray's flag to its agent
SESSION_ROOT = "rtenv"  # a root in Ray's session: <runtime-env-dir>/rtenv (ops/ray_agent.py's)


def ray_release(version: str) -> tuple[int, ...] | None:
    """``2.51.1`` as (2, 51, 1); None when it does not start with numbers (``2.52.0rc1`` counts
    as its numbers). Its one home: ``ray_flags`` imports it from here (this file imports nothing
    of the agent's, as it is copied where the agent is not)."""
    numbers = []
    for part in version.strip().split(".")[:3]:
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
        if digits != part:
            break
    return tuple(numbers) if len(numbers) >= 2 else None


def supported_range() -> str:
    oldest, newest = (".".join(map(str, v)) for v in SUPPORTED_RAY)
    return f"Ray {oldest} or later (nodes started on {oldest} to {newest})"


def ray_version_problem(version: str) -> str | None:
    """Why this agent cannot serve a raylet of Ray ``version`` (None: it can, or the version is
    not known: the command's own check then decides): a Ray older than the oldest supported."""
    known = ray_release(version)
    if known is None or known >= SUPPORTED_RAY[0]:
        return None
    return f"Ray {_quoted(version, 40)} is not supported by runtime-env-agent: {supported_range()}"


def running_ray_version() -> str:
    """The version of the ``ray`` imported in this process ("" when none is)."""
    return str(getattr(sys.modules.get("ray"), "__version__", "") or "")


def _quoted(text: str, limit: int = PROBLEM_CHARS) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} characters)"


def _agent_flags(command: Sequence[str]) -> list[str] | None:
    """Ray's flags to its agent: what follows Ray's main.py (after the python and any profiler
    Ray puts first); None for a command without Ray's agent (this agent's, say: the swap is
    then idempotent)."""
    for i, word in enumerate(command):
        if tuple(word.replace("\\", "/").split("/")[-3:]) == RAY_AGENT_SCRIPT:
            return list(command[i + 1 :])
    return None


def _ours(command: Sequence[str]) -> bool:
    """Whether an agent command is already this agent's (the swap's own output)."""
    return any(tuple(command[i : i + len(OUR_AGENT)]) == OUR_AGENT for i in range(len(command)))


def agent_command_problem(raylet_argv: Sequence[str]) -> str | None:
    """Why the swap cannot put this agent in a raylet's command (None: it can, or already did):
    no ``--runtime_env_agent_command=``, or one naming neither Ray's main.py nor this agent."""
    import shlex

    found = [a for a in raylet_argv if a.startswith(AGENT_FLAG)]
    if not found:
        return f"the raylet's command has no {AGENT_FLAG} flag"
    for arg in found:
        try:
            command = shlex.split(arg[len(AGENT_FLAG) :])
        except ValueError:
            continue
        if _agent_flags(command) is not None or _ours(command):
            return None
    return (
        f"the raylet's {AGENT_FLAG} names neither Ray's {'/'.join(RAY_AGENT_SCRIPT)} nor this "
        f"agent: {_quoted(found[0])}"
    )


def swap_agent_command(
    raylet_argv: Sequence[str],
    python: str | None = None,
    root: str | None = None,
    ray_version: str = "",
) -> list[str]:
    """The raylet's command with its runtime env agent replaced by this agent, run by ``python``
    (default: this process's), with ``--root=ROOT`` when a root is given (``RTENV_ROOT`` in the
    agent's environment still wins) and ``--ray-version=V`` when the Ray is known; Ray's flags
    to the agent unchanged; everything else, and a command with no agent of Ray's, left as it
    is. Idempotent. The agent's command is one
    argument, written as Ray writes it (``subprocess.list2cmdline``), which the raylet splits
    back."""
    import shlex
    import subprocess

    out = list(raylet_argv)
    for i, arg in enumerate(out):
        if not arg.startswith(AGENT_FLAG):
            continue
        flags = _agent_flags(shlex.split(arg[len(AGENT_FLAG) :]))
        if flags is not None:
            ours = [python or sys.executable, "-u", *OUR_AGENT]
            ours += [ROOT_FLAG + root] if root else []
            ours += [VERSION_FLAG + ray_version] if ray_version else []
            out[i] = AGENT_FLAG + subprocess.list2cmdline([*ours, *flags])
    return out


def swapping(
    original: Callable[..., Any],
    python: str | None = None,
    root: str | None = None,
    on_swap: Callable[[list[str]], None] | None = None,
) -> Callable[..., Any]:
    """Ray's ``start_ray_process`` with the swap applied to raylets' commands: a raylet command
    the swap does not know, or an agent ``python`` that is gone (a switch whose agent was
    uninstalled), is started as it is, with a warning naming why; ``on_swap`` is told each
    command swapped, before that raylet starts. The wrapper carries its ``python`` and ``root``
    (``agent_python``, ``agent_root``): ``install()`` keeps them when it takes over a switch's."""

    def start_ray_process(command: list[str], process_type: str, *a: Any, **kw: Any) -> Any:
        if process_type == PROCESS_TYPE_RAYLET and python and not os.access(python, os.X_OK):
            _warn(
                f"{LOGGER}: this raylet runs Ray's own runtime env agent: the agent's python "
                f"{_quoted(python, 300)} is gone (run rtenv-agent ray enable again, or disable)",
                python=python,
            )
        elif process_type == PROCESS_TYPE_RAYLET and (
            old := ray_version_problem(running_ray_version())
        ):
            _warn(f"{LOGGER}: this raylet runs Ray's own runtime env agent: {old}", problem=old)
        elif process_type == PROCESS_TYPE_RAYLET:
            problem = agent_command_problem(command)
            if problem is not None:
                _warn(
                    f"{LOGGER}: this raylet runs its own runtime env agent, not this one: "
                    f"{problem} (a Ray this launcher does not know?)",
                    problem=problem,
                )
            swapped = swap_agent_command(command, python, root, running_ray_version())
            if problem is None and on_swap is not None:
                on_swap(swapped)
            command = swapped
        return original(command, process_type, *a, **kw)

    start_ray_process.__wrapped__ = original  # type: ignore[attr-defined]
    start_ray_process.agent_python = python  # type: ignore[attr-defined]
    start_ray_process.agent_root = root  # type: ignore[attr-defined]
    return start_ray_process


# -- the line a node on this agent says -----------------------------------------------------


def agent_cli(python: str) -> list[str]:
    """How to run ``rtenv-agent`` of the agent that ``python`` runs: the console script beside it
    (``<venv>/bin/rtenv-agent``, as pip, pipx and uv tool install it), else ``python -m agent``."""
    script = os.path.join(os.path.dirname(python), CLI)
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [python, "-m", "agent"]


def shell_line(words: Sequence[str]) -> str:
    """``words`` as one line a shell runs (quoted where needed); repr-quoted when it holds a
    character no line can (a newline in a path), so that it stays one line."""
    import shlex

    said = shlex.join(words)
    return said if said.isprintable() else _quoted(said)


def _agent_words(raylet_argv: Sequence[str]) -> list[str]:
    """The words of the raylet's agent command (none when it has none that splits)."""
    import shlex

    for arg in raylet_argv:
        if arg.startswith(AGENT_FLAG):
            try:
                return shlex.split(arg[len(AGENT_FLAG) :])
            except ValueError:
                continue
    return []


def _flag_value(words: Sequence[str], flag: str) -> str | None:
    """The value of ``flag`` (``--x=``) among ``words``, as ``--x=V`` or ``--x V``; or None."""
    for i, word in enumerate(words):
        if word.startswith(flag):
            return word[len(flag) :]
        if word == flag[:-1] and i + 1 < len(words):
            return words[i + 1]
    return None


def announcement(raylet_argv: Sequence[str], environ: Mapping[str, str], prog: str) -> str:
    """The line said as a raylet starts with this agent (``raylet_argv``, swapped): whose agent
    it is, its root (``$RTENV_ROOT``, else the swap's ``--root``, else in the node's Ray session,
    as ``rtenv-agent ray-agent`` decides), and the command that shows what the root holds:
    ``rtenv-agent info --root ROOT`` of the agent's own installation, by its full path."""
    said = f"{prog}: this node's runtime env agent is runtime-env-agent's (rtenv-agent ray-agent)"
    words = _agent_words(raylet_argv)
    flag = _flag_value(words, ROOT_FLAG)
    runtime_env_dir = _flag_value(words, RUNTIME_ENV_DIR_FLAG)
    if environ.get("RTENV_ROOT"):
        root, why = environ["RTENV_ROOT"], " (RTENV_ROOT)"
    elif flag is not None:
        root, why = flag, " (the Ray switch's, rtenv-agent ray enable)"
    elif runtime_env_dir is not None:
        root = os.path.join(runtime_env_dir, SESSION_ROOT)
        why = ", in Ray's session (each session starts an empty cache; set RTENV_ROOT to keep one)"
    else:
        return f"{said}, not Ray's; its root: unknown (the raylet passes no --runtime-env-dir)"
    cli = agent_cli(words[0] if words else sys.executable)
    info = shell_line([*cli, "info", "--root", root])
    if not root.isprintable() or len(root) > ROOT_CHARS:  # the root is said above, cut
        info = f"{shell_line(cli)} info --root ROOT (the root above)"
    return f"{said}, not Ray's; its root: {_quoted(root, ROOT_CHARS)}{why}; what it holds: {info}"


_announced: list[str] = []  # the line this process said, once


def _announce_once(swapped: list[str]) -> None:
    """The announcement on stderr, the first time a raylet started here runs this agent (a
    driver starting its node, ``ray start``; several nodes of one ``Cluster``: once)."""
    if _announced:
        return
    try:
        _announced.append(announcement(swapped, os.environ, CLI))
        sys.stderr.write(_announced[0] + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed stderr: the node starts all the same
        pass


# -- Ray's own socket paths -----------------------------------------------------------------


def ray_temp_dir(temp_dir: str | None, environ: Mapping[str, str]) -> str:
    """The temp dir a node started here uses: ``temp_dir`` (``--temp-dir``, ``_temp_dir``) if
    given, else Ray's default: ``$RAY_TMPDIR/ray``, else ``$TMPDIR/ray``, else ``/tmp/ray``
    (Ray's ``get_default_ray_temp_dir`` on Linux)."""
    if temp_dir:
        return os.path.expanduser(temp_dir)
    if "RAY_TMPDIR" in environ:
        base = environ["RAY_TMPDIR"]
    elif "TMPDIR" in environ:
        base = environ["TMPDIR"]
    else:
        base = "/tmp"
    return os.path.join(base, "ray")


def longest_socket_path(temp_dir: str, pid: int, date: str = SESSION_DATE) -> str:
    """The longest of Ray's own unix socket paths for a node started by process ``pid`` in
    ``temp_dir``: ``<temp_dir>/session_<date>_<pid>/sockets/plasma_store`` (the date, Ray's
    ``%Y-%m-%d_%H-%M-%S_%f``, has a fixed width)."""
    session = os.path.join(temp_dir, f"session_{date}_{pid}", "sockets")
    return max((os.path.join(session, name) for name in RAY_SOCKETS), key=len)


def socket_path_warning(path: str) -> str | None:
    """The warning for a socket path of Ray's over AF_UNIX's limit (None when it fits): the
    limit, the path's length, and the fix."""
    size = len(path.encode("utf-8", "surrogateescape"))
    if size <= MAX_UNIX_PATH_BYTES:
        return None
    return (
        f"Ray's socket path {_quoted(path, 300)} is {size} bytes, over the {MAX_UNIX_PATH_BYTES}-"
        "byte limit of a unix socket path (AF_UNIX), so Ray will refuse to start this node: "
        "set RAY_TMPDIR (or --temp-dir) to a short path such as /tmp, and put the agent's root "
        "on the big disk instead (RTENV_ROOT=DIR, or rtenv-agent ray enable --root DIR)"
    )


# -- the switch: armed at interpreter start, applied as Ray's modules load -----------------


def _warn(message: str, **fields: Any) -> None:
    """A warning through logging (stderr when the program configured none)."""
    import logging

    logging.getLogger(LOGGER).warning("%s", message, extra=fields)


def _patch_services(module: Any, python: str, root: str | None) -> None:
    original = getattr(module, "start_ray_process", None)
    if original is None or getattr(original, "__wrapped__", None) is not None:
        return  # not Ray's function as this switch knows it, or swapped already
    module.start_ray_process = swapping(original, python, root, on_swap=_announce_once)


def _patch_node(module: Any) -> None:
    node = getattr(module, "Node", None)
    original = getattr(node, "_prepare_socket_file", None)
    if original is None or getattr(original, "__wrapped__", None) is not None:
        return

    def _prepare_socket_file(self: Any, socket_path: Any, default_prefix: str) -> Any:
        sockets = getattr(self, "_sockets_dir", None)
        path = socket_path or (os.path.join(sockets, default_prefix) if sockets else None)
        if isinstance(path, str) and (said := socket_path_warning(path)) is not None:
            _warn(f"{LOGGER}: {said}", path=path)
        return original(self, socket_path, default_prefix)

    _prepare_socket_file.__wrapped__ = original  # type: ignore[attr-defined]
    module.Node._prepare_socket_file = _prepare_socket_file


class _Loader:
    """A module's own loader, then the patch once the module has run."""

    def __init__(self, loader: Any, patch: Callable[[Any], None]) -> None:
        self._loader, self._patch = loader, patch

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        try:
            self._patch(module)
        except Exception as exc:  # the user's program goes on with Ray as it is
            _warn(f"{LOGGER}: the switch could not patch {module.__name__}: {exc!r}")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class Finder:
    """First on ``sys.meta_path``: None for every module but the few it patches, whose spec it
    takes from the finders after it, with a loader that patches the module once it has run."""

    def __init__(self, patches: Mapping[str, Callable[[Any], None]]) -> None:
        self.patches = patches

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if getattr(spec.loader, "exec_module", None) is not None:
                    spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


def arm(python: str, root: str | None = None) -> None:
    """At interpreter start (the ``.pth`` line): raylets this process starts will run the agent
    with ``python`` on ``root``. Only a finder is put in place; a second call is a no-op."""
    try:
        if any(isinstance(f, Finder) for f in sys.meta_path):
            return
        patches: dict[str, Callable[[Any], None]] = {
            SERVICES: lambda module: _patch_services(module, python, root),
            NODE: _patch_node,
        }
        for name, patch in patches.items():
            if name in sys.modules:  # loaded before us (not at interpreter start)
                patch(sys.modules[name])
        sys.meta_path.insert(0, Finder(patches))
    except Exception as exc:  # never stop an interpreter from starting
        sys.stderr.write(f"{LOGGER}: the Ray switch is not armed: {exc!r}\n")
