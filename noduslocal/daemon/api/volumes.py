"""Named volumes: create (owned by the caller), list, read their files, remove. A job mounts
one with volumes={path: name}; only the volume's owner (or an admin) may."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from noduslocal.daemon.api.body import read as read_body
from noduslocal.daemon.api.files import file_response, list_response
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.services import SERVICES
from noduslocal.domain import errors
from noduslocal.domain.timefmt import iso
from noduslocal.domain.validation import validate_name

routes = web.RouteTableDef()


async def owned_volume(request: web.Request, action: str) -> dict[str, Any]:
    caller: Caller = request["caller"]
    name = validate_name(request.match_info["name"], "name")
    found = await request.app[SERVICES].resources.volumes(name)
    if not found:
        raise errors.NotFound(f"there is no volume {name!r}")
    if not caller.may_control(found[0]["owner_uid"]):
        raise errors.PermissionDenied(
            f"{caller.name} may not {action} volume {name!r}: it belongs to {found[0]['owner']}")
    return found[0]


@routes.post("/v1/volumes")
async def create_volume(request: web.Request) -> web.Response:
    caller: Caller = request["caller"]
    body: Any = await read_body(request)
    if not isinstance(body, dict) or set(body) != {"name"}:
        raise errors.InvalidArgument('body: expected {"name": ...}', field="body")
    name = validate_name(body["name"], "name")
    await request.app[SERVICES].resources.create_volume(name, caller.owner, caller.gid)
    return web.json_response({"name": name, "owner": caller.name}, status=201)


@routes.get("/v1/volumes")
async def list_volumes(request: web.Request) -> web.Response:
    rows = await request.app[SERVICES].resources.volumes()
    return web.json_response({"volumes": [
        {"name": r["name"], "owner": r["owner"], "created_at": iso(r["created_at"])}
        for r in rows]})


@routes.delete("/v1/volumes/{name}")
async def delete_volume(request: web.Request) -> web.Response:
    volume = await owned_volume(request, "remove")
    await request.app[SERVICES].resources.delete_volume(volume["name"])
    return web.json_response({"name": volume["name"], "deleted": True})


@routes.get("/v1/volumes/{name}/files")
async def volume_files(request: web.Request) -> web.Response:
    volume = await owned_volume(request, "read")
    root = request.app[SERVICES].resources.volume_dir(volume["name"])
    return await list_response(request, root)


@routes.get("/v1/volumes/{name}/files/content")
async def volume_download(request: web.Request) -> web.StreamResponse:
    volume = await owned_volume(request, "read")
    root = request.app[SERVICES].resources.volume_dir(volume["name"])
    return await file_response(request, root, volume["owner_uid"])
