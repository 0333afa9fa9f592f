"""HTTP/1.1 over the daemon's Unix socket with the standard library only, so the CLI and
the SDK start fast. Finds the socket, maps error bodies to exceptions, streams chunked
responses, and retries while a daemon restarts when the caller allows it.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import struct
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from noduslocal import errors
from noduslocal.sockets import client_socket_candidates

DEFAULT_TIMEOUT = 120.0


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            _connect_through_a_full_queue(sock, self._path, self.timeout)
            _, uid, _ = struct.unpack("3i", sock.getsockopt(
                socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
        except BaseException:
            sock.close()
            raise
        if uid not in (0, os.getuid()):
            sock.close()
            # Someone else's process on a path we would have trusted (/tmp): never send it
            # a job, an environment, or believe its answers.
            raise errors.PermissionDenied(
                f"{self._path} is served by uid {uid}, neither root nor you; refusing it")
        self.sock = sock


OVERLOAD_WAIT = 10.0  # longest we wait for room in the daemon's queue of new connections


def _connect_through_a_full_queue(sock: socket.socket, path: str,
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
                raise errors.DaemonUnavailable(
                    f"the daemon at {path} is overloaded: its queue of new connections "
                    "stayed full; try again in a moment") from None
            time.sleep(delay)
            delay = min(delay * 2, 0.5)


def _url(path: str, query: Mapping[str, Any] | None) -> str:
    items = [(k, v) for k, v in (query or {}).items() if v is not None]
    return f"{path}?{urllib.parse.urlencode(items, doseq=True)}" if items else path


def unavailable(paths: list[Path]) -> errors.DaemonUnavailable:
    where = " or ".join(str(p) for p in paths)
    return errors.DaemonUnavailable(
        f"no noduslocald answers at {where}; start one with `noduslocal daemon`, "
        "or set NODUSLOCAL_SOCKET to the socket of a running one"
    )


class Transport:
    """One keep-alive connection per thread to one daemon."""

    def __init__(self, socket_path: str | Path | None = None) -> None:
        self._explicit = Path(socket_path) if socket_path is not None else None
        self._local = threading.local()

    @property
    def socket_path(self) -> Path:
        if self._explicit is not None:
            return self._explicit
        candidates = client_socket_candidates()
        for path in candidates:
            if path.exists():
                return path
        raise unavailable(candidates)

    def _socket_exists(self) -> bool:
        try:
            return self.socket_path.exists()
        except errors.DaemonUnavailable:
            return False

    def _conn(self, timeout: float) -> _UnixConnection:
        conn: _UnixConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = _UnixConnection(str(self.socket_path), timeout)
            self._local.conn = conn
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def _send(self, method: str, path: str, query: Mapping[str, Any] | None,
              body: Any, headers: Mapping[str, str] | None,
              timeout: float) -> http.client.HTTPResponse:
        url = _url(path, query)
        data = None if body is None else json.dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        # A kept-alive connection may have been closed by the daemon meanwhile: one fresh try.
        for fresh in (False, True):
            conn = self._conn(timeout)
            reused = conn.sock is not None
            try:
                conn.request(method, url, body=data, headers=hdrs)
                return conn.getresponse()
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                self._drop()
                raise unavailable([self.socket_path]) from exc
            except (ConnectionError, http.client.RemoteDisconnected, BrokenPipeError) as exc:
                self._drop()
                if not reused or fresh:
                    raise unavailable([self.socket_path]) from exc
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, headers: Mapping[str, str] | None = None,
                timeout: float = DEFAULT_TIMEOUT, retry_for: float = 0.0) -> Any:
        """Send one request and return the decoded JSON. With `retry_for`, a daemon that is
        down or restarting is tried again until that many seconds have passed."""
        deadline = time.monotonic() + retry_for
        delay = 0.05
        existed = retry_for > 0 and self._socket_exists()
        while True:
            try:
                resp = self._send(method, path, query, body, headers, timeout)
                payload = resp.read()
                break
            except errors.DaemonUnavailable:
                # No socket file, before or now: no daemon, fail at once. A socket that
                # refuses, or one that went away under us, is a daemon restarting.
                if time.monotonic() + delay > deadline or not (
                        existed or self._socket_exists()):
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 1.0)
            except TimeoutError:
                self._drop()
                raise errors.WaitTimeout(f"the daemon did not answer within {timeout:g}s")\
                    from None
        decoded = json.loads(payload) if payload else None
        if resp.status >= 400:
            raise errors.from_wire(resp.status, decoded)
        return decoded

    def upload(self, path: str, source: Path, size: int,
               headers: Mapping[str, str] | None = None) -> Any:
        """PUT a file's bytes, streamed from disk, on a connection of its own."""
        conn = _UnixConnection(str(self.socket_path), DEFAULT_TIMEOUT)
        try:
            with source.open("rb") as body:
                conn.request("PUT", path, body=body, headers={
                    "Content-Type": "application/x-tar", "Content-Length": str(size),
                    **(headers or {})})
                resp = conn.getresponse()
                payload = resp.read()
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise unavailable([self.socket_path]) from exc
        finally:
            conn.close()
        decoded = json.loads(payload) if payload else None
        if resp.status >= 400:
            raise errors.from_wire(resp.status, decoded)
        return decoded

    def download(self, path: str, target: Path, *,
                 query: Mapping[str, Any] | None = None) -> Path:
        """GET PATH into TARGET, verified against the X-Nodus-SHA256 header, atomically."""
        # No read timeout: the daemon hashes a large file before its first byte.
        conn = _UnixConnection(str(self.socket_path), DEFAULT_TIMEOUT)
        conn.timeout = None
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part",
                                    dir=target.parent)  # a fresh name, never a planted link
        os.close(fd)
        tmp = Path(name)
        try:
            conn.request("GET", _url(path, query))
            resp = conn.getresponse()
            if resp.status >= 400:
                payload = resp.read()
                raise errors.from_wire(resp.status, json.loads(payload) if payload else None)
            expected = resp.getheader("X-Nodus-SHA256")
            digest = hashlib.sha256()
            with open(tmp, "wb") as out:
                while chunk := resp.read1(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if expected is None or digest.hexdigest() != expected:
                raise errors.ChecksumMismatch(
                    f"{target.name}: sha256 {digest.hexdigest()} does not match the "
                    f"daemon's {expected}; nothing was saved")
            if (mode := resp.getheader("X-Nodus-Mode")) is not None:
                os.chmod(tmp, int(mode, 8) & 0o777)  # the original's bits, never set-id
            os.replace(tmp, target)
            return target
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if isinstance(exc, FileNotFoundError) and exc.filename is not None:
                raise
            raise unavailable([self.socket_path]) from exc
        finally:
            tmp.unlink(missing_ok=True)
            conn.close()

    def stream(self, path: str, *, query: Mapping[str, Any] | None = None,
               timeout: float | None = None) -> Iterator[bytes]:
        """Chunks of a streamed response, on a connection of its own."""
        conn = _UnixConnection(str(self.socket_path), timeout or DEFAULT_TIMEOUT)
        if timeout is None:
            conn.timeout = None
        url = _url(path, query)
        try:
            try:
                conn.request("GET", url)
                resp = conn.getresponse()
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                raise unavailable([self.socket_path]) from exc
            if resp.status >= 400:
                payload = resp.read()
                raise errors.from_wire(resp.status, json.loads(payload) if payload else None)
            while chunk := resp.read1(65536):
                yield chunk
        except http.client.IncompleteRead as exc:
            raise unavailable([self.socket_path]) from exc
        finally:
            conn.close()
