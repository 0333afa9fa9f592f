"""What only admins may ask of the daemon: a consistent copy of its database, taken with
SQLite's online backup while the daemon runs (`noduslocal admin backup`), and a full
integrity check of it (`noduslocal doctor`)."""

from __future__ import annotations

import asyncio
import hashlib
import os

from aiohttp import web

from noduslocal.daemon.api.files import send_fd
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.services import SERVICES
from noduslocal.daemon.files.workspace import iter_chunks
from noduslocal.domain import errors

routes = web.RouteTableDef()


def _hashed(fd: int) -> tuple[int, str]:
    digest = hashlib.sha256()
    for chunk in iter_chunks(fd):
        digest.update(chunk)
    size = os.lseek(fd, 0, os.SEEK_CUR)
    os.lseek(fd, 0, os.SEEK_SET)
    return size, digest.hexdigest()


def require_admin(request: web.Request, what: str) -> None:
    caller: Caller = request["caller"]
    if not caller.admin:
        raise errors.PermissionDenied(f"{what}; only admins may")


@routes.get("/v1/admin/integrity")
async def integrity(request: web.Request) -> web.Response:
    require_admin(request, "integrity: you may not check the daemon's database")
    problems = await request.app[SERVICES].admin.integrity()
    return web.json_response({"ok": not problems, "problems": problems})


@routes.get("/v1/admin/backup")
async def backup(request: web.Request) -> web.StreamResponse:
    require_admin(request, "backup: you may not copy the daemon's database")
    services = request.app[SERVICES]
    target = services.settings.data_dir / f".backup-{os.getpid()}-{os.urandom(6).hex()}.db"
    try:
        await services.admin.backup(target)
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        target.unlink(missing_ok=True)  # an open descriptor keeps what we send
    size, digest = await asyncio.to_thread(_hashed, fd)
    return await send_fd(request, fd, size, digest)
