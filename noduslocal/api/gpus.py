"""The box's GPUs as the daemon sees them: each GPU with its load, health, the job and
user holding it, and processes nobody here started. Anyone may read it, like the queue.
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from noduslocal import errors
from noduslocal.api.app import SERVICES
from noduslocal.api.identity import Caller
from noduslocal.store import ops

routes = web.RouteTableDef()


@routes.get("/v1/gpus")
async def list_gpus(request: web.Request) -> web.Response:
    supervisor = request.app[SERVICES].supervisor
    inventory = supervisor.inventory
    pool = supervisor.queue.capacity.gpus
    doc: dict[str, Any] = inventory.to_wire()
    for gpu, wire in zip(inventory.gpus, doc["gpus"], strict=True):
        job_id = pool.holder.get(gpu.uuid) if pool else None
        attempt = supervisor.active.get(job_id) if job_id is not None else None
        wire["job"] = None if attempt is None else {
            "name": attempt.job.name, "project": attempt.job.project,
            "owner": attempt.job.owner}
        wire["busy"] = pool.busy(gpu) if pool and job_id is None else None
        wire["drained"] = bool(pool and gpu.uuid in pool.drained)
    return web.json_response({"kind": "GpuList", **doc})


async def _set_drain(request: web.Request, drained: bool) -> web.Response:
    caller: Caller = request["caller"]
    if not caller.admin:
        raise errors.PermissionDenied(f"{caller.name} may not drain GPUs: admins only "
                                      "(root, or the admin group)")
    supervisor = request.app[SERVICES].supervisor
    raw = request.match_info["index"]
    gpu = next((g for g in supervisor.inventory.gpus
                if str(g.index) == raw or g.uuid == raw), None)
    if gpu is None:
        raise errors.NotFound(f"there is no GPU {raw!r}; `noduslocal gpus` lists them")
    await request.app[SERVICES].store.write(lambda c: ops.set_drain(
        c, gpu.uuid, drained, caller.name, time.time()))
    supervisor.set_drained(gpu.uuid, drained)
    return web.json_response({"index": gpu.index, "uuid": gpu.uuid, "drained": drained})


@routes.post("/v1/gpus/{index}/drain")
async def drain(request: web.Request) -> web.Response:
    """Nothing new lands on the GPU; what runs there finishes (admins only)."""
    return await _set_drain(request, True)


@routes.post("/v1/gpus/{index}/undrain")
async def undrain(request: web.Request) -> web.Response:
    return await _set_drain(request, False)
