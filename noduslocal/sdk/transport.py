"""Requests to the daemon over its Unix socket, on `wire` and the standard library only, so
the CLI and the SDK start fast. Finds the socket, maps error bodies to exceptions, streams
chunked responses, and retries while a daemon restarts when the caller allows it; bodies
are JSON on CPython's C codec directly (json_loads, json_dumps).
"""

from __future__ import annotations

import os
import time
from _thread import _local  # threading.local itself, without importing threading

from noduslocal.domain import errors
from noduslocal.domain.sockets import SYSTEM_SOCKET, client_socket_candidates
from noduslocal.sdk import wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from pathlib import Path
    from typing import Any

DEFAULT_TIMEOUT = 120.0
OVERLOAD_WAIT = wire.OVERLOAD_WAIT


def _url(path: str, query: Mapping[str, Any] | None) -> str:
    items = [(k, v) for k, v in (query or {}).items() if v is not None]
    return f"{path}?{wire.query_string(items)}" if items else path


# Where scripts/install.sh puts the shared daemon's units: their presence says this box has
# one, which its users should reach rather than start a private daemon of their own.
SHARED_UNITS = ("/etc/systemd/system/noduslocal.socket", "/lib/systemd/system/noduslocal.socket")


def unavailable(paths: list[str]) -> errors.DaemonUnavailable:
    where = " or ".join(str(p) for p in paths)
    if SYSTEM_SOCKET in paths and any(os.path.exists(unit) for unit in SHARED_UNITS):
        return errors.DaemonUnavailable(
            f"no noduslocald answers at {where}: this box has a shared daemon; check it "
            "with `systemctl status noduslocal.socket noduslocal.service` or ask its admin "
            "(`noduslocal daemon` would start a private one of your own, without the box's "
            "GPUs, docker or your lab's queue)")
    return errors.DaemonUnavailable(
        f"no noduslocald answers at {where}; start one with `noduslocal daemon` (a private "
        "daemon of your own: on a shared box, ask its admin instead), or set "
        "NODUSLOCAL_SOCKET to the socket of a running one"
    )


def not_let_in(path: str, uid: int | None = None,
               groups: list[int] | None = None) -> str:
    """Why the socket refused us (EACCES), in words that say what to do: a shared daemon's
    users are the members of its socket's group (scripts/install.sh). `uid` and `groups`:
    the caller's (this process's by default)."""
    import grp
    import pwd

    uid = os.getuid() if uid is None else uid
    groups = os.getgroups() if groups is None else groups
    admin = f"permission denied on {path}: ask this daemon's admin"
    try:
        gid = os.stat(path).st_gid
        group = grp.getgrgid(gid)
        user = pwd.getpwuid(uid)
    except (OSError, KeyError):
        return f"{admin} for access"
    if gid == 0:  # no socket group was found at the daemon's start: no group to join
        return f"{admin}: its socket is root's alone (no socket group)"
    if gid in groups or user.pw_gid == gid:
        return (f"{admin}: you are in its group {group.gr_name}, yet the socket's mode or "
                "a security module refuses you")
    if user.pw_name in group.gr_mem:
        return (f"permission denied on {path}: you were added to its group "
                f"{group.gr_name} after this session began; log in again (or run "
                f"`newgrp {group.gr_name}`)")
    return (f"permission denied on {path}: this daemon's users are the members of the group "
            f"{group.gr_name}; ask its admin to add you (usermod -aG {group.gr_name} "
            f"{user.pw_name}), then log in again")


def _decoded(status: int, payload: bytes) -> Any:
    decoded = json_loads(payload) if payload else None
    if status >= 400:
        raise errors.from_wire(status, decoded)
    return decoded


def _read(resp: wire.Response) -> Any:
    return _decoded(resp.status, resp.read())


class Transport:
    """One keep-alive connection per thread to one daemon."""

    def __init__(self, socket_path: str | os.PathLike[str] | None = None) -> None:
        self._explicit = os.fspath(socket_path) if socket_path is not None else None
        self._local = _local()

    @property
    def socket_path(self) -> str:
        if self._explicit is not None:
            return self._explicit
        candidates = client_socket_candidates()
        for path in candidates:
            if os.path.exists(path):
                return path
        raise unavailable(candidates)

    def _socket_exists(self) -> bool:
        try:
            return os.path.exists(self.socket_path)
        except errors.DaemonUnavailable:
            return False

    def _open(self, timeout: float | None) -> wire.Connection:
        """A new connection, its failures said in our words."""
        path = self.socket_path
        try:
            return wire.Connection(path, timeout)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise unavailable([path]) from exc
        except wire.Overloaded:
            raise errors.DaemonUnavailable(
                f"the daemon at {path} is overloaded: its queue of new connections "
                "stayed full; try again in a moment") from None
        except wire.NotTrusted as exc:
            raise errors.PermissionDenied(str(exc)) from None
        except PermissionError:
            raise errors.PermissionDenied(not_let_in(path)) from None

    def _conn(self, timeout: float) -> tuple[wire.Connection, bool]:
        """This thread's connection, and whether it was already open."""
        conn: wire.Connection | None = getattr(self._local, "conn", None)
        if conn is not None and conn.keep:
            conn.settimeout(timeout)
            return conn, True
        self._drop()
        conn = self._open(timeout)
        self._local.conn = conn
        return conn, False

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
        self._local.conn = None

    def _exchange(self, method: str, url: str, data: bytes | None,
                  headers: Mapping[str, str], timeout: float) -> tuple[int, bytes]:
        # A kept-alive connection may have been closed by the daemon meanwhile: one fresh try.
        for fresh in (False, True):
            conn, reused = self._conn(timeout)
            try:
                conn.send(method, url, headers, data)
                resp = conn.response(method)
                payload = resp.read()
            except (ConnectionError, wire.Disconnected) as exc:
                self._drop()
                if not reused or fresh:
                    raise unavailable([self.socket_path]) from exc
                continue
            if not conn.keep:
                self._drop()
            return resp.status, payload
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, headers: Mapping[str, str] | None = None,
                timeout: float = DEFAULT_TIMEOUT, retry_for: float = 0.0) -> Any:
        """Send one request and return the decoded JSON. With `retry_for`, a daemon that is
        down or restarting is tried again until that many seconds have passed."""
        url = _url(path, query)
        data = None if body is None else json_dumps(body).encode()
        hdrs = {"Content-Type": "application/json"} if data is not None else {}
        hdrs.update(headers or {})
        deadline = time.monotonic() + retry_for
        delay = 0.05
        existed = retry_for > 0 and self._socket_exists()
        while True:
            try:
                status, payload = self._exchange(method, url, data, hdrs, timeout)
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
        return _decoded(status, payload)

    def upload(self, path: str, source: Path, size: int,
               headers: Mapping[str, str] | None = None) -> Any:
        """PUT a file's bytes, streamed from disk, on a connection of its own."""
        conn = self._open(DEFAULT_TIMEOUT)
        try:
            with source.open("rb") as body:
                conn.send("PUT", path, {"Content-Type": "application/x-tar",
                                        **(headers or {})}, length=size)
                conn.send_file(body.fileno(), size)
            return _read(conn.response("PUT"))
        except (ConnectionError, wire.Disconnected) as exc:
            raise unavailable([self.socket_path]) from exc
        finally:
            conn.close()

    def download(self, path: str, target: Path, *,
                 query: Mapping[str, Any] | None = None) -> Path:
        """GET PATH into TARGET, verified against the X-Nodus-SHA256 header, atomically."""
        import hashlib
        import tempfile
        # No read timeout: the daemon hashes a large file before its first byte.
        conn = self._open(None)
        fd, name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part",
                                    dir=target.parent)  # a fresh name, never a planted link
        os.close(fd)
        from pathlib import Path

        tmp = Path(name)
        try:
            conn.send("GET", _url(path, query), {})
            resp = conn.response("GET")
            if resp.status >= 400:
                _read(resp)
            expected = resp.header("X-Nodus-SHA256")
            digest = hashlib.sha256()
            with open(tmp, "wb") as out:
                for chunk in resp.pieces():
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if expected is None or digest.hexdigest() != expected:
                raise errors.ChecksumMismatch(
                    f"{target.name}: sha256 {digest.hexdigest()} does not match the "
                    f"daemon's {expected}; nothing was saved")
            if (mode := resp.header("X-Nodus-Mode")) is not None:
                os.chmod(tmp, int(mode, 8) & 0o777)  # the original's bits, never set-id
            os.replace(tmp, target)
            return target
        except (ConnectionError, wire.Disconnected) as exc:
            raise unavailable([self.socket_path]) from exc
        finally:
            tmp.unlink(missing_ok=True)
            conn.close()

    def stream(self, path: str, *, query: Mapping[str, Any] | None = None,
               timeout: float | None = None) -> Iterator[bytes]:
        """Chunks of a streamed response, on a connection of its own; no TIMEOUT waits for
        as long as the daemon keeps the stream open."""
        conn = self._open(timeout)
        try:
            conn.send("GET", _url(path, query), {})
            resp = conn.response("GET")
            if resp.status >= 400:
                _read(resp)
            yield from resp.pieces(65536)
        except (ConnectionError, wire.Disconnected) as exc:
            raise unavailable([self.socket_path]) from exc
        finally:
            conn.close()


# JSON for the client's requests and answers on CPython's C codec (`_json`) directly: the
# json package imports `re` for its pure-Python fallback, and `re` with `enum` costs a CLI call
# a quarter of its time. `json_dumps` and `json_loads` give what json's do with their
# defaults; json's own are used where `_json` is missing.

try:
    from _json import encode_basestring_ascii, make_encoder, make_scanner
except ImportError:  # not CPython: the json package, with its price
    from json import dumps as json_dumps
    from json import loads as json_loads
else:
    _WHITESPACE = " \t\n\r"

    class _Parsing:
        """What the C scanner reads off its context: json.loads' defaults."""

        strict = True
        object_hook = None
        object_pairs_hook = None
        parse_float = float
        parse_int = int
        parse_constant = {"NaN": float("nan"), "Infinity": float("inf"),
                          "-Infinity": float("-inf")}.__getitem__
        memo: dict[str, str] = {}

    _scan = make_scanner(_Parsing())

    def _not_serializable(value: object) -> object:
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    def json_loads(text: str | bytes) -> Any:
        if isinstance(text, bytes | bytearray):
            text = text.decode()
        start = len(text) - len(text.lstrip(_WHITESPACE))
        try:
            value, end = _scan(text, start)
        except StopIteration as exc:
            raise ValueError(f"not JSON: expecting a value at character {exc.value}") \
                from None
        finally:
            _Parsing.memo.clear()
        if text[end:].strip(_WHITESPACE):
            raise ValueError(f"not JSON: extra data at character {end}")
        return value

    def json_dumps(value: Any) -> str:
        encode = make_encoder({}, _not_serializable, encode_basestring_ascii, None, ": ",
                              ", ", False, False, True)
        return "".join(encode(value, 0))
