"""`Job.exec(..., pty=True)` and `noduslocal job exec -it`: a command beside a running job
on a pseudo-terminal in the daemon, reached over a WebSocket on the daemon's socket (run by
an event loop in a thread of its own), as a process with stdin, stdout, resize and wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from noduslocal.domain import errors


class TerminalOutput:
    """What the command prints (the terminal's one stream: stdout and stderr together)."""

    def __init__(self) -> None:
        self._chunks: queue.Queue[bytes] = queue.Queue()
        self._buffer = b""
        self._eof = False

    def _feed(self, data: bytes) -> None:
        self._chunks.put(data)

    def read1(self, timeout: float | None = None) -> bytes:
        """What has come since the last read, at least one byte, waiting for it; b"" at
        the end. TIMEOUT: TimeoutError when nothing came within it."""
        if self._buffer:
            data, self._buffer = self._buffer, b""
            return data
        if self._eof:
            return b""
        try:
            data = self._chunks.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError("nothing printed within the timeout") from None
        if not data:
            self._eof = True
        return data

    def read(self, timeout: float | None = None) -> bytes:
        """Everything until the end."""
        parts = []
        while data := self.read1(timeout):
            parts.append(data)
        return b"".join(parts)

    def read_until(self, marker: bytes, timeout: float | None = None) -> bytes:
        """Up to and including MARKER (TimeoutError when it did not come in time)."""
        found = b""
        while marker not in found:
            data = self.read1(timeout)
            if not data:
                raise EOFError(f"the terminal ended before {marker!r}: {found[-200:]!r}")
            found += data
        end = found.index(marker) + len(marker)
        self._buffer = found[end:] + self._buffer
        return found[:end]


class TerminalInput:
    def __init__(self, process: TerminalProcess) -> None:
        self._process = process

    def write(self, data: bytes | str) -> int:
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self._process._send(raw)
        return len(raw)

    def flush(self) -> None:
        """Written at once: nothing to flush."""


class TerminalProcess:
    """A command on a pseudo-terminal beside a job's rank: `stdin.write()`, `stdout.read1()`,
    `resize(rows, cols)`, `wait()` (its exit status) and `close()` (kills it)."""

    def __init__(self, socket_path: str, name: str, project: str | None,
                 command: list[str] | None, rank: int | None = None,
                 index: int | None = None, rows: int = 24, cols: int = 80) -> None:
        params: dict[str, str] = {"rows": str(rows), "cols": str(cols)}
        if project:
            params["project"] = project
        if command:
            params["command"] = json.dumps(list(command))
        for key, value in (("rank", rank), ("index", index)):
            if value is not None:
                params[key] = str(value)
        self.stdout = TerminalOutput()
        self.stdin = TerminalInput(self)
        self.returncode: int | None = None
        self._exited = threading.Event()
        self._ready: queue.Queue[BaseException | None] = queue.Queue()
        self._loop = asyncio.new_event_loop()
        self._ws: Any = None
        self._thread = threading.Thread(
            target=self._run, args=(socket_path, f"/v1/jobs/{quote(name, safe='')}/terminal",
                                    params),
            name="noduslocal-terminal", daemon=True)
        self._thread.start()
        failed = self._ready.get()
        if failed is not None:
            self._thread.join()
            raise failed

    # --- the caller's side ---------------------------------------------------------------

    def resize(self, rows: int, cols: int) -> None:
        self._call(self._send_text, json.dumps({"resize": [rows, cols]}))

    def wait(self, timeout: float | None = None) -> int:
        if not self._exited.wait(timeout):
            raise TimeoutError("the command has not ended")
        assert self.returncode is not None
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode

    def close(self) -> None:
        """End it (the daemon kills what still runs) and free the connection."""
        if self._thread.is_alive():
            self._call(self._close)
            self._thread.join(10)

    def __enter__(self) -> TerminalProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, data: bytes) -> None:
        self._call(self._send_bytes, data)

    def _call(self, fn: Any, *args: Any) -> None:
        if not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop has just stopped
                asyncio.run_coroutine_threadsafe(fn(*args), self._loop)

    # --- the loop's side -------------------------------------------------------------------

    def _run(self, socket_path: str, path: str, params: Mapping[str, str]) -> None:
        try:
            self._loop.run_until_complete(self._session(socket_path, path, params))
        finally:
            self._loop.close()
            if self.returncode is None:
                self.returncode = -1
            self.stdout._feed(b"")
            self._exited.set()

    async def _session(self, socket_path: str, path: str, params: Mapping[str, str]) -> None:
        import aiohttp

        from noduslocal.sdk.aio import TrustedConnector

        async with aiohttp.ClientSession(connector=TrustedConnector(path=socket_path)) as http:
            try:
                self._ws = await http.ws_connect(f"http://localhost{path}", params=params,
                                                 max_msg_size=0)
            except aiohttp.WSServerHandshakeError as exc:
                self._ready.put(_refusal(exc))
                return
            except (aiohttp.ClientError, OSError) as exc:
                self._ready.put(errors.DaemonUnavailable(
                    f"cannot reach the daemon at {socket_path}: {exc}"))
                return
            except errors.NodusError as exc:
                self._ready.put(exc)
                return
            self._ready.put(None)
            async for message in self._ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    self.stdout._feed(message.data)
                elif message.type == aiohttp.WSMsgType.TEXT:
                    with contextlib.suppress(ValueError, KeyError, TypeError):
                        self.returncode = int(json.loads(message.data)["exit"])
            await self._ws.close()

    async def _send_bytes(self, data: bytes) -> None:
        if self._ws is not None and not self._ws.closed:
            await self._ws.send_bytes(data)

    async def _send_text(self, text: str) -> None:
        if self._ws is not None and not self._ws.closed:
            await self._ws.send_str(text)

    async def _close(self) -> None:
        if self._ws is not None:
            await self._ws.close()


def _refusal(exc: Any) -> errors.NodusError:
    """The daemon's refusal of the upgrade, from the header it says it in."""
    said = (exc.headers or {}).get(errors.ERROR_HEADER)
    try:
        return errors.from_wire(exc.status, json.loads(said)) if said else \
            errors.Internal(f"the daemon refused the terminal: HTTP {exc.status}")
    except ValueError:
        return errors.Internal(f"the daemon refused the terminal: HTTP {exc.status}")
