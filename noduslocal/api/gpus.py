"""The box's GPUs as the daemon sees them: each GPU with its load, health, the job and
user holding it, and processes nobody here started. Anyone may read it, like the queue.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from noduslocal.api.app import SERVICES

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
