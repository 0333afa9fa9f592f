"""The host runtime's spawner, daemon side: keeps the spawner child (the compiled shim's
`--serve`, or shim.py) that forks a shim per attempt, and watches shims with pidfds.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from noduslocal.daemon.coarse_timer import CoarseTimer
from noduslocal.daemon.runtime import compiled_shim, shim
from noduslocal.daemon.runtime.attempt_dir import has_exit, inspect
from noduslocal.daemon.runtime.base import Alive, AttemptState, Vanished

log = logging.getLogger(__name__)
SPAWNER_WAIT = 10.0  # seconds a launch waits for a spawner that is (re)starting
REUSE_CHECK = 1.0  # seconds after a watch begins: was its shim's pid another's by then?


class SpawnError(RuntimeError):
    pass


def settled(directory: Path) -> AttemptState:
    """The verdict on an attempt whose shim has exited: a lock still held would be a shim
    that is not ours any more, so Alive reads as Vanished here."""
    try:
        state = inspect(directory)
    except Exception:
        log.exception("reading attempt %s failed", directory)
        return Vanished()
    return Vanished() if isinstance(state, Alive) else state


class Spawner:
    def __init__(self, compiled: Path | None = None, max_log_bytes: int = shim.MAX_LOG) -> None:
        """`compiled`: the compiled shim (compiled_shim.py), whose `--serve` spawner forks
        one per attempt; None: the Python spawner (shim.py) forks the Python shim.
        `max_log_bytes`: each log's cap in the attempts launched from now on (0: none)."""
        self.compiled = compiled
        self.max_log_bytes = max_log_bytes
        self._proc: asyncio.subprocess.Process | None = None
        self._alive = asyncio.Event()
        self._replies: dict[int, asyncio.Future[int]] = {}
        self._ids = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None
        self._closing = False
        self.boot_id = shim.boot_id()
        self._reuse_checks = CoarseTimer(REUSE_CHECK)  # see watch()

    async def start(self) -> None:
        command = ([str(self.compiled), "--serve"] if self.compiled is not None
                   else [sys.executable, "-I", "-S", shim.__file__])
        self._proc = await asyncio.create_subprocess_exec(
            *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        self._reader = asyncio.create_task(self._read_replies(self._proc), name="spawner")
        self._alive.set()

    async def close(self) -> None:
        self._closing = True
        self._alive.clear()
        self._reuse_checks.close()
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
        # The spawner died. Nothing more may be sent to it, and whoever waits for a reply
        # must find out from the attempt directory what became of the attempt.
        self._alive.clear()
        if self._proc is proc:
            self._proc = None
        for future in self._replies.values():
            if not future.done():
                future.set_exception(SpawnError("the spawner exited"))
        self._replies.clear()
        if self._closing:
            return
        log.error("spawner exited with %s; starting a new one", await proc.wait())
        while not self._closing:
            try:
                await self.start()
                return
            except OSError:
                log.exception("starting the spawner failed; trying again in 1 s")
                await asyncio.sleep(1)

    async def launch(self, request: dict[str, Any]) -> int:
        """Start a shim for one attempt; returns the shim's pid."""
        if not self._alive.is_set():  # a wait_for on every launch cost the map's tasks
            try:
                await asyncio.wait_for(self._alive.wait(), SPAWNER_WAIT)
            except TimeoutError:
                raise SpawnError("no spawner is running") from None
        proc = self._proc
        if proc is None or proc.stdin is None or proc.stdin.is_closing():
            raise SpawnError("no spawner is running")
        req_id = next(self._ids)
        request = {"max_log": self.max_log_bytes, **request}
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._replies[req_id] = future
        try:
            proc.stdin.write(
                compiled_shim.encode_request({**request, "boot_id": self.boot_id}, req_id)
                if self.compiled is not None
                else json.dumps({**request, "id": req_id}).encode() + b"\n")
            await proc.stdin.drain()
        except (ConnectionError, BrokenPipeError) as exc:
            self._replies.pop(req_id, None)
            raise SpawnError(f"the spawner went away: {exc}") from None
        return await future

    def watch(self, directory: Path, shim_pid: int,
              pidfd: int = -1) -> asyncio.Future[AttemptState]:
        """A future that resolves with the attempt's state once its shim has exited.
        `pidfd`: the shim's, opened already (the watch closes it)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[AttemptState] = loop.create_future()
        if pidfd < 0:
            try:
                pidfd = os.pidfd_open(shim_pid) if shim_pid > 0 else -1
            except ProcessLookupError:
                pidfd = -1
        if pidfd < 0:
            done.set_result(settled(directory))
            return done

        def on_exit() -> None:  # once: either removes the other's way to call it
            loop.remove_reader(pidfd)
            os.close(pidfd)
            self._reuse_checks.cancel(check)
            if not done.done():
                done.set_result(settled(directory))

        def if_reused() -> None:
            # The shim records its exit before it exits: a record with the pidfd still
            # quiet means the shim had gone before the pidfd was opened, and the pid is
            # another process's now. Looked at once, a second or two on, not at every
            # launch (a stat of the directory the shim is writing in, 4 % of the loop in a
            # map of `true`), by a timer shared with every other watch: a shim that ended
            # that early was a short task anyway.
            if has_exit(directory):
                on_exit()

        check = self._reuse_checks.add(if_reused)
        loop.add_reader(pidfd, on_exit)
        return done
