"""The data dir's free space, read every few seconds. Below `disk_reserve` new work is
refused, naming the disk and what fills it; below half of it the running job that grew most
on that disk since the last look is stopped (DiskFull), so SQLite keeps room to record every
end; a job that did not grow is never stopped for what another left there. What is free
above the reserve is what jobs' `disk` may reserve, and a job whose directory grows past
its `disk` is stopped (DiskExceeded); trees are walked on a thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.jobs.attempt import Attempt, AttemptLife, Board
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.scheduler.capacity import Capacity
from noduslocal.domain import errors
from noduslocal.domain.states import Reason
from noduslocal.domain.units import fmt_bytes

log = logging.getLogger(__name__)

SCAN_ENTRIES = 200_000  # files looked at per scan of the running jobs' workspaces
SCAN_AGE = 10.0  # seconds a scan of what fills the disk is reused while it stays low
QUOTA_EVERY = 5  # readings between walks of the directories of jobs that have a `disk`


@dataclass
class DiskReading:
    path: Path
    free: int
    total: int
    low: bool = False
    critical: bool = False
    # Running jobs' directories on that disk, biggest first: (job name, owner, bytes).
    consumers: list[tuple[str, str, int]] = field(default_factory=list)

    def describe(self) -> str:
        top = ", ".join(f"job {name!r} of {owner} ({fmt_bytes(size)})"
                        for name, owner, size in self.consumers[:3])
        return (f"the disk of {self.path} has {fmt_bytes(self.free)} free of "
                f"{fmt_bytes(self.total)}, below its reserve"
                + (f"; the biggest running jobs there: {top}" if top else ""))


def allocated(top: Path, budget: int) -> tuple[int, int]:
    """Bytes the tree at `top` takes on disk (not its apparent size), walked without
    following links nor mounts (a workspace's overlay: its upper is counted where it lies);
    at most `budget` entries. Returns (bytes, entries looked at)."""
    try:
        device = os.stat(top).st_dev
    except OSError:
        return 0, 0
    total, seen, stack = 0, 0, [str(top)]
    while stack and seen < budget:
        try:
            with os.scandir(stack.pop()) as entries:
                for entry in entries:
                    seen += 1
                    try:
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if info.st_dev != device:
                        continue
                    total += info.st_blocks * 512
                    if stat.S_ISDIR(info.st_mode):
                        stack.append(entry.path)
        except OSError:
            continue
    return total, seen


class DiskWatch:
    def __init__(self, data_dir: Path, reserve: int, poll: float, layout: JobLayout,
                 board: Board, stopper: Stopper, capacity: Capacity,
                 commits_stalled: Callable[[], float | None],
                 on_room: Callable[[], None] = lambda: None) -> None:
        """`capacity.disk_free` follows the jobs' disk; `on_room()` when it grew (jobs
        waiting for disk may start)."""
        self.data_dir = data_dir
        self.reserve = reserve
        self.poll = poll
        self.layout = layout
        self.board = board
        self.stopper = stopper
        self.capacity = capacity
        self._commits_stalled = commits_stalled
        self._on_room = on_room
        self._readings = 0
        # Nothing known until the first check (when the lifecycle starts): not low.
        self.reading = DiskReading(data_dir, 0, 0)
        self._scanned_at = 0.0
        self._last_sizes: dict[int, int] = {}
        self._growth: dict[int, int] = {}

    def _paths(self) -> list[Path]:
        """The data dir, and the jobs' directory when it is a disk of its own: filling
        that cannot starve the database, so nothing is stopped for it, but new work is
        still refused while it is low."""
        paths = [self.data_dir]
        with contextlib.suppress(FileNotFoundError):
            if os.stat(self.layout.jobs_dir).st_dev != os.stat(self.data_dir).st_dev:
                paths.append(self.layout.jobs_dir)
        return paths

    def _read(self) -> tuple[DiskReading, int]:
        """The fullest of the disks watched (critical only for the database's own), and
        what the jobs' own disk has free above the reserve."""
        paths = self._paths()
        readings = []
        for path in paths:
            st = os.statvfs(path)
            free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
            readings.append(DiskReading(path, free, total, free < self.reserve,
                                        free < self.reserve // 2 and len(paths) == 1))
        return min(readings, key=lambda r: r.free), readings[-1].free - self.reserve

    def room(self) -> int:
        """Bytes that may still be written before the fullest disk reaches its reserve,
        read now (an output's copy asks, on a thread of its own)."""
        return max(0, self._read()[0].free - self.reserve)

    def require_room(self, what: str) -> None:
        """Refuse new work (`what`: "new jobs") while the disk is below its reserve."""
        if self.reading.low:
            raise errors.ResourceExhausted(f"{what} are refused for now: "
                                           f"{self.reading.describe()} (disk_reserve)")

    def problems(self) -> list[str]:
        """What makes the daemon degraded, for /v1/health."""
        found = []
        if self.reading.low:
            found.append(self.reading.describe())
        stalled = self._commits_stalled()
        if stalled is not None:
            found.append(f"the database cannot commit (its disk is full) for "
                         f"{time.monotonic() - stalled:.0f}s; ends are kept and retried")
        return found

    async def first_reading(self) -> None:
        """Read the disk now, before the API serves, so the first create is judged on a
        reading; follow() reads it every `poll` seconds after."""
        try:
            await self.check()
        except OSError as exc:  # no data dir yet (a lifecycle without a daemon): next time
            log.info("the disk could not be read yet: %s", exc)

    async def follow(self) -> None:
        while True:
            await asyncio.sleep(self.poll)
            try:
                await self.check()
            except Exception:
                log.exception("reading the disk's free space failed")

    async def check(self) -> None:
        reading, jobs_free = await asyncio.to_thread(self._read)
        grew = self.capacity.disk_free is not None and jobs_free > self.capacity.disk_free
        self.capacity.disk_free = jobs_free
        if grew:
            self._on_room()
        self._readings += 1
        if self._readings % QUOTA_EVERY == 0:
            with_disk = [a for a in self._running() if a.job.spec.disk]
            for attempt, size in await asyncio.to_thread(self._over_quota, with_disk):
                log.warning("stopping job %s (%s): its directory takes %s, past its disk "
                            "of %s", attempt.job.name, attempt.job.owner, fmt_bytes(size),
                            fmt_bytes(attempt.job.spec.disk or 0))
                self.stopper.stop_soon(attempt, Reason.DISK_EXCEEDED)
        was_low = self.reading.low
        if reading.low:
            if not was_low:
                self._last_sizes = {}
            # A low episode the daemon saw begin: each job is judged by its size at the
            # first look. One it found at its start (a restart on a full disk, the job that
            # filled it perhaps gone): by what each grows from then on.
            first = not was_low and self._readings > 1
            if not was_low or time.monotonic() - self._scanned_at > SCAN_AGE or \
                    reading.critical:
                await asyncio.to_thread(self._scan, reading, self._running(), first)
            else:
                reading.consumers = self.reading.consumers
        self.reading = reading
        if reading.low and not was_low:
            log.warning("%s: new work is refused until it has room", reading.describe())
        elif was_low and not reading.low:
            log.info("the disk of %s has room again (%s free)", self.data_dir,
                     fmt_bytes(reading.free))
        if reading.critical:
            self._stop_the_biggest_writer(reading)

    def _sizes(self, attempts: list[Attempt]) -> dict[int, int]:
        """What each attempt's job directory takes, by job id, within one budget of entries
        for all (on a thread: each walk is bounded, but a tree may be large)."""
        sizes, budget = {}, SCAN_ENTRIES
        for attempt in attempts:
            if budget <= 0:
                break
            sizes[attempt.job.id], seen = allocated(self.layout.job_dir(attempt.job.id),
                                                    budget)
            budget -= seen
        return sizes

    def _over_quota(self, attempts: list[Attempt]) -> list[tuple[Attempt, int]]:
        """Those of the attempts whose job directory takes more than its `disk`."""
        sizes = self._sizes(attempts)
        return [(a, sizes[a.job.id]) for a in attempts
                if sizes.get(a.job.id, 0) > (a.job.spec.disk or 0)]

    def _running(self) -> list[Attempt]:
        return [a for a in self.board.active.values() if a.life is AttemptLife.RUNNING]

    def _scan(self, reading: DiskReading, running: list[Attempt], first: bool) -> None:
        """What the running jobs' directories take (on a thread, from a list the loop
        made), biggest first; and what each grew since the last scan (at the `first` look,
        its size; one seen for the first time otherwise is judged from its next scan on)."""
        sizes = self._sizes(running)
        reading.consumers = sorted(((a.job.name, a.job.owner, sizes[a.job.id])
                                    for a in running if a.job.id in sizes),
                                   key=lambda item: -item[2])
        self._growth = {i: size - self._last_sizes.get(i, 0 if first else size)
                        for i, size in sizes.items()}
        self._last_sizes = sizes
        self._scanned_at = time.monotonic()

    def _stop_the_biggest_writer(self, reading: DiskReading) -> None:
        running = {a.job.id: a for a in self._running()}
        # Stopping a job that does not grow frees nothing: the disk waits for its admin.
        growth = {i: g for i, g in self._growth.items() if i in running and g > 0}
        if not growth:
            return
        job_id = max(growth, key=lambda i: (growth[i], self._last_sizes.get(i, 0)))
        attempt = running[job_id]
        log.warning("stopping job %s (%s): %s free on the disk of %s, below half its "
                    "reserve, and it grew most there", attempt.job.name, attempt.job.owner,
                    fmt_bytes(reading.free), self.data_dir)
        self.stopper.stop_soon(attempt, Reason.DISK_FULL)
