"""A container's output, copied from dockerd's log stream into the attempt directory as
the shim writes a host job's: stdout and stderr in order in output.log, stderr alone in
stderr.log, secrets masked, each capped as the shim caps it. Runs in a thread per container.
"""

from __future__ import annotations

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
STDERR = 2


def pump_logs(new_client: Callable[[], docker.DockerClient], container_id: str,
              directory: Path, mask: list[bytes], closed: threading.Event,
              cap: int = MAX_LOG) -> None:
    """Copy the container's whole log (from its start: a restarted pump rewrites the
    files) until the container ends or `closed` is set; each file at most `cap` bytes."""
    maskers = {1: Masker(mask), STDERR: Masker(mask)}
    client = None
    try:
        client = new_client()
        api = client.api
        url = f"{api.base_url}/v{api.api_version}/containers/{container_id}/logs"
        # No read timeout: a quiet job may print nothing for hours.
        response = api.get(url, params={"follow": 1, "stdout": 1, "stderr": 1},
                           stream=True, timeout=None)
        response.raise_for_status()
    except Exception:
        log.exception("reading the log of container %s failed; keeping what was copied",
                      container_id[:12])
        if client is not None:
            client.close()
        return
    # Truncated only now that the whole log is coming again.
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    combined = CappedLog(os.open(directory / OUTPUT_LOG, flags, 0o640), cap)
    errors = CappedLog(os.open(directory / STDERR_LOG, flags, 0o640), cap)
    try:
        while not closed.is_set():
            header = _read_exact(response.raw, HEADER.size)
            if header is None:
                break
            stream, size = HEADER.unpack(header)
            data = _read_exact(response.raw, size)
            if data is None:
                break
            _write(combined, errors, stream, maskers[stream if stream == STDERR else 1]
                   .feed(data))
    except Exception:
        log.exception("copying the log of container %s failed", container_id[:12])
    finally:
        for stream, masker in maskers.items():
            _write(combined, errors, stream, masker.feed(b"", final=True))
        combined.close()
        errors.close()
        client.close()


def _write(combined: CappedLog, errors: CappedLog, stream: int, chunk: bytes) -> None:
    combined.write(chunk)
    if stream == STDERR:
        errors.write(chunk)


def _read_exact(raw: Any, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        more = raw.read(size - len(data))
        if not more:
            return None
        data += more
    return data
