"""The box's GPUs as the daemon sees them: each GPU with its load, health, the job and
user holding it, and processes nobody here started. Anyone may read it, like the queue.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.services import SERVICES
from noduslocal.domain import errors

routes = web.RouteTableDef()


@routes.get("/v1/gpus")
async def list_gpus(request: web.Request) -> web.Response:
    admin = request.app[SERVICES].admin
    doc: dict[str, Any] = admin.inventory.to_wire()
    for now, wire in zip(admin.gpus(), doc["gpus"], strict=True):
        holder = now.job
        wire["job"] = None if holder is None else {
            "name": holder.name, "project": holder.project, "owner": holder.owner,
            "rank": now.rank}
        wire["busy"] = now.busy
        wire["drained"] = now.drained
    return web.json_response({"kind": "GpuList", **doc})


async def _set_drain(request: web.Request, drained: bool) -> web.Response:
    caller: Caller = request["caller"]
    if not caller.admin:
        raise errors.PermissionDenied(f"{caller.name} may not drain GPUs: admins only "
                                      "(root, or the admin group)")
    gpu = await request.app[SERVICES].admin.drain(request.match_info["index"], drained,
                                                  caller.name)
    return web.json_response({"index": gpu.index, "uuid": gpu.uuid, "drained": drained})


@routes.post("/v1/gpus/{index}/drain")
async def drain(request: web.Request) -> web.Response:
    """Nothing new lands on the GPU; what runs there finishes (admins only)."""
    return await _set_drain(request, True)


@routes.post("/v1/gpus/{index}/undrain")
async def undrain(request: web.Request) -> web.Response:
    return await _set_drain(request, False)
