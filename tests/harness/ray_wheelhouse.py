"""Offline material for the `uv run` tests and the uv-run benchmark: a find-links folder with
Ray and its core dependencies, a large incompressible dependency, and uv PROJECT folders
(``pyproject.toml``, ``uv.lock``, a ``launch.py`` with a bare ``ray.init()``).

Nothing here touches a network. The wheelhouse is made by repacking the distributions installed
in this interpreter's environment (its Ray, 2.60.0 or CI's oldest, and its core closure, no
extras): for each one, the files its RECORD lists under site-packages and its ``.dist-info``,
zipped (stored, not deflated: fast) into a ``.whl`` named from its WHEEL tags, with a fresh
RECORD. What an installer made (``__pycache__``, ``INSTALLER``, ``REQUESTED``,
``direct_url.json``, the console scripts outside site-packages) is left out: uv makes its own
from ``entry_points.txt``.

It is made once per machine user and kept (``/tmp/rtenv-wheelhouse-<uid>/<key>``, the key
naming every distribution's version and this python's tag; a folder of the user's own, mode
0700, refused otherwise): built under a temporary name beside it and renamed into place, so
concurrent pytest workers either find a complete one or build their own and the loser's is
dropped. ``RTENV_WHEELHOUSE_BASE`` puts it elsewhere.

The benchmark's ``uv-run`` workload imports this module (``scripts/benchlib/uv_run.py``);
nothing here imports pytest.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import random
import shutil
import stat
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

try:  # the Ray installed here: the tests run 2.60.0, and CI's second venv the oldest supported
    RAY_VERSION = metadata.version("ray")
except metadata.PackageNotFoundError:  # pragma: no cover - ray is in the dev extra
    RAY_VERSION = "2.60.0"
BIG = "bigdep"  # the large dependency's distribution and module name
FORMAT = 1  # bump when the wheelhouse's layout changes: a new key, a new folder
MiB = 2**20
_SKIP_INFO = {"RECORD", "INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json"}


# -- the Ray wheelhouse ------------------------------------------------------------------------


def closure(root: str = "ray") -> list[metadata.Distribution]:
    """``root``'s installed distribution and its requirements', transitively, without extras,
    with this interpreter's markers; sorted by name. A requirement not installed here is an
    error naming it (the wheelhouse could not be complete)."""
    found: dict[str, metadata.Distribution] = {}
    todo = [root]
    for _ in range(1000):  # bounded: a closure of a thousand is a broken environment
        if not todo:
            break
        name = canonicalize_name(todo.pop())
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise RuntimeError(f"{name} (needed by {root}) is not installed here") from None
        found[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [found[name] for name in sorted(found)]


def wheel_name(dist: metadata.Distribution) -> str:
    """``<name>-<version>-<tags>.whl``, the tags compressed from the WHEEL file's Tag lines
    (``py2-none-any`` and ``py3-none-any`` -> ``py2.py3-none-any``)."""
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]  # fmt: skip
    if not tags:
        raise RuntimeError(f"{dist.metadata['Name']}: its WHEEL names no tag")
    parts: list[list[str]] = [[], [], []]
    for tag in tags:
        for i, part in enumerate(tag.split("-")):
            if part not in parts[i]:
                parts[i].append(part)
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    return f"{name}-{dist.version}-{'-'.join('.'.join(p) for p in parts)}.whl"


def _installed_files(dist: metadata.Distribution) -> Iterator[tuple[str, Path]]:
    """(path in the wheel, file on disk) for each file of ``dist`` under site-packages, but what
    an installer made."""
    for entry in dist.files or []:
        text = str(entry)
        if text.startswith(("..", "/")) or "__pycache__" in entry.parts:
            continue
        if entry.parts[0].endswith(".dist-info") and entry.name in _SKIP_INFO:
            continue
        path = Path(str(dist.locate_file(entry)))
        if path.is_file():
            yield text, path


def _digest(body: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()


def repack(dist: metadata.Distribution, directory: Path) -> Path:
    """``dist`` as a wheel in ``directory`` (stored; each file's mode kept, so the raylet's
    binaries stay executable; a fresh RECORD)."""
    wheel = directory / wheel_name(dist)
    infos = {
        path for path, _ in _installed_files(dist) if path.split("/")[0].endswith(".dist-info")
    }
    info_dir = next(iter(infos)).split("/")[0] if infos else ""
    if not info_dir:
        raise RuntimeError(f"{dist.metadata['Name']}: no .dist-info among its files")
    record: list[str] = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for arcname, path in _installed_files(dist):
            body = path.read_bytes()
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (stat.S_IFREG | stat.S_IMODE(path.stat().st_mode)) << 16
            zf.writestr(info, body)
            record.append(f"{arcname},sha256={_digest(body)},{len(body)}")
        record.append(f"{info_dir}/RECORD,,")
        zf.writestr(f"{info_dir}/RECORD", "\n".join(record) + "\n")
    return wheel


def _key(dists: Sequence[metadata.Distribution]) -> str:
    versions = ",".join(f"{d.metadata['Name']}=={d.version}" for d in dists)
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}-{sys.platform}-{FORMAT}"
    return f"ray-{RAY_VERSION}-{tag}-{hashlib.sha256(versions.encode()).hexdigest()[:12]}"


def user_base() -> Path:
    """``$RTENV_WHEELHOUSE_BASE`` or ``/tmp/rtenv-wheelhouse-<uid>``: made 0700 if missing; one
    owned by someone else, or open to others, is refused (its wheels could be anyone's)."""
    base = os.environ.get("RTENV_WHEELHOUSE_BASE") or f"/tmp/rtenv-wheelhouse-{os.getuid()}"
    path = Path(base)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise RuntimeError(
            f"{path} is not a folder of this user's closed to others: remove it, or set "
            "RTENV_WHEELHOUSE_BASE"
        )
    return path


@dataclass(frozen=True)
class Wheelhouse:
    path: Path  # the find-links folder
    wheels: tuple[str, ...]  # its file names
    built_s: float | None  # how long this call took to build it (None: found ready)


def ray_wheelhouse() -> Wheelhouse:
    """The find-links folder of ``ray==RAY_VERSION`` and its core closure, built from this
    interpreter's environment the first time on this machine for this user, found after."""
    dists = closure("ray")
    ray = next(d for d in dists if canonicalize_name(d.metadata["Name"]) == "ray")
    if ray.version != RAY_VERSION:
        raise RuntimeError(f"ray {ray.version} is installed here, not {RAY_VERSION}")
    final = user_base() / _key(dists)
    if final.is_dir():
        return Wheelhouse(final, tuple(sorted(p.name for p in final.iterdir())), None)
    started = time.monotonic()
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        names = tuple(sorted(repack(d, staging).name for d in dists))
        try:
            staging.rename(final)  # atomic: the folder is complete, or it is not there
        except OSError:
            if not final.is_dir():  # not a peer's win: a real failure
                raise
            return Wheelhouse(final, tuple(sorted(p.name for p in final.iterdir())), None)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return Wheelhouse(final, names, time.monotonic() - started)


# -- the large dependency ----------------------------------------------------------------------

_BIG_INIT = '''"""A stand-in for a huge dependency: incompressible bytes beside this module."""
from pathlib import Path

VERSION = {version!r}
DATA = Path(__file__).with_name("payload.bin")


def size() -> int:
    """The payload's bytes, as installed."""
    return DATA.stat().st_size
'''


def big_wheel(directory: Path, megabytes: float, *, version: str = "1.0", seed: int = 0) -> Path:
    """``directory/bigdep-<version>-py3-none-any.whl``: the module ``bigdep`` (``VERSION``,
    ``size()``) and ``megabytes`` MiB of random bytes (reproducible from ``seed``) beside it,
    stored: the wheel is as large as what it installs, and nothing compresses it."""
    directory.mkdir(parents=True, exist_ok=True)
    info = f"{BIG}-{version}.dist-info"
    payload = random.Random(seed).randbytes(int(megabytes * MiB))
    files = {
        f"{BIG}/__init__.py": _BIG_INIT.format(version=version).encode(),
        f"{BIG}/payload.bin": payload,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {BIG}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: rtenv-tests\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = [f"{path},sha256={_digest(body)},{len(body)}" for path, body in files.items()]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = directory / f"{BIG}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED) as zf:
        for path, body in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), body)
    return wheel
