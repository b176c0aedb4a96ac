"""The Ray chaos run's workload: every package's bytes (seeded), and the env cases that share them.

``material(seed)`` builds, in memory and deterministically (fixed zip timestamps and modes,
content drawn from a ``random.Random`` of the seed and the package's name), three working_dir
zips (one of about 1.6 MiB, so eviction has bytes to count), three py_modules zips (each a
package folder ``chaos_mod_X/``) and four wheels, all on a PEP 503 index (``chaos_a``,
``chaos_b``, ``chaos_c`` installed by pip and uv envs; ``chaos_w`` and ``chaos_a`` named in
py_modules by their URL, which Ray pip-installs with ``--target``). A wheel is
a zip with its ``<dist>-1.0.dist-info/`` (METADATA, WHEEL, RECORD with every file's sha256), no
build, no dependencies (pip's ``--target`` install of a py_modules wheel would ask an index for
them).

An http(s) zip loses its single top folder when it is unpacked (Ray's
``remove_top_level_directory``, which this agent's Ray door follows), so a py_modules zip wraps
its package folder in one (``mod-a/chaos_mod_a/...``: the module's folder then holds
``chaos_mod_a/``), and one working_dir zip (``wd-c``) has several top entries, kept as they are.

``env_cases(material, base_url)`` names the envs: each is a runtime env (URLs filled in), what a
task in it must see (``expect``: section -> relative path -> sha256) and the server paths it
downloads (``paths``: what the oracle blames for a fault of the server). Sections:
``working_dir`` (every file under the task's cwd, exactly) and ``module:<name>`` (every file
under the imported module's package folder, ``__pycache__`` aside: pip compiles a wheel's
bytecode when it installs it). Every env sets ``PYTHONDONTWRITEBYTECODE`` so that no task writes
into a package that other envs share, and ``CHAOS_ENV`` (its name). Pure.
"""

from __future__ import annotations

import base64
import hashlib
import io
import random
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

VERSION = "1.0"
_DATE = (2020, 1, 1, 0, 0, 0)  # every zip entry's timestamp: the same seed, the same bytes
_FILE_MODE = 0o100644 << 16


@dataclass(frozen=True)
class _File:
    path: str  # relative to the package's folder (inside the zip's top folder, if any)
    size: int
    kind: str  # "py" (source: a VALUE line, then comments), "text", "blob" (random bytes)


@dataclass(frozen=True)
class _Zip:
    path: str  # the server path
    top: str | None  # the single top folder wrapping the files (stripped on unpacking)
    files: tuple[_File, ...]


@dataclass(frozen=True)
class _Wheel:
    dist: str  # the distribution and its module (a package folder of that name)
    files: tuple[_File, ...]  # relative to the package folder


_ZIPS = (
    _Zip("/pkg/wd-a.zip", "wd-a", (
        _File("README.txt", 600, "text"), _File("conf/settings.txt", 300, "text"),
        _File("data/blob.bin", 1_600_000, "blob"), _File("data/notes.txt", 4000, "text"),
    )),
    _Zip("/pkg/wd-b.zip", "wd-b", (
        _File("main.py", 2000, "py"), _File("src/app/__init__.py", 100, "py"),
        _File("src/app/core.py", 6000, "py"), _File("assets/img.bin", 48_000, "blob"),
        _File("assets/deep/er/file.txt", 1000, "text"),
    )),
    _Zip("/pkg/wd-c.zip", None, (
        _File("job.txt", 300, "text"), _File("cfg/a.ini", 400, "text"),
        _File("cfg/b.ini", 400, "text"), _File("payload.bin", 12_000, "blob"),
    )),
    _Zip("/pkg/mod-a.zip", "mod-a", (
        _File("chaos_mod_a/__init__.py", 300, "py"), _File("chaos_mod_a/util.py", 2000, "py"),
        _File("chaos_mod_a/data.bin", 16_000, "blob"),
    )),
    _Zip("/pkg/mod-b.zip", "mod-b", (
        _File("chaos_mod_b/__init__.py", 300, "py"),
        _File("chaos_mod_b/sub/__init__.py", 80, "py"),
        _File("chaos_mod_b/sub/deep.py", 3000, "py"),
        _File("chaos_mod_b/blob.bin", 120_000, "blob"),
    )),
    _Zip("/pkg/mod-c.zip", "mod-c", (
        _File("chaos_mod_c/__init__.py", 200, "py"), _File("chaos_mod_c/table.txt", 2000, "text"),
    )),
)  # fmt: skip
_WHEELS = (
    _Wheel("chaos_a", (_File("__init__.py", 200, "py"), _File("data.txt", 4000, "text"))),
    _Wheel("chaos_b", (
        _File("__init__.py", 200, "py"), _File("helpers.py", 1500, "py"),
        _File("payload.bin", 32_000, "blob"),
    )),
    _Wheel("chaos_c", (_File("__init__.py", 150, "py"),)),
    _Wheel("chaos_w", (
        _File("__init__.py", 300, "py"), _File("helpers.py", 2000, "py"),
        _File("data/blob.bin", 150_000, "blob"),
    )),
)  # fmt: skip


@dataclass(frozen=True)
class _Case:
    name: str
    working_dir: str | None = None  # a zip's server path
    py_modules: tuple[str, ...] = ()  # zips' server paths, or wheels' dists
    pip: tuple[str, ...] = ()  # wheels' dists, from the index
    uv: tuple[str, ...] = ()


# every package (zip, wheel) is named by two cases or more: eviction and sharing race on each
_CASES = (
    _Case("wd-1", working_dir="/pkg/wd-a.zip"),
    _Case("wd-2", working_dir="/pkg/wd-b.zip"),
    _Case("wd-3", working_dir="/pkg/wd-c.zip"),
    _Case("mods-zip-1", py_modules=("/pkg/mod-a.zip",)),
    _Case("mods-zip-2", py_modules=("/pkg/mod-a.zip", "/pkg/mod-b.zip")),
    _Case("mods-zip-3", py_modules=("/pkg/mod-c.zip", "/pkg/mod-b.zip")),
    _Case("mods-whl-1", py_modules=("chaos_w",)),
    _Case("mods-whl-2", py_modules=("chaos_a", "/pkg/mod-c.zip")),
    _Case("pip-1", pip=("chaos_a",)),
    _Case("pip-2", pip=("chaos_a", "chaos_b")),
    _Case("uv-1", uv=("chaos_b", "chaos_c")),
    _Case("uv-2", uv=("chaos_a", "chaos_c")),
    _Case("mix-1", working_dir="/pkg/wd-a.zip", py_modules=("/pkg/mod-a.zip",)),
    _Case("mix-2", working_dir="/pkg/wd-b.zip", py_modules=("/pkg/mod-b.zip", "chaos_w")),
    _Case("mix-3", working_dir="/pkg/wd-c.zip", py_modules=("/pkg/mod-c.zip", "/pkg/mod-a.zip")),
)

Tree = dict[str, str]  # relative path -> sha256 (hex)


@dataclass(frozen=True)
class Material:
    """Every package of one seed: ``files`` (server path -> zip), ``wheels`` (wheel file name ->
    bytes, served as ``/files/<name>`` with PEP 503 pages ``/simple/<project>/``), and what each
    unpacks to: ``trees`` (a zip's server path -> its folder, top folder stripped) and
    ``modules`` (a wheel's module -> its package folder)."""

    seed: int
    files: dict[str, bytes] = field(default_factory=dict)
    wheels: dict[str, bytes] = field(default_factory=dict)
    trees: dict[str, Tree] = field(default_factory=dict)
    modules: dict[str, Tree] = field(default_factory=dict)

    def pages(self) -> dict[str, bytes]:
        """The index's PEP 503 project pages: ``/simple/<project>/`` -> HTML linking each wheel
        (``#sha256=`` fragment included)."""
        out = {}
        for name, body in sorted(self.wheels.items()):
            digest = hashlib.sha256(body).hexdigest()
            link = f'<a href="/files/{name}#sha256={digest}">{name}</a>'
            page = f"<!DOCTYPE html>\n<html><body>\n{link}\n</body></html>\n"
            out[f"/simple/{project(name.split('-')[0])}/"] = page.encode()
        return out

    def routes(self) -> dict[str, bytes]:
        """Every path served and its body: the zips, the wheels and the index's pages."""
        wheels = {f"/files/{name}": body for name, body in self.wheels.items()}
        return {**self.files, **wheels, **self.pages()}


@dataclass(frozen=True)
class EnvCase:
    name: str
    runtime_env: dict[str, Any]  # JSON-able, URLs filled in
    expect: dict[str, Tree]  # section ("working_dir", "module:<name>") -> what a task sees
    paths: tuple[str, ...]  # the server paths this env downloads

    def spec(self) -> dict[str, Any]:
        """The case as the driver's spec lists it (``driver.py``: name, runtime_env, expect)."""
        return {"name": self.name, "runtime_env": self.runtime_env, "expect": self.expect}


def project(dist: str) -> str:
    """A distribution's PEP 503 name (``chaos_a`` -> ``chaos-a``)."""
    return dist.lower().replace("_", "-").replace(".", "-")


def wheel_file(dist: str) -> str:
    return f"{dist}-{VERSION}-py3-none-any.whl"


def material(seed: int) -> Material:
    """Every package's bytes for ``seed``: the same seed, the same bytes. Pure."""
    made = Material(seed)
    for spec in _ZIPS:
        contents = {f.path: _content(seed, spec.path, f) for f in spec.files}
        prefix = f"{spec.top}/" if spec.top else ""
        made.files[spec.path] = zip_bytes({prefix + p: b for p, b in contents.items()})
        made.trees[spec.path] = {p: _sha(b) for p, b in contents.items()}
    for wheel in _WHEELS:
        contents = {f.path: _content(seed, wheel.dist, f) for f in wheel.files}
        made.wheels[wheel_file(wheel.dist)] = wheel_bytes(wheel.dist, contents)
        made.modules[wheel.dist] = {p: _sha(b) for p, b in contents.items()}
    return made


def env_cases(material: Material, base_url: str) -> list[EnvCase]:
    """The env cases over ``material`` served at ``base_url`` (``http://127.0.0.1:PORT``). Pure."""
    return [_env_case(case, material, base_url) for case in _CASES]


def _env_case(case: _Case, material: Material, base_url: str) -> EnvCase:
    env: dict[str, Any] = {}
    expect: dict[str, Tree] = {}
    paths: list[str] = []
    if case.working_dir is not None:
        env["working_dir"] = base_url + case.working_dir
        expect["working_dir"] = dict(material.trees[case.working_dir])
        paths.append(case.working_dir)
    if case.py_modules:
        env["py_modules"] = []
        for entry in case.py_modules:
            path = entry if entry.endswith(".zip") else f"/files/{wheel_file(entry)}"
            env["py_modules"].append(base_url + path)
            paths.append(path)
            if entry.endswith(".zip"):
                expect.update(_zip_modules(material.trees[entry]))
            else:
                expect[f"module:{entry}"] = dict(material.modules[entry])
    index = ["--index-url", f"{base_url}/simple"]
    for tool, dists in (("pip", case.pip), ("uv", case.uv)):
        if dists:
            options = "pip_install_options" if tool == "pip" else "uv_pip_install_options"
            packages = [f"{project(d)}=={VERSION}" for d in dists]
            env[tool] = {"packages": packages, options: list(index)}
            for dist in dists:
                expect[f"module:{dist}"] = dict(material.modules[dist])
                paths += [f"/simple/{project(dist)}/", f"/files/{wheel_file(dist)}"]
    env["env_vars"] = {"PYTHONDONTWRITEBYTECODE": "1", "CHAOS_ENV": case.name}
    return EnvCase(case.name, env, expect, tuple(dict.fromkeys(paths)))


def _zip_modules(tree: Mapping[str, str]) -> dict[str, Tree]:
    """A py_modules zip's folder as ``module:<name>`` sections: each top folder is a package."""
    out: dict[str, Tree] = {}
    for path, digest in tree.items():
        top, _, rest = path.partition("/")
        out.setdefault(f"module:{top}", {})[rest] = digest
    return out


def zip_bytes(files: Mapping[str, bytes]) -> bytes:
    """A zip of ``files`` (entry name -> bytes), deterministic: sorted entries, one timestamp,
    mode 0644; random payloads (``.bin``) stored, the rest deflated."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name in sorted(files):
            info = zipfile.ZipInfo(name, date_time=_DATE)
            info.external_attr = _FILE_MODE
            info.create_system = 3  # unix: the mode above is read
            stored = name.endswith(".bin")
            info.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            zf.writestr(info, files[name])
    return buf.getvalue()


def wheel_bytes(dist: str, package: Mapping[str, bytes]) -> bytes:
    """A pure-python wheel of ``dist`` (version ``VERSION``, no dependencies): ``package``'s
    files (relative path -> bytes) in the folder ``<dist>/``, its ``.dist-info`` with a RECORD
    holding each file's urlsafe-base64 sha256 and size, as pip and uv check them."""
    info = f"{dist}-{VERSION}.dist-info"
    files = {f"{dist}/{path}": body for path, body in sorted(package.items())}
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {project(dist)}\nVersion: {VERSION}\n".encode()
    )
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: chaosray\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = [f"{path},sha256={record_digest(body)},{len(body)}" for path, body in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    return zip_bytes(files)


def record_digest(body: bytes) -> str:
    """A RECORD line's hash: sha256, urlsafe base64 without padding (PEP 376/427)."""
    return base64.urlsafe_b64encode(hashlib.sha256(body).digest()).rstrip(b"=").decode()


def _sha(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def _content(seed: int, package: str, spec: _File) -> bytes:
    """A file's bytes, drawn from the seed, the package and the file's path."""
    rng = random.Random(f"chaosray:{seed}:{package}:{spec.path}")
    if spec.kind == "blob":
        return rng.randbytes(spec.size)
    head = f"VALUE = {f'{package}/{spec.path} seed {seed}'!r}\n" if spec.kind == "py" else ""
    lead = "# " if spec.kind == "py" else ""
    lines = [head]
    while sum(map(len, lines)) < spec.size:
        lines.append(f"{lead}{rng.randbytes(24).hex()}\n")
    return "".join(lines).encode()[: max(spec.size, len(head))].rstrip(b"\n") + b"\n"
