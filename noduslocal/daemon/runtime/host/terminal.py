"""`job exec -it` for host-process jobs: the command started beside a rank as `job exec`
starts one (its namespace, the owner, the job's environment), on a new pseudo-terminal
that is its controlling terminal, so Ctrl-C and the window's size reach it as in a shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import os
import shutil
import signal
import struct
import termios
from pathlib import Path
from typing import Any

from noduslocal.daemon.runtime.host.execute import (
    TOKEN_ENV,
    exec_argv,
    forget_record,
    open_record,
)
from noduslocal.domain import errors

READ = 64 * 1024


def set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


class PtyTerminal:
    def __init__(self, proc: asyncio.subprocess.Process, master: int,
                 record: Path | None) -> None:
        self.proc = proc
        self.master = master
        self.record = record
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        os.set_blocking(master, False)
        self._loop.add_reader(master, self._readable)
        self._eof = False

    @classmethod
    async def start(cls, launch: dict[str, Any], command: list[str], rows: int, cols: int,
                    records: Path) -> PtyTerminal:
        """LAUNCH: the rank's launch request; RECORDS: where the exec is named while it
        runs (the next daemon kills it should this one die)."""
        argv, cwd, kwargs = exec_argv(launch, command)
        setsid = shutil.which("setsid")
        if setsid is None:
            raise errors.Unsupported("pty", message="pty: setsid (util-linux) is missing on "
                                                    "this host")
        master, slave = os.openpty()
        set_size(slave, rows, cols)
        token, record = open_record(records)
        env = {**launch["env"], TOKEN_ENV: token, "TERM": launch["env"].get("TERM", "xterm")}
        try:
            # setsid --ctty: a session of its own whose controlling terminal is this one,
            # so the line discipline sends Ctrl-C's SIGINT to its foreground group, never
            # to the job.
            proc = await asyncio.create_subprocess_exec(
                setsid, "--ctty", *argv, env=env, cwd=cwd, stdin=slave, stdout=slave,
                stderr=slave, **kwargs)
        except OSError as exc:
            os.close(master)
            forget_record(record)
            raise errors.Conflict(f"cannot start {command[0]!r}: {exc.strerror}") from None
        finally:
            os.close(slave)
        return cls(proc, master, record)

    def _readable(self) -> None:
        try:
            data = os.read(self.master, READ)
        except BlockingIOError:
            return
        except OSError as exc:  # EIO: every process holding the other end has gone
            if exc.errno != errno.EIO:
                raise
            data = b""
        if not data:
            self._loop.remove_reader(self.master)
            self._eof = True
        self._chunks.put_nowait(data)

    async def read(self) -> bytes:
        if self._eof and self._chunks.empty():
            return b""
        return await self._chunks.get()

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.master, view):]
            except BlockingIOError:
                await asyncio.sleep(0.01)  # its input buffer is full: it reads slower
            except OSError:
                return  # it has ended

    async def resize(self, rows: int, cols: int) -> None:
        with contextlib.suppress(OSError):
            set_size(self.master, rows, cols)  # the kernel sends its group SIGWINCH

    async def wait(self) -> int:
        code = await self.proc.wait()
        return 128 - code if code < 0 else code

    async def close(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGHUP)  # as a terminal that goes away
            try:
                await asyncio.wait_for(self.proc.wait(), 2)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                await self.proc.wait()
        if not self._eof:
            self._loop.remove_reader(self.master)
            self._eof = True
        with contextlib.suppress(OSError):
            os.close(self.master)
        forget_record(self.record)
