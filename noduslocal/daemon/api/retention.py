"""Disk use and retention: every user's use of the data dir against their quota (anyone
may see it, as anyone may list jobs: on a shared box the question is who fills the disk),
and a retention pass on an admin's request (`noduslocal du`, `noduslocal gc`)."""

from __future__ import annotations

from aiohttp import web

from noduslocal.daemon.api.admin import require_admin
from noduslocal.daemon.api.services import SERVICES
from noduslocal.domain import errors
from noduslocal.domain.timefmt import iso

routes = web.RouteTableDef()


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false")
    if value not in ("true", "false", "1", "0"):
        raise errors.InvalidArgument(f"{name}: expected true or false", field=name)
    return value in ("true", "1")


@routes.get("/v1/du")
async def disk_use(request: web.Request) -> web.Response:
    """Each user's job directories, volumes and blobs; `refresh` measures them now."""
    doc = await request.app[SERVICES].admin.du(request["caller"].uid, _flag(request, "refresh"))
    return web.json_response({**doc, "measured_at": iso(doc["measured_at"])})


@routes.post("/v1/admin/gc")
async def gc(request: web.Request) -> web.Response:
    """A retention pass now; `dry_run` says what it would remove and removes nothing."""
    require_admin(request, "gc: you may not run the retention pass")
    return web.json_response(await request.app[SERVICES].admin.reclaim(
        _flag(request, "dry_run")))
