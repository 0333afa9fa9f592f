"""The box's GPUs as the daemon sees them: each GPU with its load, health, the job and
user holding it, and processes nobody here started; and each GPU's readings over the last
hour. Anyone may read them, like the queue.
"""

from __future__ import annotations

import math
from typing import Any

from aiohttp import web

from noduslocal.daemon.api import lanes
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


@routes.get("/v1/gpus/history")
async def gpu_history(request: web.Request) -> web.Response:
    """Each GPU's utilisation, memory used, power and holding over the last hour, as
    columns (`since`: only samples newer than these unix seconds; `gpu`: one GPU's, by
    index)."""
    services = request.app[SERVICES]
    history, inventory = services.gpu_history, services.admin.inventory
    since = _since(request)
    index = _gpu_index(request, sorted(history.indexes(inventory)))
    caller: Caller = request["caller"]
    async with services.lanes.read(caller.uid, caller.name, "GPU history"):
        body = await lanes.dumps(history.view(inventory, since, index))
    return web.Response(body=body, content_type="application/json")


def _since(request: web.Request) -> float | None:
    text = request.query.get("since")
    if text is None:
        return None
    try:
        since = float(text)
    except ValueError:
        since = math.nan
    if not math.isfinite(since) or since < 0:
        raise errors.InvalidArgument(f"since: expected unix seconds from 0, not {text!r}",
                                     field="since")
    return since


def _gpu_index(request: web.Request, known: list[int]) -> int | None:
    text = request.query.get("gpu")
    if text is None:
        return None
    try:
        index = int(text)
    except ValueError:
        raise errors.InvalidArgument(f"gpu: expected a GPU index, not {text!r}",
                                     field="gpu") from None
    if index not in known:
        listed = ", ".join(map(str, known)) if known else "none"
        raise errors.InvalidArgument(f"gpu: there is no GPU {index} (GPUs: {listed})",
                                     field="gpu")
    return index


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
