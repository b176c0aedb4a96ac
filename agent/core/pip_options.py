"""pip's options, as data: which an env may pass to ``pip install``, which it may write as a line
of its package list (Ray writes the list into a requirements file), and why the others are
refused.

``PIP_INSTALL`` is the option table of ``pip install`` of the pip this agent installs with (pip
23.2, its ``pip._internal.cli.cmdoptions``: the install options, the package index options and
the general ones), each spelling with whether it takes a value; ``tests/test_pip_options.py``
holds it to the installed pip's own parser. An env may pass every one of them but ``REFUSED``,
each refused with why: what would write outside the env's venv (``--target``, ``--prefix``,
``--root``, ``--user``, ``--src``, ``--cache-dir``, ``--log``, ``--report``), read a file of the
agent's node (``-r``, ``-c``, ``--cert``, ``--client-cert``), pass arguments to a package's
build backend (``-C``, ``--global-option``), pick another interpreter (``--python``), run a
credential helper (``--keyring-provider``) or print and exit without installing (``--help``,
``--version``). pip would also take an unambiguous prefix of a long option (``--targ``) and short
options run together (``-Ut``): only whole spellings pass (``install_options.check_options``).

``REQUIREMENTS_FILE`` are the options pip reads from a line of a requirements file
(``pip._internal.req.req_file.SUPPORTED_OPTIONS``): a ``pip`` list's line ``--extra-index-url
URL`` is taken as Ray's agent takes it, but for ``-r`` and ``-c``, which read a file of the node.
"""

from __future__ import annotations

# pip 23.2's ``pip install`` options, each spelling: whether it takes a value.
PIP_INSTALL: dict[str, bool] = {
    # install options
    "--requirement": True, "-r": True, "--constraint": True, "-c": True, "--no-deps": False,
    "--no-dependencies": False, "--pre": False, "--editable": True, "-e": True,
    "--dry-run": False, "--target": True, "-t": True, "--platform": True,
    "--python-version": True, "--implementation": True, "--abi": True, "--user": False,
    "--no-user": False, "--root": True, "--prefix": True, "--src": True, "--source": True,
    "--source-dir": True, "--source-directory": True, "--upgrade": False, "-U": False,
    "--upgrade-strategy": True, "--force-reinstall": False, "--ignore-installed": False,
    "-I": False, "--ignore-requires-python": False, "--no-build-isolation": False,
    "--use-pep517": False, "--no-use-pep517": False, "--check-build-dependencies": False,
    "--break-system-packages": False, "--config-settings": True, "-C": True,
    "--global-option": True, "--compile": False, "--no-compile": False,
    "--no-warn-script-location": False, "--no-warn-conflicts": False, "--no-binary": True,
    "--only-binary": True, "--prefer-binary": False, "--require-hashes": False,
    "--progress-bar": True, "--root-user-action": True, "--report": True, "--no-clean": False,
    # package index options
    "--index-url": True, "--pypi-url": True, "-i": True, "--extra-index-url": True,
    "--no-index": False, "--find-links": True, "-f": True,
    # general options
    "--help": False, "-h": False, "--debug": False, "--isolated": False,
    "--require-virtualenv": False, "--require-venv": False, "--python": True,
    "--verbose": False, "-v": False, "--version": False, "-V": False, "--quiet": False,
    "-q": False, "--log": True, "--log-file": True, "--local-log": True, "--no-input": False,
    "--keyring-provider": True, "--proxy": True, "--retries": True, "--timeout": True,
    "--default-timeout": True, "--exists-action": True, "--trusted-host": True,
    "--cert": True, "--client-cert": True, "--cache-dir": True, "--no-cache-dir": False,
    "--disable-pip-version-check": False, "--no-color": False,
    "--no-python-version-warning": False, "--use-feature": True, "--use-deprecated": True,
}  # fmt: skip

# Refused, each with why: a refusal says what to do instead. The reasons pip's and uv's
# refusals share (``agent.core.uv_options`` takes them from here).
_FILE_LIST = "list the requirements in pip.packages instead"
WRITES = "writes outside the env's venv"
READS = "reads a file of the agent's node"
BACKEND = "passes arguments to a package's build backend, which may take them as paths"
EXITS = "prints and exits without installing anything"
REFUSED: dict[str, str] = {
    "-r": f"reads a requirements file (which may name further files); {_FILE_LIST}",
    "--requirement": f"reads a requirements file (which may name further files); {_FILE_LIST}",
    "-c": f"reads a constraints file (which may name further files); {_FILE_LIST}",
    "--constraint": f"reads a constraints file (which may name further files); {_FILE_LIST}",
    "-C": BACKEND, "--config-settings": BACKEND, "--global-option": BACKEND,
    "--build-option": BACKEND,  # older pips'
    "-t": WRITES, "--target": WRITES, "--prefix": WRITES, "--root": WRITES,
    "--user": WRITES, "--src": WRITES, "--source": WRITES, "--source-dir": WRITES,
    "--source-directory": WRITES, "--cache-dir": WRITES, "--log": WRITES,
    "--log-file": WRITES, "--local-log": WRITES, "--report": WRITES,
    "--build": WRITES, "-b": WRITES,  # older pips' build folder
    "--cert": READS, "--client-cert": READS,
    "--python": "picks another interpreter than the env's venv",
    "--keyring-provider": "runs a credential helper of the agent's node",
    "--help": EXITS, "-h": EXITS, "--version": EXITS, "-V": EXITS,
}  # fmt: skip

ALLOWED: dict[str, bool] = {k: v for k, v in PIP_INSTALL.items() if k not in REFUSED}

# The options pip reads from a line of a requirements file (pip 23.2's ``SUPPORTED_OPTIONS``),
# but -r and -c (refused, as above) and -e (a line of its own: ``local_sources.editable``).
REQUIREMENTS_FILE: dict[str, bool] = {
    flag: PIP_INSTALL[flag]
    for flag in (
        "--index-url", "--pypi-url", "-i", "--extra-index-url", "--no-index", "--find-links",
        "-f", "--no-binary", "--only-binary", "--prefer-binary", "--require-hashes", "--pre",
        "--trusted-host", "--use-feature",
    )
}  # fmt: skip

# The places pip finds packages at, and what finding them needs: a set with a ``pip_version``
# installs that pip from them (``PipSpec.index_options``).
INDEX_OPTIONS: dict[str, bool] = {
    flag: PIP_INSTALL[flag]
    for flag in (
        "--index-url", "--pypi-url", "-i", "--extra-index-url", "--no-index", "--find-links",
        "-f", "--trusted-host", "--proxy", "--retries", "--timeout", "--default-timeout",
    )
}  # fmt: skip

# The options of ALLOWED that ``uv pip install`` (0.13) takes as pip does: a pip env naming only
# these may be built by uv (``pip-installer uv``); any other makes pip build it (``PIP_ONLY``).
# uv takes --platform, --python-version, --isolated and --break-system-packages too, but they mean
# another thing there.
_UV_TAKES = frozenset({
    "--index-url", "-i", "--extra-index-url", "--no-index", "--find-links", "-f",
    "--trusted-host", "--pre", "--no-deps", "--only-binary", "--no-binary",
    "--no-build-isolation", "--upgrade", "-U", "--force-reinstall", "--require-hashes",
    "--no-cache-dir", "--compile", "--no-compile", "--quiet", "-q", "--verbose", "-v",
    "--editable", "-e", "--no-color", "--disable-pip-version-check", "--dry-run",
})  # fmt: skip
PIP_ONLY = frozenset(ALLOWED) - _UV_TAKES
