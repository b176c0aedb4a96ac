"""A PEP 503 package index on 127.0.0.1 serving wheels a test names (``/simple/<project>/``
pages, ``/files/<wheel>`` bodies; any other project 404), and a real pip wheel to put in it:
the installed pip, packed again from its installed files (so the tests stay offline)."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web
from packaging.utils import canonicalize_name

from tests.harness.package_server import route_server


def project_of(wheel: Path) -> str:
    return canonicalize_name(wheel.name.split("-")[0])


@asynccontextmanager
async def wheel_index(*wheels: Path) -> AsyncIterator[str]:
    """The index of ``wheels``; yields its simple URL (``http://127.0.0.1:<port>/simple``)."""
    by_name = {wheel.name: wheel for wheel in wheels}

    async def route(request: web.Request) -> web.StreamResponse:
        kind, _, rest = request.match_info["name"].partition("/")
        if kind == "files" and rest in by_name:
            return web.Response(body=by_name[rest].read_bytes())
        project = canonicalize_name(rest.strip("/"))
        links = [
            f'<a href="/files/{w.name}">{w.name}</a>' for w in wheels if project_of(w) == project
        ]
        if kind != "simple" or not links:
            return web.Response(status=404)
        return web.Response(
            text=f"<html><body>{''.join(links)}</body></html>", content_type="text/html"
        )

    async with route_server(route) as base:
        yield f"{base}/simple"


def pip_wheel(dest: Path) -> Path:
    """The installed pip as a wheel in ``dest`` (its files and metadata, a fresh RECORD)."""
    dist = importlib.metadata.distribution("pip")
    version = dist.version
    info = f"pip-{version}.dist-info"
    wheel = dest / f"pip-{version}-py3-none-any.whl"
    dest.mkdir(parents=True, exist_ok=True)
    records = []
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as out:
        for file in dist.files or ():
            name = str(file)
            if "__pycache__" in name or name.startswith("..") or name.endswith(".pyc"):
                continue
            if name.startswith(info) and file.name in ("RECORD", "INSTALLER", "REQUESTED"):
                continue
            if name.startswith(info) and file.name == "direct_url.json":
                continue
            data = Path(str(file.locate())).read_bytes()
            out.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append(f"{name},sha256={digest.decode()},{len(data)}")
        records.append(f"{info}/RECORD,,")
        out.writestr(f"{info}/RECORD", "\n".join(records) + "\n")
    return wheel
