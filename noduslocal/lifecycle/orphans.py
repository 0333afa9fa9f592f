"""Job directories the database does not know, as after a torn write that lost its newest
transactions: whatever still runs in them is killed (nobody could see, cancel or adopt it
into a job), late shims are told to stand down, and each is reported to admins.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from noduslocal.layout import JobLayout
from noduslocal.runtime import shim
from noduslocal.runtime.attempts import kill_leftovers, read_pid

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Orphan:
    job_id: int
    path: str
    killed: int  # shims that were still running, and were killed with their jobs

    def to_wire(self) -> dict[str, object]:
        return {"job_id": self.job_id, "path": self.path, "killed": self.killed}


def _stop_attempt(directory: Path) -> bool:
    """Kill a live shim of the attempt and what it runs; True when one was alive."""
    try:
        fd = os.open(directory / shim.LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid = read_pid(directory)
            if pid is None or pid.get("boot_id") != shim.boot_id():
                return False
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid["shim_pid"], signal.SIGKILL)
            kill_leftovers(directory, pid["shim_pid"], pid.get("boot_id"))
            return True
        if not (directory / shim.PID).exists():
            (directory / shim.ABANDONED).touch()  # a shim not started yet never runs
        return False
    finally:
        os.close(fd)


def find_orphans(layout: JobLayout, known: int) -> list[Orphan]:
    """Job directories above `known`, the highest job id in the database."""
    found = []
    for job_id in layout.job_ids_on_disk():
        if job_id <= known:
            continue
        directory = layout.job_dir(job_id)
        attempts = sorted(directory.glob("attempt-*"))
        ranks = [p for a in attempts for p in (a, *a.glob("rank-*"), *a.glob("index-*"))
                 if p.is_dir()]
        killed = sum(_stop_attempt(p) for p in ranks)
        log.warning("job directory %s is not in the database (a lost write?); %s; it is "
                    "kept for an admin to look at", directory,
                    f"{killed} running attempts were killed" if killed else "nothing ran")
        found.append(Orphan(job_id, str(directory), killed))
    return found
