"""What only admins may ask of the daemon: a consistent copy of its database, taken with
SQLite's online backup while the daemon runs, for `noduslocal admin backup`."""

from __future__ import annotations

import asyncio
import hashlib
import os

from aiohttp import web

from noduslocal import errors
from noduslocal.api.files import send_fd
from noduslocal.api.identity import Caller
from noduslocal.api.services import SERVICES
from noduslocal.workspace import iter_chunks

routes = web.RouteTableDef()


def _hashed(fd: int) -> tuple[int, str]:
    digest = hashlib.sha256()
    for chunk in iter_chunks(fd):
        digest.update(chunk)
    size = os.lseek(fd, 0, os.SEEK_CUR)
    os.lseek(fd, 0, os.SEEK_SET)
    return size, digest.hexdigest()


@routes.get("/v1/admin/backup")
async def backup(request: web.Request) -> web.StreamResponse:
    caller: Caller = request["caller"]
    if not caller.admin:
        raise errors.PermissionDenied("backup: you may not copy the daemon's database; only "
                                      "admins may")
    services = request.app[SERVICES]
    target = services.settings.data_dir / f".backup-{os.getpid()}-{os.urandom(6).hex()}.db"
    try:
        await asyncio.to_thread(services.store.backup_to, target)
        fd = os.open(target, os.O_RDONLY | os.O_CLOEXEC)
    finally:
        target.unlink(missing_ok=True)  # an open descriptor keeps what we send
    size, digest = await asyncio.to_thread(_hashed, fd)
    return await send_fd(request, fd, size, digest)
