"""A job's declared outputs, as collected after its latest attempt (an indexed job's as
each index ended, by index): list them, and download one with the sha256 recorded when it
was collected (so a blob changed on disk since is caught by the client), for the job's
owner or an admin."""

from __future__ import annotations

import os
from typing import Any

from aiohttp import web

from noduslocal.daemon.api.files import MODE_HEADER, send_fd
from noduslocal.daemon.api.jobs import lookup, require_control
from noduslocal.daemon.api.services import SERVICES
from noduslocal.domain import errors
from noduslocal.domain.indexes import output_path
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.timefmt import iso

routes = web.RouteTableDef()


@routes.get("/v1/jobs/{name}/outputs")
async def list_outputs(request: web.Request) -> web.Response:
    job = await lookup(request)
    require_control(request, job, "read the outputs of")
    indexes = (range(job.spec.indexed.completions) if job.spec.indexed is not None
               else [None])
    listed = []
    for index in indexes:
        collected = await request.app[SERVICES].jobs.outputs(
            job, -1 if index is None else index)
        listed += _listed(job, collected, index)
    return web.json_response({"outputs": listed})


def _listed(job: JobRecord, collected: dict[str, dict[str, Any]],
            index: int | None) -> list[dict[str, Any]]:
    """One job's (or one index's) declared outputs, collected or not."""
    listed: list[dict[str, Any]] = []
    for name, path in job.spec.outputs.items():
        if index is not None:
            path = output_path(path, index)
        row = collected.get(name)
        where = {} if index is None else {"index": index}
        if job.collected_at is not None:
            listed.append({"name": name, **where, "path": path, "collected": False,
                           "skipped": f"removed by retention at {iso(job.collected_at)} "
                                      "(keep_ended)"})
            continue
        if row is not None and row["skipped"]:
            listed.append({"name": name, **where, "path": path, "collected": False,
                           "skipped": row["skipped"], "size": row["size"],
                           "attempt": row["attempt"]})
            continue
        listed.append({"name": name, **where, "path": path, "collected": row is not None,
                       **({k: row[k] for k in ("kind", "size", "sha256", "attempt")}
                          | {"collected_at": iso(row["collected_at"])} if row else {})})
    return listed


def _index_param(request: web.Request, job: JobRecord) -> int:
    """-1 for an ordinary job; an indexed job's outputs are each index's, named."""
    value, indexed = request.query.get("index"), job.spec.indexed
    if indexed is None:
        if value is not None:
            raise errors.InvalidArgument(f"index: job {job.name!r} is not an indexed job",
                                         field="index")
        return -1
    if (value is None or not (value.isascii() and value.isdigit())
            or int(value) >= indexed.completions):
        raise errors.InvalidArgument(f"index: job {job.name!r} has indexes 0 to "
                                     f"{indexed.completions - 1}; say whose output",
                                     field="index")
    return int(value)


@routes.get("/v1/jobs/{name}/outputs/content")
async def download_output(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    job = await lookup(request)
    require_control(request, job, "read the outputs of")
    name = request.query.get("output", "")
    if name not in job.spec.outputs:
        raise errors.NotFound(f"output: job {job.name!r} declares no output {name!r}")
    index = _index_param(request, job)
    row = (await services.jobs.outputs(job, index)).get(name)
    if row is None:
        await services.jobs.raise_if_collected(job)
        raise errors.NotFound(f"output {name!r} of job {job.name!r} was not collected "
                              f"(nothing at {job.spec.outputs[name]} when an attempt ended)")
    if row["skipped"]:
        raise errors.NotFound(f"output {name!r} of job {job.name!r} was not collected: "
                              f"{row['skipped']}")
    try:
        fd = os.open(services.jobs.blob_path(row["sha256"]), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        await services.jobs.raise_if_collected(job)
        raise errors.NotFound(f"output {name!r}: its stored copy is missing") from None
    headers = {"X-Nodus-Output-Kind": row["kind"]}
    if row.get("mode") is not None:  # the file's own bits, as a workspace download's
        headers[MODE_HEADER] = f"{row['mode'] & 0o777:o}"
    return await send_fd(request, fd, os.fstat(fd).st_size, row["sha256"], headers)
