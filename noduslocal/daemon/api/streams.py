"""Chunked streams: a job's log (optionally followed across attempts until the job ends;
its tail found from the end in a bounded read; every read off the event loop) and the
NDJSON event log (history since a sequence number, then live).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from aiohttp import web

from noduslocal.daemon.api.jobs import lookup, project_of, require_control
from noduslocal.daemon.api.services import SERVICES, Services, start_stream
from noduslocal.daemon.files.plain import NotPlain, open_plain
from noduslocal.daemon.jobs import gang_logs
from noduslocal.domain import errors
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.states import TERMINAL
from noduslocal.domain.validation import SQL_INT_MAX

routes = web.RouteTableDef()
CHUNK = 256 * 1024  # bytes of a log read at a time
TAIL_BYTES = 4 << 20  # the most of a log's end a tail reads: a longer line comes back cut
FOLLOW_POLL = 0.1  # seconds between looks at a growing log file
IDLE_CHECK = 15.0  # seconds a quiet follower waits before checking its client is there
# Log files are read on threads of their own, never on the event loop: a slow or stuck disk
# holds these, neither the API nor the default pool's other work.
_READS = ThreadPoolExecutor(4, "log-read")
T = TypeVar("T")


def gone(request: web.Request) -> bool:
    """The client hung up (aiohttp does not cancel a handler that has nothing to write)."""
    return request.transport is None or request.transport.is_closing()


def _flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "0").lower()
    if value not in ("0", "1", "true", "false"):
        raise errors.InvalidArgument(f"{name}: expected true or false", field=name)
    return value in ("1", "true")


def _int_param(request: web.Request, name: str) -> int | None:
    value = request.query.get(name)
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise errors.InvalidArgument(f"{name}: expected an integer", field=name) from None
    if number < 0:
        raise errors.InvalidArgument(f"{name}: must not be negative", field=name)
    if number > SQL_INT_MAX:
        raise errors.InvalidArgument(f"{name}: at most {SQL_INT_MAX}", field=name)
    return number


def _rank_param(request: web.Request, job: JobRecord) -> int | None:
    """One rank's log (0 unless asked), or None: every rank's merged (`rank=all`); an
    indexed job's by `index` (0 unless asked)."""
    indexed = job.spec.indexed
    if "index" in request.query or indexed is not None:
        if indexed is None or "rank" in request.query:
            raise errors.InvalidArgument(
                f"index: job {job.name!r} " + ("has indexes, not ranks" if indexed
                                              else "is not an indexed job"), field="index")
        index = _int_param(request, "index") or 0
        if index >= indexed.completions:
            raise errors.InvalidArgument(f"index: job {job.name!r} has indexes 0 to "
                                         f"{indexed.completions - 1}", field="index")
        return index
    value = request.query.get("rank")
    ranks = job.spec.gang.nodes if job.spec.gang is not None else 1
    if value is None:
        return 0
    if value == "all":
        if job.spec.gang is None:
            raise errors.InvalidArgument(f"rank: job {job.name!r} is no gang; its log is "
                                         "rank 0's", field="rank")
        return None
    rank = _int_param(request, "rank")
    assert rank is not None
    if rank >= ranks:
        raise errors.InvalidArgument(f"rank: job {job.name!r} has ranks 0 to {ranks - 1} "
                                     "(or all)", field="rank")
    return rank


@dataclass(frozen=True)
class Tail:
    offset: int  # where it begins
    note: bytes = b""  # said before it when it was cut


def tail_start(path: Path, lines: int, limit: int = TAIL_BYTES) -> Tail:
    """Where the last `lines` lines of the file begin, found in its last `limit` bytes at
    most, read a block at a time from the end: a tail that does not fit is cut, and its
    note says so. On a thread: it reads the disk."""
    try:
        file = open_plain(path)  # a cluster's logs are written as the job's owner
    except (FileNotFoundError, NotPlain):
        return Tail(0)
    size = os.fstat(file.fileno()).st_size
    if lines == 0 or size == 0:
        file.close()
        return Tail(size)
    floor = max(0, size - limit)
    with file:
        file.seek(size - 1)
        # The final newline ends the last line; it does not start one.
        pos = end = size - 1 if file.read(1) == b"\n" else size
        lowest = max(0, floor - 1)  # a newline just before `floor` begins a whole line
        found, first = 0, -1
        while pos > lowest:
            start = max(lowest, pos - CHUNK)
            file.seek(start)
            block = file.read(pos - start)
            at = len(block)
            while (at := block.rfind(b"\n", 0, at)) >= 0:
                found += 1
                first = start + at + 1
                if found == lines:
                    return Tail(first)
            pos = start
        if floor == 0:
            return Tail(0)
        if found:
            return Tail(first, f"[noduslocal: tail cut: the last {found} lines fit in the "
                               f"{limit} bytes a tail reads, not {lines}]\n".encode())
        file.seek(floor)  # one line longer than a tail reads: its end, from a character
        skip = next((i for i, byte in enumerate(file.read(3)) if byte & 0xC0 != 0x80), 3)
        return Tail(floor + skip, f"[noduslocal: line cut: only its last "
                                  f"{end - floor - skip} bytes are shown, a tail reads "
                                  f"{limit}]\n".encode())


def _read_from(path: Path, offset: int) -> bytes:
    """Up to CHUNK bytes from `offset` (none: no such file). On a thread."""
    try:
        with open_plain(path) as file:
            if offset:
                file.seek(offset)
            return file.read(CHUNK)
    except (FileNotFoundError, NotPlain):
        return b""


async def _off_loop(call: Callable[..., T], *args: Any) -> T:
    return await asyncio.get_running_loop().run_in_executor(_READS, call, *args)


async def _send_from(resp: web.StreamResponse, path: Path, offset: int) -> int:
    while chunk := await _off_loop(_read_from, path, offset):
        await resp.write(chunk)
        offset += len(chunk)
    return offset


async def _log_of(services: Services, job: JobRecord, number: int, stream: str,
                  rank: int | None) -> Path | None:
    """Attempt `number`'s log; a gang's merged log is made whole first once nothing writes
    it (its ranks ended while the daemon was down, or it died before its last merge)."""
    if not number:
        return None
    jobs = services.jobs
    path = jobs.log_path(job, number, stream, rank)
    if rank is None and job.spec.gang is not None and not jobs.writing_logs(job.id, number):
        def rank_log(_: Path, of_stream: str, of_rank: int) -> Path:
            return jobs.log_path(job, number, of_stream, of_rank)

        await _off_loop(gang_logs.finish, path.parent, job.spec.gang.nodes, rank_log)
    return path


@routes.get("/v1/jobs/{name}/logs")
async def job_logs(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    job = await lookup(request)
    require_control(request, job, "read the logs of")
    if (note := job.collected_note()) is not None:
        raise errors.NotFound(note)
    follow = _flag(request, "follow")
    stream = request.query.get("stream", "all")
    if stream not in ("all", "stderr"):
        raise errors.InvalidArgument("stream: use all or stderr", field="stream")
    if request.query.get("index") == "all" and job.spec.indexed is not None:
        if "attempt" in request.query or "tail" in request.query:
            raise errors.InvalidArgument("index: all takes each index's last attempt, and "
                                         "no tail; name one index for those",
                                         field="index")
        return await _every_index(request, services, job, stream, follow)
    rank = _rank_param(request, job)
    number = _int_param(request, "attempt") or services.jobs.log_attempt(job, rank)
    if number > job.attempts:
        raise errors.NotFound(f"job {job.name!r} has no attempt {number}")
    tail = _int_param(request, "tail")
    resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    resp.enable_chunked_encoding()
    await start_stream(request, resp)
    path = await _log_of(services, job, number, stream, rank)
    offset = 0
    if path is not None and tail is not None:
        found = await _off_loop(tail_start, path, tail)
        offset = found.offset
        if found.note:
            await resp.write(found.note)
    while True:
        if path is not None:
            offset = await _send_from(resp, path, offset)
        if not follow or gone(request):
            break
        if services.jobs.writing_logs(job.id, number):
            await asyncio.sleep(FOLLOW_POLL)  # the attempt is still writing
            continue
        fresh = await services.jobs.by_id(job.id)
        if path is not None:
            await _log_of(services, job, number, stream, rank)  # a merged log, made whole
            offset = await _send_from(resp, path, offset)
        if fresh.attempts > number:  # started, retried or requeued: follow the next attempt
            number, offset = number + 1, 0
            path = await _log_of(services, job, number, stream, rank)
            continue
        if fresh.phase in TERMINAL:
            break
        await services.jobs.next_event(job, timeout=1.0)
    await resp.write_eof()
    return resp


async def _every_index(request: web.Request, services: Services, job: JobRecord,
                       stream: str, follow: bool) -> web.StreamResponse:
    """An indexed job's logs together (`index=all`), each line prefixed `[iN] `, as the
    indexes write them; followed until the job has ended and every log is read."""
    resp = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
    resp.enable_chunked_encoding()
    await start_stream(request, resp)
    read: dict[int, tuple[int, int]] = {}  # index -> (attempt, offset)
    partial: dict[int, bytes] = {}
    while True:
        fresh = await services.jobs.by_id(job.id)
        last = fresh.phase in TERMINAL or not follow
        logs = await _off_loop(services.jobs.index_logs, fresh, stream)
        for index, number, path in logs:
            attempt, offset = read.get(index, (number, 0))
            if attempt != number:  # a retry ran it again: its new log from the start
                offset, partial[index] = 0, b""
            while chunk := await _off_loop(_read_from, path, offset):
                offset += len(chunk)
                *lines, partial[index] = (partial.get(index, b"") + chunk).split(b"\n")
                if lines:
                    prefix = f"[i{index}] ".encode()
                    await resp.write(b"".join(prefix + line + b"\n" for line in lines))
            read[index] = (number, offset)
        if last:
            break
        if gone(request):
            return resp
        await asyncio.sleep(FOLLOW_POLL * 2)
    for index, rest in sorted(partial.items()):
        if rest:  # a last line without its newline
            await resp.write(f"[i{index}] ".encode() + rest + b"\n")
    await resp.write_eof()
    return resp


@routes.get("/v1/events")
async def events(request: web.Request) -> web.StreamResponse:
    services = request.app[SERVICES]
    since = _int_param(request, "since") or 0
    follow = _flag(request, "follow")
    job_id = None
    project = None
    if "job" in request.query:
        request.match_info["name"] = request.query["job"]
        job_id = (await lookup(request)).id
    elif "project" in request.query:
        project = project_of(request)
    resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    resp.enable_chunked_encoding()
    await start_stream(request, resp)
    with services.jobs.live_events() as live:
        last = since
        while True:  # history first, in pages
            page = await services.jobs.events(since=last, job_id=job_id, project=project,
                                              limit=1000)
            for event in page:
                await resp.write(json.dumps(event.to_wire()).encode() + b"\n")
                last = event.seq
            if len(page) < 1000:
                break
        while follow and not gone(request):
            try:
                event = await asyncio.wait_for(live.get(), IDLE_CHECK)
            except TimeoutError:
                continue  # nothing to send: look whether the client is still there
            if event is None:
                break  # fell behind; the client resumes with since=<last seq>
            if event.seq <= last or (job_id is not None and event.job_id != job_id) or (
                    project is not None and event.project != project):
                continue
            await resp.write(json.dumps(event.to_wire()).encode() + b"\n")
            last = event.seq
    await resp.write_eof()
    return resp

