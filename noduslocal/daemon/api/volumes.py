"""Named volumes: create (owned by the caller), list, read their files, remove. A job mounts
one with volumes={path: name}; only the volume's owner (or an admin) may."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from noduslocal.daemon.api.body import read as read_body
from noduslocal.daemon.api.files import file_response, list_response
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.services import SERVICES
from noduslocal.daemon.store import resources
from noduslocal.domain import errors
from noduslocal.domain.timefmt import iso
from noduslocal.domain.validation import validate_name

routes = web.RouteTableDef()
log = logging.getLogger(__name__)


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
    body: Any = await read_body(request)
    if not isinstance(body, dict) or set(body) != {"name"}:
        raise errors.InvalidArgument('body: expected {"name": ...}', field="body")
    name = validate_name(body["name"], "name")
    services.lifecycle.room.require("new volumes", caller.uid, caller.name)
    # The row first: its unique key decides between two creates of one name, and only the
    # winner touches the directory.
    await services.store.write(lambda c: resources.create_volume(c, name, caller.owner,
                                                           time.time()))
    directory = services.layout.volume_dir(name)
    try:
        if directory.exists():  # left by a crash or a failed removal: the name is ours now
            await asyncio.to_thread(discard, directory)
        directory.mkdir(mode=0o700)
        if os.getuid() == 0:
            os.chown(directory, caller.uid, caller.gid)
    except Exception:
        await services.store.write(lambda c: resources.delete_volume(c, name))
        raise
    return web.json_response({"name": name, "owner": caller.name}, status=201)


def discard(directory: Path) -> None:
    """Move a directory out of the way at once, then delete it (shutil.rmtree is fd-based,
    so safe against links; a tree too deep for it stays behind, renamed, and is logged)."""
    trash = directory.with_name(f".trash-{directory.name}-{os.urandom(4).hex()}")
    os.rename(directory, trash)
    try:
        shutil.rmtree(trash)
    except (OSError, RecursionError):
        log.exception("could not delete %s", trash)


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
    await services.store.write(lambda c: resources.delete_volume(c, volume["name"]))
    directory = services.layout.volume_dir(volume["name"])
    if directory.exists():
        await asyncio.to_thread(discard, directory)
    services.lifecycle.usage.refresh_soon()
    return web.json_response({"name": volume["name"], "deleted": True})


@routes.get("/v1/volumes/{name}/files")
async def volume_files(request: web.Request) -> web.Response:
    volume = await owned_volume(request, "read")
    root = request.app[SERVICES].layout.volume_dir(volume["name"])
    return await list_response(request, root)


@routes.get("/v1/volumes/{name}/files/content")
async def volume_download(request: web.Request) -> web.StreamResponse:
    volume = await owned_volume(request, "read")
    root = request.app[SERVICES].layout.volume_dir(volume["name"])
    return await file_response(request, root, volume["owner_uid"])
