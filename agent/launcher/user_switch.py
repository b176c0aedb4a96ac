"""``rtenv-agent ray enable|disable|enabled --user`` (and ``--project DIR``): the Ray switch of
every Python the user starts, which a venv made anew (``rm -rf .venv && uv sync``, a new Python
version) keeps, with no edit to the user's code.

A venv processes no ``.pth`` of the user's nor of its base interpreter's site-packages, and uv
has no setting that adds a package to each venv it makes; what every Python of the user's reads
is the environment. So ``enable --user`` writes a hook folder,
``${XDG_DATA_HOME:-~/.local/share}/rtenv-agent/switch`` (``agent/ops/user_hook.py``: its
``sitecustomize.py``, the hook, a copy of ``ray_swap.py`` and ``switch.conf``), and a marked
block (``BEGIN`` .. ``END``) in the user's shell startup files (``~/.profile`` and
``~/.bashrc``, made if missing; ``~/.bash_profile``, ``~/.bash_login`` and ``~/.zshrc`` when
present) that puts the folder first on ``PYTHONPATH``, as ``conda init`` does. ``--project DIR``
narrows the scope to the Python environments inside those folders (repeated: several projects);
``--user`` widens it to all. The venv's own switch (its ``.pth``), where enabled, wins.

What the blocks were written into is kept in ``startup-files`` in the hook folder (each file,
whether enable made it, and whether it added a newline before the block), so that ``disable
--user`` leaves each file byte for byte as it was (a file enable made, left empty, is removed).
``disable --project DIR`` drops one project (the last one: the whole switch). ``coverage`` says,
for a given python, whether the hook covers it, whether it arms it (the python asked with only
the hook folder on its ``PYTHONPATH``), and whether this shell's ``PYTHONPATH`` names the folder
(else: open a new shell).
"""

from __future__ import annotations

import contextlib
import os
import py_compile
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.core.errors import echo
from agent.launcher import switch
from agent.launcher.switch import PROG, SwitchError, Target
from agent.ops import ray_swap, user_hook

BEGIN = "# >>> rtenv-agent ray enable --user >>>"
END = "# <<< rtenv-agent ray enable --user <<<"
SHIM = "sitecustomize.py"
HOOK_MODULE = "_rtenv_agent_user_hook.py"
SWAP_MODULE = f"{user_hook.SWAP_MODULE}.py"
STATE = "startup-files"  # which startup files hold the block, and how it was added
ALWAYS = (".profile", ".bashrc")  # made if missing
WHEN_PRESENT = (".bash_profile", ".bash_login", ".zshrc")  # login bash skips .profile if present
MADE, ADDED, NEWLINE = "made", "added", "added-after-newline"  # a startup file
FOLDER = "folder"  # a folder enable made (the hook folder, ~/.local/share...)
RELOAD = "open a new shell, or run `. ~/.profile` in this one"


@dataclass(frozen=True)
class User:
    """The per-user switch's places: its hook folder and the home whose startup files it edits."""

    folder: Path
    home: Path

    @property
    def config(self) -> Path:
        return self.folder / user_hook.CONFIG

    def files(self) -> list[Path]:
        """Every file enable writes in the folder, the shim (``sitecustomize.py``) first."""
        folder, cache = self.folder, self.folder / "__pycache__"
        names = [SHIM, user_hook.CONFIG, HOOK_MODULE, SWAP_MODULE, STATE]
        bytecode = sorted(cache.glob("*.pyc")) if cache.is_dir() else []
        return [folder / name for name in names] + bytecode


def user(environ: Mapping[str, str], home: Path | None) -> User:
    """``$XDG_DATA_HOME/rtenv-agent/switch`` (an absolute XDG_DATA_HOME), else
    ``~/.local/share/rtenv-agent/switch``."""
    if home is None:
        raise SwitchError("no home folder: the per-user switch edits its shell startup files")
    data = environ.get("XDG_DATA_HOME", "")
    base = Path(data) if os.path.isabs(data) else home / ".local" / "share"
    return User(base / "rtenv-agent" / "switch", home)


def block(folder: Path, undo: str) -> str:
    """The lines added to a startup file: the folder first on PYTHONPATH, once however often the
    file is read (``~/.profile`` reads ``~/.bashrc``), in POSIX sh that zsh reads too."""
    where = shlex.quote(str(folder))
    return (
        f"{BEGIN}\n"
        "# Ray nodes started by your pythons run runtime-env-agent's agent (PYTHONPATH names its\n"
        f"# hook). Undo: {undo}\n"
        'case ":${PYTHONPATH-}:" in\n'
        f"    *:{where}:*) ;;\n"
        f'    *) export PYTHONPATH={where}"${{PYTHONPATH:+:$PYTHONPATH}}" ;;\n'
        "esac\n"
        f"{END}\n"
    )


def _span(text: str) -> tuple[int, int] | None:
    """Where the block is in ``text``: from its BEGIN line to after its END line."""
    start = text.find(BEGIN + "\n")
    if start < 0 or (start > 0 and text[start - 1] != "\n"):
        return None
    end = text.find(END + "\n", start)
    return None if end < 0 else (start, end + len(END) + 1)


def with_block(text: str, lines: str) -> tuple[str, bool]:
    """``text`` with the block (``lines``) in place of its own, or appended; whether a newline was
    added before it (the text did not end with one)."""
    span = _span(text)
    if span is not None:
        return text[: span[0]] + lines + text[span[1] :], False
    newline = bool(text) and not text.endswith("\n")
    return text + ("\n" if newline else "") + lines, newline


def without_block(text: str, newline: bool) -> str:
    """``text`` with the block gone, and the newline added before it when there was one."""
    span = _span(text)
    if span is None:
        return text
    start = span[0] - 1 if newline and span[0] > 0 and text[span[0] - 1] == "\n" else span[0]
    return text[:start] + text[span[1] :]


def _read_state(place: User) -> dict[Path, str]:
    try:
        text = place.folder.joinpath(STATE).read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise SwitchError(f"cannot read {echo(str(place.folder / STATE))}: {exc}") from None
    state = {}
    for line in text.splitlines():
        how, _, path = line.partition("\t")
        if how in (MADE, ADDED, NEWLINE, FOLDER) and os.path.isabs(path):
            state[Path(path)] = how
    return state


def _check_path(what: str, path: Path) -> None:
    if "\n" in str(path) or ":" in str(path) or not str(path).isprintable():
        raise SwitchError(f"{what} {echo(str(path))} holds a newline, a colon or another "
                          "character PYTHONPATH or the switch's files cannot hold")  # fmt: skip


def read_config(place: User) -> user_hook.Config | None:
    """The config (None: the per-user switch is off); a SwitchError when it is broken."""
    try:
        text = place.config.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SwitchError(f"cannot read {echo(str(place.config))}: {exc}") from None
    try:
        return user_hook.parse_config(text)
    except user_hook.ConfigError as exc:
        raise SwitchError(f"{place.config} is broken: {exc}") from None


def scope(config: user_hook.Config) -> str:
    if config.projects is None:
        return "every venv and Python environment of this user's"
    return "the Python environments in " + ", ".join(config.projects)


def enable(place: User, agent_python: str, root: Path, projects: list[Path] | None) -> list[str]:
    """Write the hook folder (the shim last) and the startup files' block; the lines to print.
    ``projects`` None: every environment; else these folders, added to those already covered."""
    for path in (place.folder, root, Path(agent_python), *(projects or [])):
        _check_path("the path", path)
    try:
        old = read_config(place)
    except SwitchError:
        old = None  # a broken config is rewritten
    folders: tuple[str, ...] | None = None
    if projects is not None:
        kept = list(old.projects or ()) if old is not None else []
        folders = tuple(dict.fromkeys([*kept, *(str(p) for p in projects)]))
    config = user_hook.Config(agent_python, str(root), folders)
    made = [p for p in (place.folder, *place.folder.parents) if not p.exists()]
    try:
        place.folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SwitchError(f"cannot make {echo(str(place.folder))}: {exc.strerror}") from None
    switch.write_file(place.folder / SWAP_MODULE, switch.module_text())
    header = switch.HEADER.replace("ray_swap.py", "user_hook.py")
    switch.write_file(
        place.folder / HOOK_MODULE, header + Path(user_hook.__file__).read_text(encoding="utf-8")
    )
    switch.write_file(place.config, user_hook.config_text(config))
    switch.write_file(place.folder / SHIM, user_hook.SHIM)
    # this python's bytecode, read at each start even under PYTHONDONTWRITEBYTECODE (where a
    # Python of another version compiles the files at each start: a few milliseconds)
    for name in (SWAP_MODULE, HOOK_MODULE, SHIM):
        with contextlib.suppress(py_compile.PyCompileError, OSError):
            py_compile.compile(str(place.folder / name), doraise=True)
    cli = ray_swap.agent_cli(agent_python)
    undo = ray_swap.shell_line([*cli, "ray", "disable", "--user"])
    edited = _add_blocks(place, block(place.folder, undo), made)
    narrowed = old is not None and old.projects is None and folders is not None
    lines = [
        f"{PROG}: enabled per user for {scope(config)}: the Ray nodes they start (ray.init(), "
        "ray start, Cluster) run this agent, venvs made anew included",
        f"  agent python: {agent_python}",
        f"  root: {root} (RTENV_ROOT, where set, wins)",
        f"  wrote: {place.folder}/ ({SHIM}, {user_hook.CONFIG}, ...), and PYTHONPATH's block in "
        + ", ".join(str(p) for p in edited),
        f"  undo: {undo}",
    ]
    if narrowed:
        lines.append("  note: it covered every environment; now only these folders")
    lines.append(
        f"  in effect: {'in this shell already' if in_effect(place, os.environ) else RELOAD}"
    )
    return lines


def _add_blocks(place: User, lines: str, made: list[Path]) -> list[Path]:
    """The block into each startup file, and what was done kept in ``STATE`` (with the folders
    enable made); the startup files that hold it."""
    state = _read_state(place)
    for folder in made:
        state.setdefault(folder, FOLDER)
    names = [*ALWAYS, *(n for n in WHEN_PRESENT if (place.home / n).is_file())]
    for path in (place.home / name for name in names):
        try:
            text = path.read_text(encoding="utf-8") if path.exists() else None
        except (OSError, UnicodeDecodeError) as exc:
            raise SwitchError(f"cannot read {echo(str(path))}: {exc}") from None
        new, newline = with_block(text or "", lines)
        if new != text:
            switch.write_file(path, new, keep_mode=True)
        if path not in state:
            state[path] = MADE if text is None else (NEWLINE if newline else ADDED)
        # kept after each file: a failure at the next one leaves disable knowing this one
        switch.write_file(
            place.folder / STATE, "".join(f"{how}\t{p}\n" for p, how in state.items())
        )
    return [path for path, how in state.items() if how != FOLDER]


def disable(place: User, project: Path | None) -> list[str]:
    """Remove the blocks, then the hook folder's files (the shim first); or one project."""
    if project is not None:
        config = read_config(place)
        if config is None or config.projects is None or str(project) not in config.projects:
            covered = "nothing" if config is None else scope(config)
            return [f"{PROG}: the per-user switch does not list {project} (it covers {covered})"]
        left = tuple(p for p in config.projects if p != str(project))
        if left:
            narrower = user_hook.Config(config.python, config.root, left)
            switch.write_file(place.config, user_hook.config_text(narrower))
            return [f"{PROG}: the per-user switch no longer covers {project}; {scope(narrower)}"]
    restored, state = [], _read_state(place)
    for name in (*ALWAYS, *WHEN_PRESENT):  # a block whose record is lost goes too
        state.setdefault(place.home / name, ADDED)
    for path, how in state.items():
        if how == FOLDER:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError) as exc:
            raise SwitchError(f"cannot read {echo(str(path))}: {exc}") from None
        new = without_block(text, how == NEWLINE)
        if how == MADE and not new:
            path.unlink()
        elif new != text:
            switch.write_file(path, new, keep_mode=True)
        else:
            continue
        restored.append(str(path))
    removed = []
    for path in place.files():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
    made = sorted((p for p, how in state.items() if how == FOLDER), key=lambda p: -len(p.parts))
    for folder in (place.folder / "__pycache__", place.folder, *made):
        with contextlib.suppress(OSError):
            folder.rmdir()  # only when empty
    if not removed and not restored:
        return [f"{PROG}: the per-user switch is not enabled; nothing to remove"]
    return [
        f"{PROG}: disabled per user: removed {place.folder} and the PYTHONPATH block from "
        + (", ".join(restored) or "no startup file")
        + " (a shell open now keeps its PYTHONPATH: the folder is gone, so it does nothing)"
    ]


def in_effect(place: User, environ: Mapping[str, str]) -> bool:
    """Whether ``environ``'s PYTHONPATH names the hook folder (a shell that read the block)."""
    entries = environ.get("PYTHONPATH", "").split(os.pathsep)
    return any(e and os.path.abspath(e) == str(place.folder) for e in entries)


def status(place: User, environ: Mapping[str, str]) -> tuple[int, list[str]]:
    """``enabled --user``: the switch's scope, its files, and whether this shell has it."""
    config = read_config(place)
    if config is None:
        return 1, [f"{PROG}: off per user (no {place.config})"]
    files = [str(path) for path, how in _read_state(place).items() if how != FOLDER]
    lines = [
        f"  agent python: {config.python}",
        f"  root: {config.root} (RTENV_ROOT, where set, wins)",
        f"  hook: {place.folder}, put on PYTHONPATH by {', '.join(files) or 'no startup file'}",
    ]
    if not in_effect(place, environ):
        return 1, [
            f"{PROG}: on per user for {scope(config)}, but not in this shell (its PYTHONPATH "
            f"lacks {place.folder}): {RELOAD}",
            *lines,
        ]
    return 0, [f"{PROG}: on per user for {scope(config)}, in this shell", *lines]


def coverage(
    place: User, target: Target, environ: Mapping[str, str]
) -> tuple[int, list[str]] | None:
    """``enabled --python P`` where the venv's own switch is off: whether the per-user switch
    covers P, arms it, and is in effect in this shell (None: there is no per-user switch)."""
    config = read_config(place)
    if config is None:
        return None
    said = f"{PROG}: {target.python}"
    if user_hook.agents_own(config, target.prefix):
        return 1, [f"{said} is off: it is the agent's own environment, which the per-user "
                   "switch leaves alone"]  # fmt: skip
    if not user_hook.covers(config, target.prefix, os.path.realpath(target.prefix)):
        return 1, [f"{said} is off: the per-user switch covers {scope(config)}, not "
                   f"{target.prefix}"]  # fmt: skip
    armed = switch.probe(target.python, hook=place.folder)
    lines = [f"  agent python: {config.python}", f"  root: {config.root}"]
    if target.has_ray and not armed.armed:
        why = f" (its start said: {armed.stderr})" if armed.stderr else ""
        return 1, [f"{said}: the per-user switch covers it but does not arm it{why}", *lines]
    if not in_effect(place, environ):
        return 1, [
            f"{said} is on through the per-user switch ({scope(config)}), but not in this "
            f"shell: its PYTHONPATH lacks {place.folder}: {RELOAD}",
            *lines,
        ]
    if target.has_ray and (problem := switch.not_in_effect(armed, config.python)) is not None:
        return 1, [f"{said}: on through the per-user switch, but not in effect: {problem}"]
    note = [] if target.has_ray else [f"  note: ray is not importable in {target.python} (yet)"]
    return 0, [
        f"{said} is on through the per-user switch ({scope(config)}), in this shell",
        *lines,
        *note,
    ]
