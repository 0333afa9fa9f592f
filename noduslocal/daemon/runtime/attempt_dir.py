"""The reader of the attempt directory the shim (shim.py) writes: the exit it recorded, the
pids it named, the verdict after a restart (exited, alive, vanished, never started), and the
clean-up of processes a vanished attempt left behind. Any runtime that runs the shim uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import math
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from noduslocal.daemon.files.plain import read_plain
from noduslocal.daemon.runtime import shim
from noduslocal.daemon.runtime.base import Alive, AttemptState, Exited, NeverStarted, Vanished

RECORD_MAX = 64 * 1024  # bytes of a pid or exit record read: a shim writes a few hundred


def _read_json(path: Path | str, owner: int | None = None) -> dict[str, Any] | None:
    """The file's object, or None when it is absent, empty or torn (a crash can leave a
    renamed file without its data): all mean "not recorded". Read as files/plain.py
    does: a cluster's shim writes these as the job's owner. With `owner`, only a record
    that uid owns counts."""
    try:
        data = json.loads(read_plain(path, RECORD_MAX, owner))
    except (OSError, ValueError):  # absent, a link or FIFO, or unreadable (ESTALE, EIO)
        return None
    return data if isinstance(data, dict) else None


def _number(value: Any, kind: type) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool) and (
        kind is int or math.isfinite(value))


def read_exit(directory: Path) -> Exited | None:
    """The rank's exit record; None when there is none, and when it is not one a shim wrote
    (a cluster job's owner can write their node directory): the end is then Slurm's word."""
    data = _read_json(os.path.join(directory, shim.EXIT))  # no Path made: every task's end
    if data is None:
        return None
    code, sig = data.get("exit_code"), data.get("signal")
    started, ended = data.get("started_at"), data.get("ended_at")
    if not (_number(code, int) and (sig is None or _number(sig, int))
            and _number(started, (int, float)) and _number(ended, (int, float))):
        return None
    # As docker's OOMKilled is read (docker/end.py): the OOM killer took a process of the
    # rank's cgroup, and the job did not exit 0 (one that outlived the kill of a child did).
    oom = bool(data.get("oom_killed")) and code != 0
    return Exited(code, sig, float(started), float(ended), oom_killed=oom,
                  cgroups_empty=data.get("cgroups_empty") is True)


def read_pid(directory: Path) -> dict[str, Any] | None:
    """The pids a shim of this box named, which the daemon signals and kills by: only from
    a record the daemon's own user wrote (this box's shims run as it), never one the job's
    owner could have written (a cluster's shim, on another machine)."""
    return _read_json(directory / shim.PID, os.geteuid())

NO_ROOM_DETAIL = "no room on the data dir's disk to record the job, so it was not started"


def has_exit(directory: Path) -> bool:
    try:
        return os.stat(directory / shim.EXIT).st_size > 0
    except FileNotFoundError:
        return False


@contextlib.contextmanager
def locked(directory: Path, make: bool = True) -> Iterator[bool]:
    """Both locks a shim may hold on its attempt: the directory (the compiled shim's) and
    the LOCK file in it (the Python shim's, made here if missing so that one starting now
    waits for us; `make` False: a look that leaves the directory as it is, where a missing
    LOCK is one no shim holds). True inside when both were taken: no shim lives there, and
    none starts there until the block ends (it then finds what the block left, such as
    ABANDONED); False when a shim holds one. FileNotFoundError: no such directory."""
    fds = []
    try:
        fds.append(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                           | os.O_CLOEXEC))
        try:
            fds.append(os.open(directory / shim.LOCK,
                               os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
                               | (os.O_CREAT if make else 0), 0o600))
        except FileNotFoundError:
            if make:
                raise
        try:
            for fd in fds:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        for fd in fds:
            os.close(fd)


def inspect(directory: Path) -> AttemptState:
    """What became of an attempt, decided under the attempt's locks so a shim that is
    starting right now cannot slip between the look and the verdict."""
    if (exited := read_exit(directory)) is not None:
        return exited  # written last, by a shim that is done with the job
    try:
        with locked(directory) as free:
            if not free:
                pid = read_pid(directory)
                # The shim holds its lock from before it starts the job to its own exit.
                return Alive(pid["shim_pid"]) if pid else Alive(0)
            if (exited := read_exit(directory)) is not None:
                return exited
            if read_pid(directory) is not None:
                return Vanished()
            (directory / shim.ABANDONED).touch()
            if (directory / shim.NO_ROOM).exists():
                return NeverStarted(NO_ROOM_DETAIL, certain=True)
            return NeverStarted()
    except (FileNotFoundError, NotADirectoryError):
        return NeverStarted()  # the directory was never made: nothing can run there


def may_still_start(directory: Path) -> bool:
    """A shim may yet run a job in this attempt directory, and into the rank's cgroups: a
    shim holds its lock, or one let go by a daemon that died before the shim took the lock
    is still on its way (nothing recorded, nothing given up). False once the attempt ended
    (its exit record), was given up (ABANDONED), found no room to start (NO_ROOM), never
    had a directory, or lost its shim (its pid record with the lock free). Reads only, and
    makes nothing there: a made-ahead first attempt must stay empty to be taken as it is;
    recovery decides what it was. OSError where the disk fails the look."""
    try:
        if (has_exit(directory) or (directory / shim.ABANDONED).exists()
                or (directory / shim.NO_ROOM).exists()):
            return False
        with locked(directory, make=False) as free:
            return not free or read_pid(directory) is None
    except (FileNotFoundError, NotADirectoryError):
        return False


def disarm(directory: Path) -> bool:
    """Under the attempt's locks, the go mark (shim.GO_MARK) taken off its directory: a
    shim the last daemon let go that takes the lock only after this runs nothing there
    (its request names a mark the directory no longer bears), and a new start marks it
    afresh. True when done; False when a shim holds the lock (it started). Makes nothing
    there. FileNotFoundError: no such directory; OSError: the mark could not be removed."""
    with locked(directory, make=False) as free:
        if free:
            try:
                os.removexattr(directory, shim.GO_MARK)
            except OSError as exc:
                if exc.errno not in (errno.ENODATA, errno.EOPNOTSUPP):
                    raise  # never marked, or a file system without attributes: no mark
        return free


def kill_lock_holders(directory: Path) -> list[int]:
    """SIGKILL the processes holding the attempt's locks (the directory's flock, and its
    LOCK file's), found in /proc/locks by device and inode; their pids. For a shim known to
    have started nothing yet: one past its lock has reserved its records before it forks
    the job, so one that holds the lock with none reserved has run nothing."""
    inodes = set()
    for path in (directory, directory / shim.LOCK):
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(path)
            inodes.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    killed = []
    with open("/proc/locks") as table:
        for line in table:
            fields = line.split()
            # "N: FLOCK ADVISORY WRITE PID MAJ:MIN:INODE 0 EOF"; "N: -> ..." is a waiter.
            if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] in inodes:
                pid = int(fields[4])
                if pid != os.getpid():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
    return killed


def kill_leftovers(directory: Path, shim_pid: int | None, boot: str | None) -> None:
    """SIGKILL whatever a vanished attempt left running, so a retry never runs beside it:
    its process group (if the leader's pid still names our job) and every process still
    in the shim's session. Nothing is killed after a reboot, or when a pid was reused."""
    if boot != shim.boot_id():
        return
    pid = read_pid(directory)
    if pid is not None and shim.start_ticks(pid["pgid"]) == pid.get("start_ticks"):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid["pgid"], signal.SIGKILL)
    if shim_pid:
        kill_session(shim_pid)


def kill_session(sid: int) -> None:
    """SIGKILL every process of session `sid`, whose leader (a shim) is dead. While any
    process of the session lives, the kernel does not hand its id to a new process; so a
    live process with that pid means our session is empty and the id is someone else's.
    (Our shim may still be there as a zombie its parent has not reaped.)"""
    leader = _stat_fields(sid)
    if leader is not None and leader[0] != b"Z":
        return
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and entry.name != str(sid):
            fields = _stat_fields(int(entry.name))
            if fields is not None and int(fields[3]) == sid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(entry.name), signal.SIGKILL)


def _stat_fields(pid: int) -> list[bytes] | None:
    """/proc/PID/stat after the command name: state, ppid, pgrp, session, ..."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat = file.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()


def inspect_settled(directory: Path) -> AttemptState:
    """inspect(), waiting out a shim that holds its lock but has not written pid.json yet
    (it does so right after starting the job). Blocking: up to 5 s."""
    state = inspect(directory)
    for _ in range(500):
        if not _unsettled(state):
            break
        time.sleep(0.01)
        state = inspect(directory)
    return state


async def settled_inspect(directory: Path) -> AttemptState:
    """inspect_settled() from the loop: at once where the first look settles it (nearly
    always), the wait in a thread where it does not."""
    state = inspect(directory)
    if _unsettled(state):
        state = await asyncio.to_thread(inspect_settled, directory)
    return state


def _unsettled(state: AttemptState) -> bool:
    return isinstance(state, Alive) and state.shim_pid == 0
