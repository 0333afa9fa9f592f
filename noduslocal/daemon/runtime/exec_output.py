"""An exec's output, for every runtime that runs one as a process here (`job exec`): read as
it comes and capped, secrets masked, the process group killed past the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterable

from noduslocal.daemon.runtime.base import OUTPUT_LIMIT, ExecResult
from noduslocal.daemon.runtime.shim import Masker
from noduslocal.domain import errors


async def supervise(proc: asyncio.subprocess.Process, secrets: Iterable[str],
                    timeout: float) -> ExecResult:
    """The exec's end and output (PIPEs of a process started in a session of its own);
    past `timeout` its group is killed and WaitTimeout raised."""
    mask = [v.encode() for v in secrets]
    # Read as it comes and keep at most the limit (plus enough to mask a secret that
    # crosses it): a command that prints without end must not fill the daemon's memory.
    keep = OUTPUT_LIMIT + max((len(m) for m in mask), default=0)
    assert proc.stdout is not None and proc.stderr is not None
    try:
        (out, out_more), (err, err_more), _ = await asyncio.wait_for(asyncio.gather(
            _read_capped(proc.stdout, keep), _read_capped(proc.stderr, keep), proc.wait()),
            timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise errors.WaitTimeout(f"the command did not end within {timeout:g}s; "
                                 "it was killed") from None
    truncated = out_more or err_more or len(out) > OUTPUT_LIMIT or len(err) > OUTPUT_LIMIT
    return ExecResult(
        proc.returncode if proc.returncode is not None else -1,
        Masker(mask).feed(out, final=True)[:OUTPUT_LIMIT].decode("utf-8", "replace"),
        Masker(mask).feed(err, final=True)[:OUTPUT_LIMIT].decode("utf-8", "replace"),
        truncated)


async def _read_capped(stream: asyncio.StreamReader, keep: int) -> tuple[bytes, bool]:
    """Up to `keep` bytes of a stream, reading (and dropping) the rest to its end."""
    data, more = bytearray(), False
    while chunk := await stream.read(1 << 16):
        room = keep - len(data)
        if room > 0:
            data += chunk[:room]
        more = more or len(chunk) > room
    return bytes(data), more
