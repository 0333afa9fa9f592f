"""HTTP/1.1 on a Unix socket in the few lines the daemon's API needs, on the C `_socket`
module alone: http.client and its email parser cost a CLI call 20 ms of imports before it
sends a byte, and socket.py with its enums and selectors 3 ms more. One `Connection` is one
kept-alive socket; responses are read whole or in pieces.
"""

from __future__ import annotations

import _socket
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping

OVERLOAD_WAIT = 10.0  # longest we wait for room in the daemon's queue of new connections
PIECE = 1 << 20  # the most of a body held in memory at once while streaming it
MAX_HEADER_LINE = 65536


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~")


def quote(text: str) -> str:
    """TEXT percent-encoded except RFC 3986's unreserved characters: urllib's
    `quote(text, safe="")`, without importing urllib (3 ms)."""
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in text.encode())


def query_string(items: Iterable[tuple[str, object]]) -> str:
    """`k=v&...` for ITEMS; a list or tuple value gives its key once per element."""
    pairs = []
    for key, value in items:
        for one in value if isinstance(value, list | tuple) else (value,):
            pairs.append(f"{quote(str(key))}={quote(str(one))}")
    return "&".join(pairs)


class Disconnected(ConnectionError):
    """The daemon closed the connection before a whole response came."""


class NotTrusted(PermissionError):
    """The socket is served by a uid that is neither root nor the caller."""


class Overloaded(ConnectionError):
    """The daemon's queue of new connections stayed full."""


def connect(path: str, timeout: float | None) -> _socket.socket:
    """A connected socket to PATH, checked to be served by root or by us: someone else's
    process on a path we would trust (/tmp) must never get a job, an environment, or be
    believed."""
    sock = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM | _socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(timeout)
        _connect_through_a_full_queue(sock, path, timeout)
        cred = sock.getsockopt(_socket.SOL_SOCKET, _socket.SO_PEERCRED, 12)  # pid, uid, gid
        uid = int.from_bytes(cred[4:8], sys.byteorder, signed=True)
        if uid not in (0, os.getuid()):
            raise NotTrusted(f"{path} is served by uid {uid}, neither root nor you; "
                             "refusing it")
    except BaseException:
        sock.close()
        raise
    return sock


def _connect_through_a_full_queue(sock: _socket.socket, path: str,
                                  timeout: float | None) -> None:
    """connect(), waiting a while when the daemon's listen queue is full: a Unix socket
    answers that with EAGAIN at once instead of waiting as TCP does."""
    deadline = time.monotonic() + min(timeout or OVERLOAD_WAIT, OVERLOAD_WAIT)
    delay = 0.01
    while True:
        try:
            sock.connect(path)
            return
        except BlockingIOError:
            if time.monotonic() + delay > deadline:
                raise Overloaded(path) from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


class Response:
    """A status, lower-cased headers, and a body read from the socket on demand."""

    def __init__(self, conn: Connection, status: int, headers: dict[str, str],
                 bodiless: bool) -> None:
        self.status = status
        self.headers = headers
        self._conn = conn
        self._chunked = headers.get("transfer-encoding", "").lower() == "chunked"
        length = headers.get("content-length")
        self._left: int | None = 0 if bodiless else (
            int(length) if length is not None and not self._chunked else None)
        self._done = bodiless or self._left == 0
        if headers.get("connection", "").lower() == "close" or (
                self._left is None and not self._chunked):
            conn.keep = False

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def read(self) -> bytes:
        return b"".join(self.pieces())

    def pieces(self, size: int = PIECE) -> Iterator[bytes]:
        """The body as it arrives, in pieces of at most SIZE bytes."""
        reader = self._conn.reader
        while not self._done:
            if self._chunked:
                if not self._left:
                    line = reader.readline(MAX_HEADER_LINE)
                    if not line:
                        raise Disconnected("the response ended inside a chunk header")
                    self._left = int(line.split(b";", 1)[0].strip() or b"0", 16)
                    if self._left == 0:
                        while reader.readline(MAX_HEADER_LINE) not in (b"\r\n", b"\n", b""):
                            pass  # trailers: none of ours carry meaning
                        self._done = True
                        return
                piece = reader.read1(min(self._left, size))
                if not piece:
                    raise Disconnected("the response ended inside a chunk")
                self._left -= len(piece)
                if not self._left:
                    reader.readline(MAX_HEADER_LINE)  # the CRLF after a chunk
                yield piece
            elif self._left is None:  # to the end of the connection
                piece = reader.read1(size)
                if not piece:
                    self._done = True
                    return
                yield piece
            else:
                piece = reader.read1(min(self._left, size))
                if not piece:
                    raise Disconnected("the response ended before its Content-Length")
                self._left -= len(piece)
                self._done = self._left == 0
                yield piece


class Reader:
    """Buffered reads from a raw socket, the two that HTTP needs: a line, and whatever has
    arrived (at most N bytes)."""

    def __init__(self, sock: _socket.socket) -> None:
        self._sock = sock
        self._buf = bytearray()

    def readline(self, limit: int) -> bytes:
        """Up to and including the next newline, at most LIMIT bytes; b"" at the end."""
        while True:
            end = self._buf.find(b"\n", 0, limit)
            if end >= 0 or len(self._buf) >= limit:
                end = end + 1 if end >= 0 else limit
                line = bytes(self._buf[:end])
                del self._buf[:end]
                return line
            data = self._sock.recv(65536)
            if not data:
                line = bytes(self._buf)
                self._buf.clear()
                return line
            self._buf += data

    def read1(self, size: int) -> bytes:
        if not self._buf:
            return self._sock.recv(size)
        piece = bytes(self._buf[:size])
        del self._buf[:size]
        return piece


class Connection:
    """One socket to the daemon, kept alive across requests while the daemon allows it."""

    def __init__(self, path: str, timeout: float | None) -> None:
        self.sock = connect(path, timeout)
        self.reader = Reader(self.sock)
        self.keep = True

    def settimeout(self, timeout: float | None) -> None:
        self.sock.settimeout(timeout)

    def close(self) -> None:
        self.sock.close()

    def send_file(self, fd: int, size: int) -> None:
        """SIZE bytes of the open file FD, by sendfile(2), after a `send` with that length."""
        timeout = self.sock.gettimeout()
        self.sock.settimeout(None)  # blocking, so sendfile waits for room instead of EAGAIN
        try:
            offset = 0
            while offset < size:
                sent = os.sendfile(self.sock.fileno(), fd, offset, size - offset)
                if sent == 0:
                    raise OSError(f"the file ended {size - offset} bytes short of {size}")
                offset += sent
        finally:
            self.sock.settimeout(timeout)

    def send(self, method: str, target: str, headers: Mapping[str, str],
             body: bytes | None = None, length: int | None = None) -> None:
        """The request line and headers, and BODY when given; a caller that gives only a
        LENGTH writes that many bytes itself with `sendfile` or `sock.sendall`."""
        size = len(body) if body is not None else length
        lines = [f"{method} {target} HTTP/1.1", "Host: localhost"]
        lines += [f"{key}: {value}" for key, value in headers.items()]
        if size is not None:
            lines.append(f"Content-Length: {size}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        self.sock.sendall(head + body if body else head)

    def response(self, method: str) -> Response:
        status_line = self.reader.readline(MAX_HEADER_LINE)
        if not status_line:
            raise Disconnected("the daemon closed the connection without an answer")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
            raise Disconnected(f"not an HTTP answer: {status_line[:80]!r}")
        status = int(parts[1])
        headers: dict[str, str] = {}
        while True:
            line = self.reader.readline(MAX_HEADER_LINE)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise Disconnected("the daemon closed the connection inside the headers")
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        bodiless = method == "HEAD" or status in (204, 304) or 100 <= status < 200
        return Response(self, status, headers, bodiless)
