"""Job resources: create, get, list, cancel, suspend, resume, remove, wait (a server-side
long poll), attempts, the estimate and exec."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import pwd
from typing import Any

from aiohttp import WSMsgType, web

from noduslocal.daemon.api import lanes
from noduslocal.daemon.api.body import parse as parse_body
from noduslocal.daemon.api.identity import Caller
from noduslocal.daemon.api.lanes import PAGE
from noduslocal.daemon.api.services import SERVICES
from noduslocal.daemon.jobs.service import JobAction, Terminal
from noduslocal.domain import errors
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import Phase
from noduslocal.domain.units import parse_duration
from noduslocal.domain.validation import SQL_INT_MAX, parse_create, validate_name

routes = web.RouteTableDef()
IDEMPOTENCY_HEADER = "Idempotency-Key"
EXEC_TIMEOUT = 300.0  # seconds an exec may run unless the request says otherwise
EXEC_TIMEOUT_MAX = 24 * 3600.0


def job_doc(request: web.Request, job: JobRecord, detail: bool = True) -> dict[str, Any]:
    caller: Caller = request["caller"]
    return request.app[SERVICES].jobs.document(
        job, redact=not caller.may_control(job.owner_uid), detail=detail)


def job_response(request: web.Request, job: JobRecord, status: int = 200) -> web.Response:
    return web.json_response(job_doc(request, job), status=status)


def project_of(request: web.Request) -> str:
    caller: Caller = request["caller"]
    project = request.query.get("project")
    return caller.name if project is None else validate_name(project, "project")


async def lookup(request: web.Request) -> JobRecord:
    caller: Caller = request["caller"]
    return await request.app[SERVICES].jobs.find(
        project_of(request), request.match_info["name"], caller.uid,
        implicit="project" not in request.query)


def require_control(request: web.Request, job: JobRecord, action: str) -> None:
    caller: Caller = request["caller"]
    caller.require_control(f"job {job.name!r}", job.owner_uid, job.owner, action)


def check_project(caller: Caller, project: str | None) -> None:
    """A project named after a local user is that user's: nobody else may take names in
    it (and so make that user's own submissions fail, or their lookups find a stranger's
    job). Admins may."""
    if project is None or project == caller.name or caller.admin:
        return
    try:
        pwd.getpwnam(project)
    except KeyError:
        return
    raise errors.PermissionDenied(
        f"project: {project!r} belongs to the user of that name; use your own or another")


def idempotency_key(request: web.Request) -> str | None:
    """The create's Idempotency-Key: 1 to 200 characters of UTF-8 text. aiohttp decodes
    other header bytes to lone surrogates, which the store could never hold."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidArgument(f"{IDEMPOTENCY_HEADER}: not valid UTF-8",
                                     field=IDEMPOTENCY_HEADER) from None
    if not 0 < len(key) <= 200:
        raise errors.InvalidArgument(f"{IDEMPOTENCY_HEADER}: 1 to 200 characters",
                                     field=IDEMPOTENCY_HEADER)
    return key


@routes.post("/v1/jobs")
async def create_job(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    caller: Caller = request["caller"]
    raw = await request.read()
    body_value: Any = parse_body(raw)
    req = parse_create(body_value, regions=services.settings.region_names,
                       profiles=services.settings.profiles)
    check_project(caller, req.project)
    key = idempotency_key(request)
    digest = hashlib.sha256(raw).hexdigest() if key is not None else None
    job, created = await services.jobs.create(req, caller.owner, key, digest)
    return job_response(request, job, 201 if created else 200)


@routes.get("/v1/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    query = request.query
    phases = [p for value in query.getall("phase", []) for p in value.split(",") if p]
    valid = {p.value for p in Phase}
    for phase in phases:
        if phase not in valid:
            raise errors.InvalidArgument(
                f"phase: {phase!r} is not a phase; use one of {', '.join(sorted(valid))}",
                field="phase")
    labels: dict[str, str] = {}
    for item in query.getall("label", []):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise errors.InvalidArgument(f"label: {item!r} is not KEY=VALUE", field="label")
        labels[key] = value
    limit = int_query(request, "limit", PAGE, 1, PAGE) or PAGE
    before = int_query(request, "before", None, 1, SQL_INT_MAX)
    project = query.get("project")
    sweep_id = None
    if (sweep := query.get("sweep")) is not None:  # the sweep's own jobs, by its id
        found = await services.sweeps.find(project_of(request), validate_name(sweep, "sweep"),
                                           request["caller"].uid,
                                           implicit="project" not in query)
        sweep_id = found.id
    caller: Caller = request["caller"]
    async with services.lanes.read(caller.uid, caller.name, "job list"):
        jobs = await services.jobs.list(
            phases=phases or None,
            owner=query.get("owner"),
            project=None if project is None else validate_name(project, "project"),
            labels=labels,
            active_only=not phases and sweep_id is None
            and query.get("all") not in ("1", "true"),
            limit=limit + 1, before=before, sweep_id=sweep_id)
        more = len(jobs) > limit
        page = jobs[1:] if more else jobs  # the oldest one read only says there is more
        docs = await lanes.build(page, lambda job: job_doc(request, job, detail=False))
        body = await lanes.dumps({"jobs": docs, "next": str(page[0].id) if more else None})
    return web.Response(body=body, content_type="application/json")


def int_query(request: web.Request, name: str, default: int | None, low: int,
               high: int) -> int | None:
    """An integer query parameter: absent gives `default`, above `high` is cut to it."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise errors.InvalidArgument(f"{name}: expected an integer", field=name) from None
    if value < low:
        raise errors.InvalidArgument(f"{name}: expected at least {low}", field=name)
    return min(value, high)


@routes.get("/v1/jobs/{name}")
async def get_job(request: web.Request) -> web.Response:
    return job_response(request, await lookup(request))


async def _control(request: web.Request, action: JobAction) -> web.Response:
    """An owner's (or admin's) action on a job; answers with the job as it is after."""
    job = await lookup(request)
    require_control(request, job, action)
    return job_response(request, await request.app[SERVICES].jobs.control(job, action))


@routes.delete("/v1/jobs/{name}")
async def remove_job(request: web.Request) -> web.Response:
    """An ended job out of listings, its name free for a new job; its record stays for
    fair share (owner or admin)."""
    job = await lookup(request)
    require_control(request, job, "remove")
    caller: Caller = request["caller"]
    await request.app[SERVICES].jobs.remove(job, caller.name)
    return web.json_response({"removed": job.name, "project": job.project})


@routes.post("/v1/jobs/{name}/cancel")
async def cancel_job(request: web.Request) -> web.Response:
    return await _control(request, "cancel")


@routes.post("/v1/jobs/{name}/suspend")
async def suspend_job(request: web.Request) -> web.Response:
    """Stop the job (SIGTERM, grace, SIGKILL) and keep it aside, its workspace and
    checkpoint kept, until resume."""
    return await _control(request, "suspend")


@routes.post("/v1/jobs/{name}/resume")
async def resume_job(request: web.Request) -> web.Response:
    return await _control(request, "resume")


def poll_timeout(request: web.Request) -> float:
    """A long poll's `timeout` query: finite seconds from 0, at most max_wait_poll."""
    longest = request.app[SERVICES].settings.max_wait_poll
    text = request.query.get("timeout")
    try:
        timeout = longest if text is None else float(text)
    except ValueError:
        timeout = math.nan
    if not math.isfinite(timeout) or timeout < 0:
        raise errors.InvalidArgument(f"timeout: expected seconds from 0, not {text!r}",
                                     field="timeout")
    return min(timeout, longest)


@routes.get("/v1/jobs/{name}/wait")
async def wait_job(request: web.Request) -> web.Response:
    timeout = poll_timeout(request)
    job = await lookup(request)
    return job_response(request, await request.app[SERVICES].jobs.wait(job, timeout))


@routes.get("/v1/jobs/{name}/estimate")
async def estimate(request: web.Request) -> web.Response:
    """`Job.estimate()`: when the job should start, what it should cost, why it waits."""
    job = await lookup(request)
    return web.json_response(await request.app[SERVICES].jobs.estimate(job))


@routes.get("/v1/jobs/{name}/attempts")
async def job_attempts(request: web.Request) -> web.Response:
    job = await lookup(request)
    attempts = await request.app[SERVICES].jobs.attempts(job)
    return web.json_response({"attempts": [a.to_wire() for a in attempts]})


def _exec_rank(job: JobRecord, body: dict[str, Any]) -> int:
    """Beside which rank (a gang's) or index (an indexed job's, which needs one)."""
    key, plural = ("index", "indexes") if job.spec.indexed is not None else ("rank", "ranks")
    other = "rank" if key == "index" else "index"
    if other in body:
        raise errors.InvalidArgument(f"{other}: job {job.name!r} has {plural}; use {key}",
                                     field=other)
    if key == "index" and "index" not in body:
        raise errors.InvalidArgument(f"index: job {job.name!r} is indexed; say beside which "
                                     "running index", field="index")
    value = body.get(key, 0)
    count = (job.spec.indexed.completions if job.spec.indexed is not None
             else job.spec.gang.nodes if job.spec.gang is not None else 1)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise errors.InvalidArgument(f"{key}: job {job.name!r} has {plural} 0 to {count - 1}",
                                     field=key)
    return value


@routes.get("/v1/jobs/{name}/terminal")
async def terminal_in_job(request: web.Request) -> web.StreamResponse:
    """`job exec -it`: a command beside a running rank on a pseudo-terminal, over a
    WebSocket on this connection. Binary messages are its input and output; a text message
    {"resize": [rows, cols]} resizes it; the daemon's last text message is {"exit": code}.
    Query: command (a JSON list; the owner's login shell by default), rank or index, rows
    and cols. Owner-only as every exec, and counted in user_max_execs."""
    try:
        return await _terminal(request)
    except errors.NodusError as exc:  # refused before the upgrade: said in a header too
        return web.json_response(exc.to_wire(), status=exc.http_status,
                                 headers={errors.ERROR_HEADER: json.dumps(exc.to_wire())})


async def _terminal(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    job = await lookup(request)
    require_control(request, job, "exec in")
    if not web.WebSocketResponse().can_prepare(request).ok:
        raise errors.InvalidArgument("this is a WebSocket: `noduslocal job exec -it` or "
                                     "Job.exec(..., pty=True) speak it", field="upgrade")
    where = {k: int_query(request, k, 0, 0, SQL_INT_MAX) for k in ("rank", "index")
             if k in request.query}
    rank = _exec_rank(job, where)
    rows = int_query(request, "rows", 24, 1, 1000) or 24  # a bigger window: its first 1000
    cols = int_query(request, "cols", 80, 1, 1000) or 80
    command: Any = None
    if "command" in request.query:
        try:
            command = json.loads(request.query["command"])
        except ValueError:
            command = None
        if (not isinstance(command, list) or not command or not command[0]
                or not all(isinstance(c, str) and "\0" not in c for c in command)):
            raise errors.InvalidArgument("command: expected a JSON list of strings",
                                         field="command")
    async with services.jobs.terminal(job, command, rows, cols, rank) as (term, ended):
        ws = web.WebSocketResponse(max_msg_size=1024 * 1024)
        await ws.prepare(request)
        await _relay(ws, term, ended)
    return ws


async def _relay(ws: web.WebSocketResponse, term: Terminal,
                 ended: asyncio.Future[Any]) -> None:
    """Output to the client as it comes, input and resizes to the command, until the
    command ends (its exit status sent last), the client leaves, or the job ends."""

    async def output() -> None:
        while data := await term.read():
            await ws.send_bytes(data)

    async def keys() -> None:
        async for message in ws:
            if message.type == WSMsgType.BINARY:
                await term.write(message.data)
            elif message.type == WSMsgType.TEXT:
                with contextlib.suppress(ValueError, TypeError, KeyError):
                    rows, cols = json.loads(message.data)["resize"]
                    if 1 <= int(rows) <= 1000 and 1 <= int(cols) <= 1000:
                        await term.resize(int(rows), int(cols))

    printing = asyncio.ensure_future(output())
    typing = asyncio.ensure_future(keys())
    try:
        await asyncio.wait([printing, typing, ended], return_when=asyncio.FIRST_COMPLETED)
        if printing.done() and not ws.closed:
            await ws.send_str(json.dumps({"exit": await term.wait()}))
        elif ended.done() and not ws.closed:
            await ws.send_str(json.dumps({"exit": 129, "why": "the job ended"}))
    finally:
        for task in (printing, typing):
            task.cancel()
        await asyncio.gather(printing, typing, return_exceptions=True)
        await ws.close()


@routes.post("/v1/jobs/{name}/exec")
async def exec_in_job(request: web.Request) -> web.Response:
    """Run a command beside a running job, as its owner, with its environment and workdir."""
    services = request.app[SERVICES]
    job = await lookup(request)
    require_control(request, job, "exec in")
    body: Any = parse_body(await request.read())
    if not isinstance(body, dict) or set(body) - {"command", "timeout", "rank", "index"}:
        raise errors.InvalidArgument('body: expected {"command": [...], "timeout": S, '
                                     '"rank": N, "index": I}', field="body")
    rank = _exec_rank(job, body)
    command = body.get("command")
    if (not isinstance(command, list) or not command or not command[0]
            or not all(isinstance(c, str) and "\0" not in c for c in command)):
        raise errors.InvalidArgument("command: expected a non-empty list of strings",
                                     field="command")
    timeout = parse_duration(body.get("timeout", EXEC_TIMEOUT), "timeout")
    if timeout > EXEC_TIMEOUT_MAX:
        raise errors.InvalidArgument("timeout: an exec may run 24h at most; start a job for "
                                     "longer work", field="timeout")
    result = await services.jobs.exec(job, command, timeout, rank)
    return web.json_response(result.to_wire())
