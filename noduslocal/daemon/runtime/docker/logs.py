"""A container's output, copied from dockerd's log stream into the attempt directory as
the shim writes a host job's: stdout and stderr in order in output.log, stderr alone in
stderr.log, secrets masked, each capped as the shim caps it. A thread per container.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docker

from noduslocal.daemon.runtime.shim import MAX_LOG, OUTPUT_LOG, STDERR_LOG, CappedLog, Masker

log = logging.getLogger(__name__)
HEADER = struct.Struct(">BxxxL")  # dockerd's multiplexed stream: stream id, payload size
STDOUT, STDERR = 1, 2
READ_SIZE = 1 << 16


class LogPump:
    """One container's whole log (from its start: a pump started again rewrites the
    files), copied in a thread of its own until the container ends or stop() is called;
    each file at most `cap` bytes. Made on the event loop, which drained() runs on."""

    def __init__(self, new_client: Callable[[], docker.DockerClient], container_id: str,
                 directory: Path, mask: list[bytes], cap: int = MAX_LOG) -> None:
        self.new_client = new_client
        self.container_id = container_id
        self.directory = directory
        self.maskers = {STDOUT: Masker(mask), STDERR: Masker(mask)}
        self.cap = cap
        self.received = 0  # bytes read from dockerd: how drained() tells slow from stuck
        self.closed = threading.Event()
        self.discard = False  # superseded: a new pump writes the files now
        self._loop = asyncio.get_running_loop()
        self.finished: asyncio.Future[None] = self._loop.create_future()
        self.thread = threading.Thread(target=self._run, name=f"logs-{container_id[:12]}",
                                       daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self, discard: bool = False) -> None:
        """Stop at the next read. `discard`: a pump started again writes the files now,
        so nothing more of this one's may reach them; else what it holds is written."""
        self.discard = self.discard or discard
        self.closed.set()

    async def drained(self, quiet: float) -> bool:
        """Wait for the copy of an ended container's log to finish, as long as it moves.
        False once `quiet` seconds pass with nothing read (dockerd stuck). A busy box
        copies a long log slowly and its end must not be cut for that; dockerd's own cap
        on a container's log (spec.py) bounds the wait."""
        while True:
            seen = self.received
            try:
                await asyncio.wait_for(asyncio.shield(self.finished), quiet)
                return True
            except TimeoutError:
                if self.received == seen:
                    return False

    def _run(self) -> None:
        try:
            self._copy()
        finally:
            with contextlib.suppress(RuntimeError):  # a closed loop: the daemon is gone
                self._loop.call_soon_threadsafe(self._set_finished)

    def _set_finished(self) -> None:
        if not self.finished.done():
            self.finished.set_result(None)

    def _copy(self) -> None:
        client = None
        try:
            client = self.new_client()
            api = client.api
            url = f"{api.base_url}/v{api.api_version}/containers/{self.container_id}/logs"
            # No read timeout: a quiet job may print nothing for hours.
            response = api.get(url, params={"follow": 1, "stdout": 1, "stderr": 1},
                               stream=True, timeout=None)
            response.raise_for_status()
            read = _reader(response)
        except Exception:
            log.exception("reading the log of container %s failed; keeping what was copied",
                          self.container_id[:12])
            if client is not None:
                client.close()
            return
        # Truncated only now that the whole log is coming again.
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        combined = CappedLog(os.open(self.directory / OUTPUT_LOG, flags, 0o640), self.cap)
        errors = CappedLog(os.open(self.directory / STDERR_LOG, flags, 0o640), self.cap)
        frames = Frames()
        try:
            while not self.closed.is_set():
                data = read(READ_SIZE)
                if not data or self.discard:
                    break
                self.received += len(data)
                for stream, payload in frames.feed(data):
                    _write(combined, errors, stream, self.maskers[stream].feed(payload))
        except Exception:
            log.exception("copying the log of container %s failed", self.container_id[:12])
        finally:
            if self.discard:
                os.close(combined.fd)
                os.close(errors.fd)
            else:
                for stream, masker in self.maskers.items():
                    _write(combined, errors, stream, masker.feed(b"", final=True))
                combined.close()
                errors.close()
            client.close()


def _reader(response: Any) -> Callable[[int], bytes]:
    """What has arrived of the body, up to a size; b"" at its end. dockerd flushes each
    frame as an HTTP chunk of its own, and urllib3 hands them out one read1() each: for a
    job printing a line at a time that was three quarters of the copy's CPU. So a chunked body
    is read from http.client's buffered socket file, as docker-py's own
    `_get_raw_response_socket` reaches it, and unchunked here, as much as has arrived at
    once. Where that file cannot say what has arrived (paramiko's, for an ssh:// host) or
    the body is not chunked, a frame at a time through urllib3, as exact reads."""
    inner = getattr(response.raw, "_fp", None)  # http.client's response, no body read yet
    fp = getattr(inner, "fp", None)
    if getattr(inner, "chunked", False) and hasattr(fp, "read1"):
        body = Dechunker()

        def read_chunked(size: int) -> bytes:
            while not body.ended:
                raw = fp.read1(size)
                if not raw:
                    break
                data = body.feed(raw)
                if data:
                    return data
            return b""
        return read_chunked

    def read_frame(size: int) -> bytes:
        del size  # a frame is read whole: a read of more could wait for output to come
        header = _read_exact(response.raw, HEADER.size)
        if header is None:
            return b""
        payload = _read_exact(response.raw, HEADER.unpack(header)[1])
        return b"" if payload is None else header + payload
    return read_frame


def _read_exact(raw: Any, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        more = raw.read(size - len(data))
        if not more:
            return None
        data += more
    return data


def _write(combined: CappedLog, errors: CappedLog, stream: int, chunk: bytes) -> None:
    combined.write(chunk)
    if stream == STDERR:
        errors.write(chunk)


class Dechunker:
    """An HTTP/1.1 chunked body cut free of its framing, however the reads split it."""

    def __init__(self) -> None:
        self.pending = bytearray()
        self.left = 0  # of the current chunk's data
        self.skip = 0  # of the CRLF after it
        self.ended = False

    def feed(self, data: bytes) -> bytes:
        self.pending += data
        pending, parts, at = self.pending, [], 0
        end = len(pending)
        while at < end and not self.ended:
            if self.skip:
                step = min(self.skip, end - at)
                self.skip -= step
            elif self.left:
                step = min(self.left, end - at)
                parts.append(pending[at:at + step])
                self.left -= step
                self.skip = 0 if self.left else 2
            else:
                line = pending.find(b"\r\n", at)
                if line < 0:
                    break
                size = int(pending[at:line].split(b";")[0], 16)  # extensions are ignored
                self.left, self.ended, step = size, size == 0, line + 2 - at
            at += step
        del pending[:at]
        return b"".join(parts)


class Frames:
    """dockerd's multiplexed stream cut into its frames, however the reads split them:
    each feed gives the payloads it completed, neighbours of one stream joined."""

    def __init__(self) -> None:
        self.pending = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self.pending += data
        runs: list[tuple[int, list[bytes]]] = []
        at, end = 0, len(self.pending)
        view = memoryview(self.pending)
        while end - at >= HEADER.size:
            stream, size = HEADER.unpack_from(view, at)
            if end - at - HEADER.size < size:
                break
            payload = bytes(view[at + HEADER.size:at + HEADER.size + size])
            at += HEADER.size + size
            stream = STDERR if stream == STDERR else STDOUT  # stdin's (0) is output too
            if runs and runs[-1][0] == stream:
                runs[-1][1].append(payload)
            else:
                runs.append((stream, [payload]))
        view.release()
        del self.pending[:at]
        return [(stream, b"".join(parts)) for stream, parts in runs]
