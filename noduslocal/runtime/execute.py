"""`job exec` for host-process jobs: a command run to completion beside a running job, with
the job's environment (secrets masked in what comes back), in its workdir, as its owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from typing import Any

from noduslocal import errors
from noduslocal.runtime.shim import ENV, Masker

OUTPUT_LIMIT = 16 * 1024 * 1024  # bytes of stdout and of stderr sent back


@dataclass(frozen=True)
class ExecResult:
    returncode: int
    stdout: str
    stderr: str
    truncated: bool

    def to_wire(self) -> dict[str, Any]:
        return {"kind": "Process", "returncode": self.returncode, "stdout": self.stdout,
                "stderr": self.stderr, "truncated": self.truncated}


async def run_in_job(launch: dict[str, Any], command: list[str], timeout: float) -> ExecResult:
    """`launch` is the job's launch request (layout.launch_request): env, cwd, identity."""
    argv, kwargs = list(command), {}
    cwd: str | None = launch["cwd"]
    if launch.get("uid") is not None and launch["uid"] != os.getuid():
        # As in the shim: drop to the owner in the child, then enter the workdir and search
        # PATH with the owner's rights.
        argv = [ENV, "--chdir", launch["cwd"], "--", *command]
        kwargs = {"user": launch["uid"], "group": launch["gid"],
                  "extra_groups": launch.get("groups") or [launch["gid"]]}
        cwd = None
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, env=launch["env"], cwd=cwd, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, **kwargs)
    except OSError as exc:
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        return ExecResult(code, "", f"noduslocal: cannot execute {command[0]!r}: "
                                    f"{exc.strerror}\n", False)
    mask = [v.encode() for v in launch.get("mask", ())]
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
