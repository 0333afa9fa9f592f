"""A job's kept workspace: list a directory and download a file (with X-Nodus-SHA256),
for the job's owner or an admin."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from noduslocal.daemon.api.jobs import lookup, require_control
from noduslocal.daemon.api.services import SERVICES, start_stream
from noduslocal.daemon.files import workspace
from noduslocal.domain.job_paths import components

routes = web.RouteTableDef()
SHA256_HEADER = "X-Nodus-SHA256"


@asynccontextmanager
async def job_workspace(request: web.Request) -> AsyncIterator[tuple[Path, int]]:
    """The workspace of the job the request names, and its owner, for owner or admin;
    its merged view is there while in it."""
    job = await lookup(request)
    require_control(request, job, "read the files of")
    async with request.app[SERVICES].jobs.workspace(job) as root:
        yield root, job.owner_uid


async def list_response(request: web.Request, root: Path) -> web.Response:
    path = request.query.get("path", "")
    entries = await asyncio.to_thread(workspace.list_path, root, path)
    return web.json_response({"path": "/".join(components(path)),
                              "entries": entries})


async def file_response(request: web.Request, root: Path, owner_uid: int) -> web.StreamResponse:
    fd, size, digest = await asyncio.to_thread(
        workspace.open_file, root, request.query.get("path", ""), owner_uid)
    # Its permission bits travel with it (never setuid, setgid or sticky): a script
    # downloaded stays executable, a 0644 file is not made 0600.
    mode = os.fstat(fd).st_mode & 0o777
    return await send_fd(request, fd, size, digest, {MODE_HEADER: f"{mode:o}"})


@routes.get("/v1/jobs/{name}/files")
async def list_files(request: web.Request) -> web.Response:
    async with job_workspace(request) as (root, _):
        return await list_response(request, root)


@routes.get("/v1/jobs/{name}/files/content")
async def download_file(request: web.Request) -> web.StreamResponse:
    async with job_workspace(request) as (root, owner_uid):
        return await file_response(request, root, owner_uid)


MODE_HEADER = "X-Nodus-Mode"


async def send_fd(request: web.Request, fd: int, size: int, digest: str,
                  headers: dict[str, str] | None = None) -> web.StreamResponse:
    """Stream an open file with its sha256 in X-Nodus-SHA256, then close it."""
    try:
        resp = web.StreamResponse(headers={
            "Content-Type": "application/octet-stream", "Content-Length": str(size),
            SHA256_HEADER: digest, **(headers or {})})
        await start_stream(request, resp)
        sent = 0
        while sent < size:
            chunk = await asyncio.to_thread(os.read, fd, min(1 << 20, size - sent))
            if not chunk:
                break  # shrank under us: the client's hash check catches it
            await resp.write(chunk)
            sent += len(chunk)
        await resp.write_eof()
        return resp
    finally:
        os.close(fd)
