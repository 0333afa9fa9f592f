"""The box's GPUs as the daemon sees them: each GPU with its load, health, the job and
user holding it, and processes nobody here started. Anyone may read it, like the queue.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.services import SERVICES
from noduslocal.daemon.store import resources
from noduslocal.domain import errors

routes = web.RouteTableDef()


@routes.get("/v1/gpus")
async def list_gpus(request: web.Request) -> web.Response:
    lifecycle = request.app[SERVICES].lifecycle
    inventory = lifecycle.inventory
    pool = lifecycle.queue.capacity.gpus
    doc: dict[str, Any] = inventory.to_wire()
    for gpu, wire in zip(inventory.gpus, doc["gpus"], strict=True):
        job_id = pool.holder.get(gpu.uuid) if pool else None
        holder = lifecycle.running_job(job_id) if job_id is not None else None
        wire["job"] = None if holder is None else {
            "name": holder.name, "project": holder.project, "owner": holder.owner,
            "rank": None if holder.spec.gang is None or not holder.spec.gang.gpus_per_node
            else pool.by_job[holder.id].index(gpu.uuid) // holder.spec.gang.gpus_per_node}
        wire["busy"] = pool.busy(gpu) if pool and job_id is None else None
        wire["drained"] = bool(pool and gpu.uuid in pool.drained)
    return web.json_response({"kind": "GpuList", **doc})


async def _set_drain(request: web.Request, drained: bool) -> web.Response:
    caller: Caller = request["caller"]
    if not caller.admin:
        raise errors.PermissionDenied(f"{caller.name} may not drain GPUs: admins only "
                                      "(root, or the admin group)")
    lifecycle = request.app[SERVICES].lifecycle
    raw = request.match_info["index"]
    gpu = next((g for g in lifecycle.inventory.gpus
                if str(g.index) == raw or g.uuid == raw), None)
    if gpu is None:
        raise errors.NotFound(f"there is no GPU {raw!r}; `noduslocal gpus` lists them")
    await request.app[SERVICES].store.write(lambda c: resources.set_drain(
        c, gpu.uuid, drained, caller.name, time.time()))
    lifecycle.set_drained(gpu.uuid, drained)
    return web.json_response({"index": gpu.index, "uuid": gpu.uuid, "drained": drained})


@routes.post("/v1/gpus/{index}/drain")
async def drain(request: web.Request) -> web.Response:
    """Nothing new lands on the GPU; what runs there finishes (admins only)."""
    return await _set_drain(request, True)


@routes.post("/v1/gpus/{index}/undrain")
async def undrain(request: web.Request) -> web.Response:
    return await _set_drain(request, False)
