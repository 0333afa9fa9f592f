"""Who may hold the daemon's connections: a cap per uid (the kernel's SO_PEERCRED at accept)
and one for everybody below the file-descriptor limit, so one user's idle or half-sent
connections never leave another's requests unanswered. A refused connection gets a JSON
error (429 for a user at their cap, 503 when the daemon is full) and is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import struct
from collections import Counter
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from noduslocal.domain import errors

log = logging.getLogger(__name__)

# File descriptors kept back from connections for the database, logs, pipes, docker and
# the files of the jobs being collected: at least this many, or a quarter of the limit.
FD_RESERVE = 128
# A refused client gets this long to finish sending its request, so its unread bytes do
# not turn our answer into a reset on its side.
REFUSAL_GRACE = 0.5
_PEERCRED = struct.Struct("3i")
ACCEPT_BATCH = 32  # connections taken off the queue per wake-up of the loop


def raise_fd_limit(wanted: int | None) -> int:
    """Set the soft RLIMIT_NOFILE to `wanted` (within the hard limit), or by default raise it
    to the hard limit (at most 65,536): Debian starts daemons at 1,024. Returns the limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = hard if hard != resource.RLIM_INFINITY else 1 << 20
    target = min(wanted if wanted is not None else max(soft, 1 << 16), ceiling)
    if target != soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target


def _reserve(fd_limit: int) -> int:
    return max(FD_RESERVE, fd_limit // 4)


def total_cap(fd_limit: int) -> int:
    """Connections admitted at once: the limit less the reserve."""
    return max(16, fd_limit - _reserve(fd_limit))


def listen_backlog(fd_limit: int) -> int:
    """asyncio accepts up to the backlog in one go before any protocol sees a connection,
    so a burst may take that many descriptors beyond the cap: keep it within the reserve."""
    return max(16, min(1024, _reserve(fd_limit) // 2))


def peer_uid(transport: asyncio.BaseTransport) -> int | None:
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family != socket.AF_UNIX:
        return None
    try:
        _, uid, _ = _PEERCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size))
    except OSError:
        return None
    return int(uid)


def _response(exc: errors.NodusError) -> bytes:
    body = json.dumps(exc.to_wire()).encode()
    reason = "Too Many Requests" if exc.http_status == 429 else "Service Unavailable"
    head = (f"HTTP/1.1 {exc.http_status} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
    return head.encode() + body


class JsonErrorHandler(RequestHandler):
    """aiohttp's request handler, but what its HTTP parser refuses (a request line or header
    over 8,190 bytes, a control character in a header) gets our one error shape too, and a
    client's malformed request is not logged as the daemon's error."""

    def handle_error(self, request: BaseRequest, status: int = 500,
                     exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500 or request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        log.debug("refused a request the HTTP parser could not read: %s", message)
        detail = (message or "malformed").replace("\n", " ")[:200]
        error = errors.InvalidArgument(f"the request could not be read as HTTP: {detail}")
        response = web.json_response(error.to_wire(), status=error.http_status)
        response.force_close()
        return response


class ConnectionGuard:
    """Counts the socket's open connections per uid and in all, decides which are let in,
    and makes aiohttp's request handler for those."""

    def __init__(self, server: web.Server, per_user: int, total: int,
                 handler_options: dict[str, Any]) -> None:
        self._server = server
        self._handler_options = handler_options
        self.per_user = per_user
        self.total = total
        # Refusals being answered hold a descriptor for up to REFUSAL_GRACE too.
        self.most_open = total + max(8, total // 8)
        self.by_uid: Counter[int] = Counter()
        self.open = 0  # accepted and not yet closed: every one holds a descriptor
        self.admitted = 0  # of those, the ones handed to aiohttp
        self.refused = 0
        self.on_room: Callable[[], None] | None = None

    def accepted(self) -> None:
        self.open += 1

    def closed(self) -> None:
        self.open -= 1
        if self.on_room is not None and self.open < self.most_open:
            self.on_room()

    def admit(self, uid: int | None) -> errors.NodusError | None:
        if self.admitted >= self.total:
            return errors.DaemonUnavailable(
                f"the daemon is overloaded: {self.admitted} connections are open, its limit "
                f"(from its file-descriptor limit); try again in a moment")
        if uid is not None and self.by_uid[uid] >= self.per_user:
            return errors.ResourceExhausted(
                f"uid {uid} already has {self.by_uid[uid]} connections open to the daemon, "
                f"the most one user may (user_max_connections); close some and try again")
        return None

    def handler(self) -> asyncio.Protocol:
        return JsonErrorHandler(self._server, loop=asyncio.get_running_loop(),
                                **self._handler_options)


class _GuardedConnection(asyncio.Protocol):
    """One accepted connection: either aiohttp's request handler behind a count, or a
    refusal that answers once and closes."""

    def __init__(self, guard: ConnectionGuard) -> None:
        self._guard = guard
        self._inner: Any = None
        self._uid: int | None = None
        self._admitted = False
        self._transport: asyncio.Transport | None = None
        self._seen = b""
        self._closer: asyncio.TimerHandle | None = None
        self.made = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        self._transport = transport  # type: ignore[assignment]
        self.made = True
        self._uid = peer_uid(transport)
        refusal = guard.admit(self._uid)
        if refusal is None:
            self._admitted = True
            guard.admitted += 1
            if self._uid is not None:
                guard.by_uid[self._uid] += 1
            self._inner = guard.handler()
            self._inner.connection_made(transport)
            return
        guard.refused += 1
        if guard.refused in (1, 10, 100) or guard.refused % 1000 == 0:
            log.warning("refused a connection (%d so far): %s", guard.refused,
                        refusal.message)
        transport.write(_response(refusal))  # type: ignore[attr-defined]
        self._closer = asyncio.get_running_loop().call_later(REFUSAL_GRACE, transport.close)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)
            return
        # A refused client's request is read and dropped; once it is whole, close.
        self._seen = (self._seen + data)[-4:]
        if b"\r\n\r\n" in self._seen and self._transport is not None:
            self._transport.close()

    def eof_received(self) -> bool | None:
        if self._inner is not None:
            return self._inner.eof_received()  # type: ignore[no-any-return]
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        guard = self._guard
        guard.closed()
        if self._admitted:
            guard.admitted -= 1
        if self._admitted and self._uid is not None:
            guard.by_uid[self._uid] -= 1
            if not guard.by_uid[self._uid]:
                del guard.by_uid[self._uid]
        if self._closer is not None:
            self._closer.cancel()
        if self._inner is not None:
            self._inner.connection_lost(exc)
            self._inner = None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()


class GuardedSite(web.BaseSite):
    """aiohttp's SockSite with an accept loop of our own: it stops taking connections off
    the kernel's queue while the guard is full, so a burst can never spend the descriptors
    the daemon needs (asyncio's server accepts a whole backlog before any protocol runs).
    Clients then see a full queue, which ours wait out and then report as overload."""

    __slots__ = ("_accepting", "_connecting", "_guard", "_sock")

    def __init__(self, runner: web.BaseRunner, sock: socket.socket, guard: ConnectionGuard,
                 backlog: int) -> None:
        super().__init__(runner, backlog=backlog)
        self._sock = sock
        self._guard = guard
        self._accepting = False
        self._connecting: set[asyncio.Task[None]] = set()

    @property
    def name(self) -> str:
        return f"http://unix:{self._sock.getsockname()}:"

    async def start(self) -> None:
        await super().start()
        self._sock.setblocking(False)
        self._guard.on_room = self._resume
        self._resume()

    async def stop(self) -> None:
        self._pause()
        self._guard.on_room = None
        self._sock.close()
        await super().stop()

    def _resume(self) -> None:
        if not self._accepting and self._sock.fileno() >= 0:
            asyncio.get_running_loop().add_reader(self._sock.fileno(), self._accept)
            self._accepting = True

    def _pause(self) -> None:
        if self._accepting:
            asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._accepting = False

    def _accept(self) -> None:
        guard = self._guard
        loop = asyncio.get_running_loop()
        for _ in range(ACCEPT_BATCH):
            if guard.open >= guard.most_open:
                self._pause()  # the guard's on_room resumes
                return
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of descriptors or memory after all: wait a moment
                log.warning("accepting a connection failed (%s); trying again in 1 s", exc)
                self._pause()
                loop.call_later(1.0, self._resume)
                return
            conn.setblocking(False)
            guard.accepted()
            task = loop.create_task(self._connect(conn))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    async def _connect(self, conn: socket.socket) -> None:
        protocol = _GuardedConnection(self._guard)
        try:
            await asyncio.get_running_loop().connect_accepted_socket(lambda: protocol,
                                                                     sock=conn)
        except Exception as exc:
            log.warning("a connection could not be set up: %s", exc)
            conn.close()
            if not protocol.made:
                self._guard.closed()
