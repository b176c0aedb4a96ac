"""The pip commands a pip env's build runs (``agent.install.venvs.build``), as argument lists.
Pure.

pip runs isolated (``--isolated``: no configuration file, no ``PIP_*`` variable) and asks
nothing (``--no-input``, ``--disable-pip-version-check``). It is the agent's own pip, given the
venv's python (``pip --python <venv python>``), unless the env names a ``pip_version``: then,
as Ray's agent does, that pip is installed into the venv first (by the agent's pip, from the
places the env's options and option lines name: ``PipSpec.index_options``), and the venv's own
pip (``<venv python> -m pip``) installs the set and runs its ``pip check``. With ``pip_check``
set, ``pip check`` runs in the venv after the install, as Ray's agent runs it; a conflict fails
the build with pip's own lines.
"""

from __future__ import annotations

from agent.core.pip_spec import PipSpec
from agent.core.uv_spec import UvSpec

_QUIET = ("--disable-pip-version-check", "--no-input")


def pip_argv(
    python: str, venv_python: str, command: str, spec: PipSpec | UvSpec | None = None
) -> list[str]:
    """``pip <command>`` for the venv of ``venv_python``: the venv's own pip when ``spec`` named
    a ``pip_version`` (installed by ``pip_version_argv``), else the agent's (``python``'s)."""
    if isinstance(spec, PipSpec) and spec.pip_version:
        head = [venv_python, "-m", "pip"]
    else:
        head = [python, "-m", "pip", "--python", venv_python]
    return [*head, "--isolated", command, *_QUIET]


def pip_version_argv(python: str, venv_python: str, spec: PipSpec) -> list[str]:
    """The agent's pip installing the set's ``pip_version`` into the venv, from where the set
    says packages are found."""
    return [
        *pip_argv(python, venv_python, "install"),
        *spec.index_options(),
        f"pip{spec.pip_version}",
    ]


def install_options(spec: PipSpec | UvSpec) -> tuple[str, ...]:
    """The set's options as its installer is given them: its option lines after its options, as
    each tool makes of a requirements file's (pip's: a line's ``--index-url`` wins; uv's:
    ``UvSpec.line_options``)."""
    return (*spec.options, *spec.line_options)
