"""`noduslocal dashboard`: a small aiohttp server on 127.0.0.1, run by a user as that user,
whose pages and fragments are rendered from what the daemon answers that user over the
Unix socket. Read-only but for cancelling one's own job or sweep (the daemon decides, as
for the CLI). Logs and a job's events reach the browser as server-sent events.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import aiohttp
from aiohttp import web

from noduslocal.dashboard import pages
from noduslocal.dashboard.guard import Guard
from noduslocal.dashboard.link import DaemonLink, Params, path_of
from noduslocal.domain import errors
from noduslocal.domain.metrics import METRICS_FILE
from noduslocal.domain.states import TERMINAL

LINK = web.AppKey("link", DaemonLink)
GUARD = web.AppKey("guard", Guard)
LOG_TAIL = 5000  # lines of a log a page starts with
JOBS_PAGE = 200  # jobs a page lists (the daemon pages further with `before`)
MINE_ENDED = 50  # of one's own ended jobs, the newest
QUEUE_PAGE = 200  # places of the queue shown (the count says how many wait in all)
METRICS_BYTES = 1024 * 1024  # of a job's metrics file, read for its charts
FILE_VIEW_BYTES = 4 * 1024 * 1024  # a workspace file shown in the browser (more: download)
EXEMPLARS, EXEMPLAR_LINES, EXEMPLAR_BYTES = 5, 20, 16 * 1024  # failure clusters' logs shown
STATIC = {  # what /static serves, and as what
    "dashboard.js": "text/javascript", "dashboard.css": "text/css",
    "vendor/htmx-2.0.10.min.js": "text/javascript",
    "vendor/uPlot-1.6.32.iife.min.js": "text/javascript",
    "vendor/uPlot-1.6.32.min.css": "text/css",
    "vendor/LICENSE-htmx": "text/plain", "vendor/LICENSE-uPlot": "text/plain",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(link: DaemonLink, guard: Guard) -> web.Application:
    app = web.Application(middlewares=[guard.middleware, _errors])
    app[LINK] = link
    app[GUARD] = guard
    app.on_response_prepare.append(guard.on_prepare)
    r = app.router
    r.add_get("/", lambda _: _redirect("/jobs"))
    r.add_get("/static/{file:.+}", static)
    r.add_get("/jobs", jobs_page)
    r.add_get("/fragments/jobs", jobs_fragment)
    r.add_get("/jobs/{project}/{name}", job_page)
    r.add_get("/jobs/{project}/{name}/fragments/summary", job_summary)
    r.add_get("/jobs/{project}/{name}/fragments/attempts", job_attempts)
    r.add_get("/jobs/{project}/{name}/fragments/outputs", job_outputs)
    r.add_get("/jobs/{project}/{name}/fragments/files", job_files)
    r.add_get("/jobs/{project}/{name}/log", job_log)
    r.add_get("/jobs/{project}/{name}/events", job_events)
    r.add_get("/jobs/{project}/{name}/metrics", job_metrics)
    r.add_get("/jobs/{project}/{name}/output", job_output)
    r.add_get("/jobs/{project}/{name}/file", job_file)
    r.add_post("/jobs/{project}/{name}/cancel", cancel_job)
    r.add_get("/sweeps", sweeps_page)
    r.add_get("/fragments/sweeps", sweeps_fragment)
    r.add_get("/sweeps/{project}/{name}", sweep_page)
    r.add_get("/sweeps/{project}/{name}/fragments/summary", sweep_summary)
    r.add_get("/sweeps/{project}/{name}/fragments/cells", sweep_cells)
    r.add_get("/sweeps/{project}/{name}/cells.json", sweep_cells_json)
    r.add_post("/sweeps/{project}/{name}/cancel", cancel_sweep)
    r.add_get("/gpus", gpus_page)
    r.add_get("/fragments/gpus", gpus_fragment)
    r.add_get("/gpus/history.json", gpus_history)
    r.add_get("/queue", queue_page)
    r.add_get("/fragments/queue", queue_fragment)
    r.add_get("/me", me_page)
    return app


# --- plumbing -------------------------------------------------------------------------------


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The daemon's refusals (not found, not yours) as a page, or a fragment's box."""
    try:
        return await handler(request)
    except errors.NodusError as exc:
        fragment = request.headers.get("HX-Request") == "true"
        status = exc.http_status if 400 <= exc.http_status < 600 else 500
        if fragment:  # htmx swaps only 2xx answers: the box replaces the part as a 200
            return _html(pages.error_box(exc.message))
        return web.Response(text=pages.status_page(status, exc.message), status=status,
                            content_type="text/html")
    except (OSError, aiohttp.ClientError) as exc:  # the daemon's socket is away
        message = f"the daemon does not answer: {exc}"
        return web.Response(text=pages.status_page(502, message), status=502,
                            content_type="text/html")


def _redirect(to: str) -> web.Response:
    return web.Response(status=303, headers={"Location": to})


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html")


def _link(request: web.Request) -> DaemonLink:
    return request.app[LINK]


def _named(request: web.Request) -> tuple[str, str]:
    return request.match_info["project"], request.match_info["name"]


async def _page(request: web.Request, title: str, active: str, body: str) -> web.Response:
    return _html(pages.layout(title, active, body, request["session"].csrf,
                              await _caller(request)))


async def _info(request: web.Request) -> dict[str, Any]:
    """The daemon's /v1/info, asked once a request (the layout, the caller's rights)."""
    if "info" not in request:
        request["info"] = await _link(request).get("/v1/info")
    info: dict[str, Any] = request["info"]
    return info


async def _caller(request: web.Request) -> dict[str, Any]:
    caller: dict[str, Any] = (await _info(request)).get("caller") or {}
    return caller


async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["file"]
    kind = STATIC.get(name)
    if kind is None:
        raise web.HTTPNotFound(text="not a file of the dashboard\n")
    data = resources.files("noduslocal.dashboard").joinpath(f"static/{name}")
    return web.Response(body=data.read_bytes(), content_type=kind,
                        charset="utf-8" if kind.startswith("text/") else None)


# --- jobs -----------------------------------------------------------------------------------


def _filters(request: web.Request) -> dict[str, str]:
    q = request.query
    found = {k: q[k] for k in ("phase", "user", "project", "label", "sort", "before")
             if q.get(k)}
    if found.get("sort") not in (None, *pages.SORTS):
        raise errors.InvalidArgument(f"sort: use one of {', '.join(pages.SORTS)}",
                                     field="sort")
    return found


async def _jobs_inner(request: web.Request, filters: dict[str, str]) -> str:
    link = _link(request)
    base: list[tuple[str, str | int]] = [("limit", JOBS_PAGE)]
    for key, param in (("user", "owner"), ("project", "project"), ("label", "label"),
                       ("before", "before")):
        if filters.get(key):
            base.append((param, filters[key]))
    if filters.get("phase"):
        listed = await link.get("/v1/jobs", [*base, ("phase", filters["phase"])])
        jobs, more = listed["jobs"], listed.get("next")
    else:
        # Everyone's active jobs, and the caller's own newest ended ones.
        caller = await _caller(request)
        active, ended = await asyncio.gather(
            link.get("/v1/jobs", base),
            link.get("/v1/jobs", [("limit", MINE_ENDED), ("owner", str(caller.get("name"))),
                                  ("phase", ",".join(sorted(TERMINAL)))]
                     + [(k, v) for k, v in base if k in ("project", "label")])
            if not filters.get("user") or filters["user"] == caller.get("name") else
            _nothing())
        jobs, more = active["jobs"] + ended["jobs"], active.get("next")
    waits: dict[tuple[str, str], dict[str, Any]] = {}
    if any(j["phase"] == "Pending" for j in jobs):
        # The head of the queue: its places have the ETAs (further back, the job's own hold
        # says why it waits).
        queue = await link.get("/v1/queue", {"limit": QUEUE_PAGE})
        waits = {(p["project"], p["name"]): p for p in queue.get("pending") or []}
    return pages.jobs_table(jobs, waits, filters.get("sort", "submit"), more, filters)


async def _nothing() -> dict[str, Any]:
    return {"jobs": []}


async def jobs_page(request: web.Request) -> web.Response:
    filters = _filters(request)
    inner = await _jobs_inner(request, filters)
    return await _page(request, "Jobs", "jobs", pages.jobs_page(filters, inner))


async def jobs_fragment(request: web.Request) -> web.Response:
    return _html(await _jobs_inner(request, _filters(request)))


def _job_path(request: web.Request, *more: str) -> tuple[str, Params]:
    return _daemon_path(request, "jobs", *more)


def _daemon_path(request: web.Request, kind: str, *more: str) -> tuple[str, Params]:
    """The daemon's path of the job or sweep (KIND) the request names, and its project."""
    project, name = _named(request)
    return path_of("v1", kind, name, *more), {"project": project}


async def _job(request: web.Request) -> dict[str, Any]:
    path, params = _job_path(request)
    job: dict[str, Any] = await _link(request).get(path, params)
    return job


async def _summary_inner(request: web.Request, job: dict[str, Any]) -> str:
    estimate = None
    if job["phase"] == "Pending":
        path, params = _job_path(request, "estimate")
        try:
            estimate = await _link(request).get(path, params)
        except errors.NodusError:
            estimate = None  # none for this job (a sweep's held cell): the summary says why
    return pages.job_summary(job, estimate)


async def _attempts_inner(request: web.Request) -> str:
    path, params = _job_path(request, "attempts")
    found = await _link(request).get(path, params)
    return pages.attempts_table(found if isinstance(found, list) else found.get("attempts", []))


async def _events_of(request: web.Request) -> list[dict[str, Any]]:
    project, name = _named(request)
    events = []
    async for line in _link(request).lines("/v1/events", {"job": name, "project": project}):
        if line.strip():
            events.append(json.loads(line))
    return events


async def _may_control(request: web.Request, owner_uid: Any) -> bool:
    caller = await _caller(request)
    return bool(caller.get("admin")) or caller.get("uid") == owner_uid


async def job_page(request: web.Request) -> web.Response:
    job = await _job(request)
    summary, attempts, events = await asyncio.gather(
        _summary_inner(request, job), _attempts_inner(request), _events_of(request))
    since = int(events[-1]["seq"]) if events else 0
    body = pages.job_page(job, summary, attempts, pages.timeline(events), since,
                          await _may_control(request, job.get("uid")))
    return await _page(request, f"Job {job['name']}", "jobs", body)


async def job_summary(request: web.Request) -> web.Response:
    return _html(await _summary_inner(request, await _job(request)))


async def job_attempts(request: web.Request) -> web.Response:
    return _html(await _attempts_inner(request))


async def job_outputs(request: web.Request) -> web.Response:
    job = await _job(request)
    path, params = _job_path(request, "outputs")
    found = await _link(request).get(path, params)
    return _html(pages.outputs_list(job, found.get("outputs", [])))


async def job_files(request: web.Request) -> web.Response:
    job = await _job(request)
    where = request.query.get("path", "")
    path, params = _job_path(request, "files")
    found = await _link(request).get(path, {**dict(params or {}), "path": where})
    return _html(pages.files_list(job, found.get("path", where), found.get("entries", [])))


def _log_params(request: web.Request) -> dict[str, str]:
    project, _ = _named(request)
    params = {"project": project}
    for key in ("rank", "index", "attempt", "stream"):
        if request.query.get(key):
            params[key] = request.query[key]
    return params


async def job_log(request: web.Request) -> web.StreamResponse:
    """A job's log: as a download (the whole file, plain text), or followed as server-sent
    events, one per line, starting LOG_TAIL lines back; an `end` event when it ends."""
    _, name = _named(request)
    link = _link(request)
    path = path_of("v1", "jobs", name, "logs")
    params = _log_params(request)
    if request.query.get("download"):
        data = await link.body(path, params)
        return web.Response(body=data, content_type="text/plain", charset="utf-8", headers={
            "Content-Disposition": f'attachment; filename="{_file_name(name)}.log"'})
    lines = link.lines(path, {**params, "follow": "1", "tail": str(LOG_TAIL)})
    first = await _first(lines)  # the daemon's refusal becomes this request's, before SSE
    resp = await _sse(request)
    if first is not None:
        await _send(resp, first)
        async for line in lines:
            await _send(resp, line)
    await resp.write(b"event: end\ndata: \n\n")
    return resp


async def _first(lines: Any) -> bytes | None:
    try:
        found: bytes = await lines.__anext__()
    except StopAsyncIteration:
        return None
    return found


async def _sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await resp.prepare(request)
    return resp


async def _send(resp: web.StreamResponse, line: bytes, event: str | None = None) -> None:
    text = line.decode("utf-8", errors="replace").rstrip("\r\n").replace("\r", "")
    head = f"event: {event}\n" if event else ""
    await resp.write(f"{head}data: {text}\n\n".encode())


async def job_events(request: web.Request) -> web.StreamResponse:
    """The job's events as they happen (each a JSON `event: job`), after the ones the page
    was rendered with (`since`)."""
    project, name = _named(request)
    since = request.query.get("since", "0")
    resp = await _sse(request)
    async for line in _link(request).lines("/v1/events", {"job": name, "project": project,
                                                          "follow": "1", "since": since}):
        if line.strip():
            await _send(resp, line, "job")
    return resp


async def job_metrics(request: web.Request) -> web.Response:
    """What the job reported over time ($NODUS_METRICS_FILE's lines, the last MB), as
    columns for a chart: x is `step` when the lines have one, else the line's number."""
    path, params = _job_path(request, "files", "content")
    try:
        data = await _link(request).body(path, {**dict(params or {}),
                                                   "path": METRICS_FILE})
    except errors.NotFound:
        data = b""
    data = data[-METRICS_BYTES:]
    rows = []
    for line in data.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append({k: float(v) for k, v in row.items()
                         if isinstance(v, int | float) and not isinstance(v, bool)
                         and math.isfinite(v)})
    keys = sorted({k for row in rows for k in row if k != "step"})
    x = [row.get("step", i) for i, row in enumerate(rows)]
    return web.json_response({"x": x, "series": {k: [row.get(k) for row in rows]
                                                 for k in keys}})


def _file_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "file"


async def job_output(request: web.Request) -> web.Response:
    path, params = _job_path(request, "outputs", "content")
    query = {**dict(params or {}), **{k: request.query[k] for k in ("output", "index")
                                      if request.query.get(k)}}
    data = await _link(request).body(path, query)
    return _download(data, request.query.get("output", "output"))


def _download(data: bytes, name: str) -> web.Response:
    return web.Response(body=data, content_type="application/octet-stream", headers={
        "Content-Disposition": f'attachment; filename="{_file_name(name)}"'})


async def job_file(request: web.Request) -> web.Response:
    """A workspace file: shown as plain text (never as HTML, whatever it holds), or
    downloaded."""
    where = request.query.get("path", "")
    path, params = _job_path(request, "files", "content")
    download = bool(request.query.get("download"))
    data = await _link(request).body(path, {**dict(params or {}), "path": where},
                                        None if download else FILE_VIEW_BYTES + 1)
    if download:
        return _download(data, where.rsplit("/", 1)[-1])
    cut = len(data) > FILE_VIEW_BYTES
    text = data[:FILE_VIEW_BYTES].decode("utf-8", errors="replace")
    if cut:
        text += "\n… (cut: download it for the whole file)\n"
    return web.Response(text=text, content_type="text/plain", charset="utf-8")


async def cancel_job(request: web.Request) -> web.Response:
    path, params = _job_path(request, "cancel")
    job = await _link(request).post(path, params)
    return _html(f'<span class="ok">cancel asked: {pages.e(job.get("phase"))}</span>')


# --- sweeps ---------------------------------------------------------------------------------


async def _sweeps_inner(request: web.Request) -> str:
    found = await _link(request).get("/v1/sweeps")
    return pages.sweeps_table(found.get("sweeps", []) if isinstance(found, dict) else found)


async def sweeps_page(request: web.Request) -> web.Response:
    body = "<h1>Sweeps</h1>" + pages.poll("/fragments/sweeps", await _sweeps_inner(request),
                                          "sweeps")
    return await _page(request, "Sweeps", "sweeps", body)


async def sweeps_fragment(request: web.Request) -> web.Response:
    return _html(await _sweeps_inner(request))


def _sweep_path(request: web.Request, *more: str) -> tuple[str, Params]:
    return _daemon_path(request, "sweeps", *more)


async def _sweep(request: web.Request) -> dict[str, Any]:
    path, params = _sweep_path(request)
    sweep: dict[str, Any] = await _link(request).get(path, params)
    return sweep


async def _cells(request: web.Request) -> list[dict[str, Any]]:
    path, params = _sweep_path(request, "cells")
    found = await _link(request).get(path, params)
    cells: list[dict[str, Any]] = found.get("cells", []) if isinstance(found, dict) else found
    return cells


async def _exemplar_logs(request: web.Request, sweep: dict[str, Any]) -> dict[str, str]:
    """The last lines of each failure cluster's exemplar cell (the largest clusters)."""
    project, _ = _named(request)
    jobs = [f["exemplar_job"] for f in (sweep.get("failures") or [])[:EXEMPLARS]
            if f.get("exemplar_job")]

    async def tail(job: str) -> str:
        try:
            data = await _link(request).body(
                path_of("v1", "jobs", job, "logs"),
                {"project": project, "tail": str(EXEMPLAR_LINES)}, EXEMPLAR_BYTES)
        except errors.NodusError as exc:
            return f"(no log: {exc.message})"
        return data.decode("utf-8", errors="replace")

    return dict(zip(jobs, await asyncio.gather(*map(tail, jobs)), strict=True))


async def _sweep_summary_inner(request: web.Request, sweep: dict[str, Any]) -> str:
    return pages.sweep_summary(sweep, await _exemplar_logs(request, sweep))


async def sweep_page(request: web.Request) -> web.Response:
    sweep, cells = await asyncio.gather(_sweep(request), _cells(request))
    body = pages.sweep_page(sweep, await _sweep_summary_inner(request, sweep),
                            pages.cells_table(sweep, cells),
                            await _may_control(request, sweep.get("uid")))
    return await _page(request, f"Sweep {sweep['name']}", "sweeps", body)


async def sweep_summary(request: web.Request) -> web.Response:
    return _html(await _sweep_summary_inner(request, await _sweep(request)))


async def sweep_cells(request: web.Request) -> web.Response:
    sweep, cells = await asyncio.gather(_sweep(request), _cells(request))
    return _html(pages.cells_table(sweep, cells))


async def sweep_cells_json(request: web.Request) -> web.Response:
    sweep, cells = await asyncio.gather(_sweep(request), _cells(request))
    return web.json_response({"best": sweep.get("best"), "cells": cells})


async def cancel_sweep(request: web.Request) -> web.Response:
    path, params = _sweep_path(request, "cancel")
    sweep = await _link(request).post(path, params)
    return _html(f'<span class="ok">cancel asked: {pages.e(sweep.get("phase"))}</span>')


# --- GPUs, queue, me ------------------------------------------------------------------------


async def gpus_page(request: web.Request) -> web.Response:
    inner = pages.gpus_table(await _link(request).get("/v1/gpus"))
    return await _page(request, "GPUs", "gpus", pages.gpus_page(inner))


async def gpus_fragment(request: web.Request) -> web.Response:
    return _html(pages.gpus_table(await _link(request).get("/v1/gpus")))


async def gpus_history(request: web.Request) -> web.Response:
    params = {k: request.query[k] for k in ("since", "gpu") if request.query.get(k)}
    return web.json_response(await _link(request).get("/v1/gpus/history", params))


async def queue_page(request: web.Request) -> web.Response:
    inner = pages.queue_table(await _link(request).get("/v1/queue", {"limit": QUEUE_PAGE}))
    return await _page(request, "Queue", "queue", "<h1>Queue</h1>" + pages.poll(
        "/fragments/queue", inner, "queue"))


async def queue_fragment(request: web.Request) -> web.Response:
    return _html(pages.queue_table(await _link(request).get("/v1/queue",
                                                            {"limit": QUEUE_PAGE})))


async def me_page(request: web.Request) -> web.Response:
    link = _link(request)
    info, mine, du = await asyncio.gather(_info(request), link.get("/v1/me"),
                                          link.get("/v1/du"))
    return await _page(request, "Me", "me", pages.me_page(info, du, mine))


# --- running it -----------------------------------------------------------------------------


async def serve(socket_path: str, port: int, on_ready: Callable[[str], None]) -> None:
    """Listen on 127.0.0.1:PORT (0: any free port) until cancelled; ON_READY gets the
    one-time sign-in URL."""
    link = DaemonLink(socket_path)
    try:
        await link.get("/v1/info")  # the daemon answers, and this user may use it
    except aiohttp.ClientConnectionError as exc:
        await link.close()
        raise errors.DaemonUnavailable(f"no daemon answers at {socket_path} ({exc}); start "
                                       "one with `noduslocal daemon start`") from None
    guard = Guard()
    # A page that closes ends its handler, and with it the stream it holds to the daemon:
    # each counts against this user's connections there.
    runner = web.AppRunner(make_app(link, guard), access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", port).start()
        guard.port = int(runner.addresses[0][1])
        on_ready(guard.login_url())
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await link.close()
