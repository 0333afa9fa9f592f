"""A job's declared outputs, as collected after its latest attempt: list them, and
download one with the sha256 recorded when it was collected (so a blob changed on disk
since is caught by the client), for the job's owner or an admin."""

from __future__ import annotations

import os

from aiohttp import web

from noduslocal import errors
from noduslocal.api.files import send_fd
from noduslocal.api.jobs import lookup, require_control
from noduslocal.api.services import SERVICES
from noduslocal.models import iso

routes = web.RouteTableDef()


@routes.get("/v1/jobs/{name}/outputs")
async def list_outputs(request: web.Request) -> web.Response:
    job = await lookup(request)
    require_control(request, job, "read the outputs of")
    collected = await request.app[SERVICES].store.outputs(job.id)
    listed = []
    for name, path in job.spec.outputs.items():
        row = collected.get(name)
        if row is not None and row["skipped"]:
            listed.append({"name": name, "path": path, "collected": False,
                           "skipped": row["skipped"], "size": row["size"],
                           "attempt": row["attempt"]})
            continue
        listed.append({"name": name, "path": path, "collected": row is not None,
                       **({k: row[k] for k in ("kind", "size", "sha256", "attempt")}
                          | {"collected_at": iso(row["collected_at"])} if row else {})})
    return web.json_response({"outputs": listed})


@routes.get("/v1/jobs/{name}/outputs/content")
async def download_output(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    job = await lookup(request)
    require_control(request, job, "read the outputs of")
    name = request.query.get("output", "")
    if name not in job.spec.outputs:
        raise errors.NotFound(f"output: job {job.name!r} declares no output {name!r}")
    row = (await services.store.outputs(job.id)).get(name)
    if row is None:
        raise errors.NotFound(f"output {name!r} of job {job.name!r} was not collected "
                              f"(nothing at {job.spec.outputs[name]} when an attempt ended)")
    if row["skipped"]:
        raise errors.NotFound(f"output {name!r} of job {job.name!r} was not collected: "
                              f"{row['skipped']}")
    try:
        fd = os.open(services.layout.blobs.path(row["sha256"]), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise errors.NotFound(f"output {name!r}: its stored copy is missing") from None
    return await send_fd(request, fd, os.fstat(fd).st_size, row["sha256"],
                         {"X-Nodus-Output-Kind": row["kind"]})
