"""Named volumes: create (owned by the caller), list, read their files, remove. A job mounts
one with volumes={path: name}; only the volume's owner (or an admin) may."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from typing import Any

from aiohttp import web

from noduslocal import errors, workspace
from noduslocal.api.app import SERVICES
from noduslocal.api.files import send_fd
from noduslocal.api.identity import Caller
from noduslocal.models import iso
from noduslocal.store import ops
from noduslocal.validation import validate_name

routes = web.RouteTableDef()


async def owned_volume(request: web.Request, action: str) -> dict[str, Any]:
    caller: Caller = request["caller"]
    name = validate_name(request.match_info["name"], "name")
    found = await request.app[SERVICES].store.volumes(name)
    if not found:
        raise errors.NotFound(f"there is no volume {name!r}")
    if not caller.may_control(found[0]["owner_uid"]):
        raise errors.PermissionDenied(
            f"{caller.name} may not {action} volume {name!r}: it belongs to {found[0]['owner']}")
    return found[0]


@routes.post("/v1/volumes")
async def create_volume(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    caller: Caller = request["caller"]
    body: Any = json.loads(await request.read() or b"null")
    if not isinstance(body, dict) or set(body) != {"name"}:
        raise errors.InvalidArgument('body: expected {"name": ...}', field="body")
    name = validate_name(body["name"], "name")
    if await services.store.volumes(name):
        raise errors.AlreadyExists(f"name: volume {name!r} already exists", field="name")
    directory = services.supervisor.layout.volume_dir(name)
    # A directory without a row is left by a crash between the two steps below: not anyone's.
    await asyncio.to_thread(shutil.rmtree, directory, True)
    directory.mkdir(mode=0o700)
    if os.getuid() == 0:
        os.chown(directory, caller.uid, caller.gid)
    try:
        await services.store.write(lambda c: ops.create_volume(c, name, caller.owner,
                                                               time.time()))
    except errors.AlreadyExists:
        raise
    except Exception:
        await asyncio.to_thread(shutil.rmtree, directory, True)
        raise
    return web.json_response({"name": name, "owner": caller.name}, status=201)


@routes.get("/v1/volumes")
async def list_volumes(request: web.Request) -> web.Response:
    rows = await request.app[SERVICES].store.volumes()
    return web.json_response({"volumes": [
        {"name": r["name"], "owner": r["owner"], "created_at": iso(r["created_at"])}
        for r in rows]})


@routes.delete("/v1/volumes/{name}")
async def delete_volume(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    volume = await owned_volume(request, "remove")
    await services.store.write(lambda c: ops.delete_volume(c, volume["name"]))
    await asyncio.to_thread(shutil.rmtree, services.supervisor.layout.volume_dir(
        volume["name"]), True)
    return web.json_response({"name": volume["name"], "deleted": True})


@routes.get("/v1/volumes/{name}/files")
async def volume_files(request: web.Request) -> web.Response:
    volume = await owned_volume(request, "read")
    root = request.app[SERVICES].supervisor.layout.volume_dir(volume["name"])
    path = request.query.get("path", "")
    entries = await asyncio.to_thread(workspace.list_path, root, path)
    return web.json_response({"path": "/".join(workspace.components(path)),
                              "entries": entries})


@routes.get("/v1/volumes/{name}/files/content")
async def volume_download(request: web.Request) -> web.StreamResponse:
    volume = await owned_volume(request, "read")
    root = request.app[SERVICES].supervisor.layout.volume_dir(volume["name"])
    fd, size, digest = await asyncio.to_thread(
        workspace.open_file, root, request.query.get("path", ""), volume["owner_uid"])
    return await send_fd(request, fd, size, digest)
