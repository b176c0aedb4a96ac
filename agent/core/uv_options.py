"""uv's options, as data: which an env may pass to ``uv pip install``, which it may write as a line
of its package list (Ray's agent writes the list into a requirements file and runs ``uv pip
install -r`` on it), and why the others are refused.

``UV_PIP_INSTALL`` is the option table ``uv pip install --help`` prints (uv 0.13, the agent's
uv), each spelling with whether it takes a value; ``UV_HIDDEN`` the spellings uv takes but its
help leaves out (pip's names, aliases and negations: ``--pre``, ``--requirement``,
``--no-upgrade``...). ``tests/test_uv_options.py`` holds the first to the installed uv's help and
tries each of the second on it. An env may pass every one of them but ``REFUSED``, each refused
with why: what would read a file of the agent's node (``-r``, ``-c``, ``--overrides``,
``--excludes``, ``-b``, ``--cert``, ``--config-file``, ``--group``, ``--project``,
``--directory``), write outside the env's venv (``--target``, ``--prefix``, ``--system``,
``--break-system-packages``, ``--user``, ``--cache-dir``), pick or fetch an interpreter
(``--python``, ``--managed-python``...), set the link mode (the agent's), pass arguments to a
package's build backend (``-C``), run a credential helper (``--keyring-provider``) or print and
exit without installing (``--help``, ``--show-settings``). uv takes no abbreviation; short
options run together (``-qU``) are refused as pip's are (``install_options.check_options``).
``DROPPED`` (``--no-cache``: Ray's default) is taken and left out (``agent.core.uv_spec``).

uv splits some values into several places (``SPLITS``: ``--extra-index-url`` and ``--index`` at
whitespace, ``--find-links`` at commas): each part is checked as a place of its own.

``REQUIREMENTS_FILE`` are the option lines uv reads from a requirements file (uv's
``requirements-txt`` parser): ``--index-url``, ``--extra-index-url``, ``--find-links``,
``--no-index``, ``--no-binary``, ``--only-binary``, ``--require-hashes``; ``-r``, ``-c`` read a
file of the node (refused) and ``-e`` is a line of its own (``local_sources.editable``). uv reads
one option a line, its value up to a ``#``; it reads and ignores ``IGNORED_LINES`` (pip's
``--pre``, ``--trusted-host``, ``--prefer-binary``, ``--use-feature``), and so does the agent.
"""

from __future__ import annotations

from agent.core.pip_options import BACKEND, EXITS, READS, WRITES

# uv 0.13's ``uv pip install --help``, each spelling: whether it takes a value.
UV_PIP_INSTALL: dict[str, bool] = {
    # options
    "--requirements": True, "-r": True, "--editable": True, "-e": True, "--no-editable": False,
    "--no-editable-package": True, "--constraints": True, "-c": True, "--overrides": True,
    "--excludes": True, "--build-constraints": True, "-b": True, "--extra": True,
    "--all-extras": False, "--cert": True, "--group": True, "--no-deps": False,
    "--require-hashes": False, "--no-verify-hashes": False, "--require-build-hashes": False,
    "--system": False, "--break-system-packages": False, "--no-break-system-packages": False,
    "--target": True, "-t": True, "--prefix": True, "--no-build": False, "--no-binary": True,
    "--only-binary": True, "--python-version": True, "--python-platform": True,
    "--exact": False, "--strict": False, "--dry-run": False, "--check": False,
    "--output-format": True, "--torch-backend": True, "--user": False,
    # index options
    "--index": True, "--default-index": True, "--index-url": True, "-i": True,
    "--extra-index-url": True, "--find-links": True, "-f": True, "--no-index": False,
    "--index-strategy": True, "--keyring-provider": True,
    # resolver options
    "--upgrade": False, "-U": False, "--upgrade-package": True, "-P": True,
    "--upgrade-group": True, "--resolution": True, "--prerelease": True,
    "--prerelease-package": True, "--fork-strategy": True, "--exclude-newer": True,
    "--exclude-newer-package": True, "--no-sources": False, "--no-sources-package": True,
    # installer options
    "--reinstall": False, "--reinstall-package": True, "--link-mode": True,
    "--compile-bytecode": False,
    # build options
    "--config-setting": True, "-C": True, "--config-settings-package": True,
    "--no-build-isolation": False, "--no-build-isolation-package": True,
    # cache options
    "--no-cache": False, "-n": False, "--cache-dir": True, "--refresh": False,
    "--refresh-package": True,
    # python options
    "--python": True, "-p": True, "--managed-python": False, "--no-managed-python": False,
    "--no-python-downloads": False,
    # global options
    "--quiet": False, "-q": False, "--verbose": False, "-v": False, "--color": True,
    "--system-certs": False, "--offline": False, "--allow-insecure-host": True,
    "--no-progress": False, "--directory": True, "--project": True, "--config-file": True,
    "--no-config": False, "--help": False, "-h": False,
}  # fmt: skip

# What uv 0.13's ``uv pip install`` takes but its help does not show: pip's spellings, aliases
# and negations of the options above, and global ones.
UV_HIDDEN: dict[str, bool] = {
    "--requirement": True, "--constraint": True, "--override": True, "--exclude": True,
    "--build-constraint": True, "--config-settings": True, "--pre": False,
    "--trusted-host": True, "--force-reinstall": False, "--compile": False,
    "--no-compile": False, "--no-compile-bytecode": False, "--no-cache-dir": False,
    "--disable-pip-version-check": False, "--no-color": False, "--isolated": False,
    "--build": False, "--build-isolation": False, "--deps": False, "--inexact": False,
    "--no-exact": False, "--no-all-extras": False, "--no-strict": False, "--no-system": False,
    "--no-upgrade": False, "--no-reinstall": False, "--no-require-hashes": False,
    "--verify-hashes": False, "--no-offline": False, "--native-tls": False,
    "--no-installer-metadata": False, "--preview": False, "--no-preview": False,
    "--preview-features": True, "--preview-feature": True, "--show-settings": False,
    "--python-preference": True, "--python-fetch": True, "--allow-python-downloads": False,
}  # fmt: skip

# Refused, each with why: a refusal says what to do instead.
_FILE_LIST = "list the requirements in uv.packages instead"
_PYTHON = "picks another interpreter than the env's venv's, or fetches one"
REFUSED: dict[str, str] = {
    "-r": f"reads a requirements file (which may name further files); {_FILE_LIST}",
    "--requirements": f"reads a requirements file (which may name further files); {_FILE_LIST}",
    "--requirement": f"reads a requirements file (which may name further files); {_FILE_LIST}",
    "-c": f"reads a constraints file; {_FILE_LIST}",
    "--constraints": f"reads a constraints file; {_FILE_LIST}",
    "--constraint": f"reads a constraints file; {_FILE_LIST}",
    "--overrides": f"reads an overrides file; {_FILE_LIST}",
    "--override": f"reads an overrides file; {_FILE_LIST}",
    "--excludes": READS, "--exclude": READS, "-b": READS, "--build-constraints": READS,
    "--build-constraint": READS, "--cert": READS, "--config-file": READS,
    "--group": f"{READS} (a pyproject.toml, by its path or in the working directory)",
    "--project": f"{READS} (a project's pyproject.toml and uv.toml)",
    "--directory": "runs uv in a folder of the agent's node, where relative paths resolve",
    "-t": WRITES, "--target": WRITES, "--prefix": WRITES, "--user": WRITES,
    "--system": WRITES, "--break-system-packages": WRITES, "--cache-dir": WRITES,
    "-p": _PYTHON, "--python": _PYTHON, "--managed-python": _PYTHON,
    "--python-preference": _PYTHON, "--python-fetch": _PYTHON,
    "--allow-python-downloads": _PYTHON,
    "--link-mode": "the agent links every venv to its shared wheel cache (hardlinks)",
    "-C": BACKEND, "--config-setting": BACKEND, "--config-settings": BACKEND,
    "--config-settings-package": BACKEND,
    "--keyring-provider": "runs a credential helper of the agent's node",
    "--help": EXITS, "-h": EXITS, "--show-settings": EXITS,
}  # fmt: skip

# Ray's default (its driver writes ["--no-cache"] into the object form), and pip's spelling of
# it: the agent's venvs link from its one wheel cache, counted in its budget (``uv_spec``).
DROPPED = ("--no-cache", "-n", "--no-cache-dir")

ALLOWED: dict[str, bool] = {
    flag: takes for flag, takes in (UV_PIP_INSTALL | UV_HIDDEN).items() if flag not in REFUSED
}

# Values uv splits into several places (its command line's delimiters; " ": any whitespace).
SPLITS: dict[str, str] = {"--extra-index-url": " ", "--index": " ", "--find-links": ",", "-f": ","}

# The option lines uv's requirements-file parser reads (uv 0.13), but -r and -c (refused, as
# above) and -e (a line of its own: ``local_sources.editable``).
REQUIREMENTS_FILE: dict[str, bool] = {
    flag: UV_PIP_INSTALL[flag]
    for flag in (
        "--index-url", "-i", "--extra-index-url", "--no-index", "--find-links", "-f",
        "--no-binary", "--only-binary", "--require-hashes",
    )
}  # fmt: skip

# pip's lines uv reads and ignores (it warns): taken, and left out of the set, as uv leaves them.
IGNORED_LINES = ("--pre", "--trusted-host", "--prefer-binary", "--use-feature")
