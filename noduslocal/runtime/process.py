"""The host-process runtime, daemon side: keeps the spawner child (shim.py), launches
attempts through it, watches shims with pidfds, reads what a shim left in its attempt
directory, and signals a job's process group.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import itertools
import json
import logging
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noduslocal.runtime import shim

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Exited:
    exit_code: int
    signal: int | None
    started_at: float
    ended_at: float


@dataclass(frozen=True)
class Alive:
    shim_pid: int


class Vanished:
    """The job ran, and its shim is gone without recording an exit status."""


class NeverStarted:
    """No shim ran this attempt, and none ever will (we left an `abandoned` marker)."""


AttemptState = Exited | Alive | Vanished | NeverStarted


class SpawnError(RuntimeError):
    pass


def read_exit(directory: Path) -> Exited | None:
    """The recorded end, or None while exit.json is absent or still empty."""
    try:
        text = (directory / shim.EXIT).read_bytes()
    except FileNotFoundError:
        return None
    if not text:
        return None
    data = json.loads(text)
    return Exited(data["exit_code"], data.get("signal"), data["started_at"], data["ended_at"])


def has_exit(directory: Path) -> bool:
    try:
        return os.stat(directory / shim.EXIT).st_size > 0
    except FileNotFoundError:
        return False


def read_pid(directory: Path) -> dict[str, Any] | None:
    try:
        return json.loads((directory / shim.PID).read_text())
    except FileNotFoundError:
        return None


def inspect(directory: Path) -> AttemptState:
    """What became of an attempt, decided under the attempt's lock so a shim that is
    starting right now cannot slip between the look and the verdict."""
    if (exited := read_exit(directory)) is not None:
        return exited  # written last, by a shim that is done with the job
    try:
        fd = os.open(directory / shim.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        return NeverStarted()  # the directory was never made: nothing can run there
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = read_pid(directory)
            # The shim holds the lock from before it forks the job to its own exit.
            return Alive(pid["shim_pid"]) if pid else Alive(0)
        if (exited := read_exit(directory)) is not None:
            return exited
        if (pid := read_pid(directory)) is not None:
            kill_orphans(pid)
            return Vanished()
        (directory / shim.ABANDONED).touch()
        return NeverStarted()
    finally:
        os.close(fd)


def kill_orphans(pid: dict[str, Any]) -> None:
    """SIGKILL what is left of a vanished attempt's process group, so a retry never runs
    beside it. Only the same boot's group, and only if its leader's pid was not reused."""
    if pid.get("boot_id") != shim.boot_id():
        return
    ticks = shim.start_ticks(pid["pgid"])
    if ticks is not None and ticks != pid.get("start_ticks"):
        return  # the leader's pid now names another process, so our group is gone
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid["pgid"], signal.SIGKILL)


class ProcessRuntime:
    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._replies: dict[int, asyncio.Future[int]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", shim.__file__,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        self._reader = asyncio.create_task(self._read_replies(self._proc), name="spawner")

    async def close(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        assert proc.stdin is not None
        proc.stdin.close()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), 2)
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader

    async def _read_replies(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            reply = json.loads(line)
            future = self._replies.pop(reply["id"], None)
            if future is None or future.done():
                continue
            if "error" in reply:
                future.set_exception(SpawnError(reply["error"]))
            else:
                future.set_result(reply["pid"])
        # The spawner died: whoever waits for it must find out what became of the attempt.
        for future in self._replies.values():
            if not future.done():
                future.set_exception(SpawnError("the spawner exited"))
        self._replies.clear()
        if self._proc is proc:
            log.error("spawner exited with %s; starting a new one", await proc.wait())
            await self.start()

    async def launch(self, request: dict[str, Any]) -> int:
        """Fork a shim for one attempt; returns the shim's pid."""
        if self._proc is None or self._proc.stdin is None:
            raise SpawnError("the runtime is not running")
        req_id = next(self._ids)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._replies[req_id] = future
        self._proc.stdin.write(json.dumps({**request, "id": req_id}).encode() + b"\n")
        return await future

    def watch(self, directory: Path, shim_pid: int) -> asyncio.Future[AttemptState]:
        """A future that resolves with the attempt's state once its shim has exited."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[AttemptState] = loop.create_future()
        try:
            pidfd = os.pidfd_open(shim_pid) if shim_pid > 0 else -1
        except ProcessLookupError:
            pidfd = -1
        if pidfd < 0:
            done.set_result(_settled(directory))
            return done
        # Opened before we look for an exit: a shim records it before exiting, so none
        # recorded means the pid is still our shim.
        if has_exit(directory):
            os.close(pidfd)
            done.set_result(_settled(directory))
            return done

        def on_exit() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            if not done.done():
                done.set_result(_settled(directory))

        loop.add_reader(pidfd, on_exit)
        return done

    async def signal_group(self, directory: Path, sig: int) -> bool:
        """Signal the job's process group; False when it has already gone."""
        for _ in range(200):  # the shim writes pid.json before the job runs
            pid = read_pid(directory)
            if pid is not None:
                break
            if has_exit(directory):
                return False
            await asyncio.sleep(0.01)
        else:
            return False
        try:
            os.killpg(pid["pgid"], sig)
        except ProcessLookupError:
            return False
        except PermissionError as exc:
            if exc.errno == errno.EPERM:
                log.error("not allowed to signal process group %s", pid["pgid"])
            return False
        return True


def _settled(directory: Path) -> AttemptState:
    state = inspect(directory)
    return Vanished() if isinstance(state, Alive) else state
