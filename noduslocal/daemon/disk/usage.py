"""Each user's use of the data dir (job directories with their shared source snapshots once,
volumes, blobs), measured every du_every on a thread, and the quota check new work passes
at create. An ended job's directory no longer changes: its size is kept until it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import time
from pathlib import Path

from noduslocal.daemon.accounts import user_name
from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.disk.watch import allocated
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.store import Store
from noduslocal.domain import errors
from noduslocal.domain.jobs import UserUsage
from noduslocal.domain.states import TERMINAL
from noduslocal.domain.units import fmt_bytes

log = logging.getLogger(__name__)
WAKE_EVERY = 5.0  # seconds between looks at whether a measurement is due
REFRESH_EVERY = 5.0  # seconds between measurements one user's `du` may ask for


class DiskUsage:
    def __init__(self, live: LiveSettings, store: Store, layout: JobLayout) -> None:
        self.live = live
        self.store = store
        self.layout = layout
        self.users: dict[int, UserUsage] = {}
        self.measured_at: float | None = None
        self._ended: dict[int, tuple[int, int]] = {}  # job id -> (dir's mtime_ns, bytes)
        self._snapshots: dict[Path, int] = {}  # a snapshot never changes once made: bytes
        self._wanted = asyncio.Event()
        self._running: asyncio.Task[None] | None = None
        self._asked: dict[int, float] = {}  # uid -> when it last had `du` measure (monotonic)

    async def follow(self) -> None:
        while True:
            self._wanted.clear()  # before: a wish made while measuring is kept for after
            tried = time.monotonic()
            if self._running is not None and not self._running.done():
                # Under way for a `du`, begun before the wish: wait for it, then measure.
                await asyncio.wait([self._running])
            try:
                await self.refresh()
            except Exception:
                log.exception("measuring the users' disk use failed")
            while not self._wanted.is_set() and \
                    time.monotonic() - tried < self.live.current.du_every:
                # In short steps, so a reloaded du_every applies at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wanted.wait(),
                                           min(self.live.current.du_every, WAKE_EVERY))

    def refresh_soon(self) -> None:
        """Something was freed (a job removed, a volume deleted, a retention pass): measure
        again now rather than at the next interval, so a quota lifts at once."""
        self._wanted.set()

    async def refresh_for(self, uid: int) -> None:
        """A user's `du`: measured now, at most once per REFRESH_EVERY for each user (a loop
        of `du` does not keep the disk walked); otherwise the last measurement stands."""
        now = time.monotonic()
        if now - self._asked.get(uid, -REFRESH_EVERY) >= REFRESH_EVERY:
            self._asked[uid] = now
            await self.refresh()

    async def refresh(self) -> None:
        """Measure now; a measurement under way is joined, not repeated."""
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._measure())
        await asyncio.shield(self._running)

    async def _measure(self) -> None:
        self.users = await asyncio.to_thread(self._sizes)
        self.measured_at = time.time()

    def _sizes(self) -> dict[int, UserUsage]:
        """On a thread: the rows (apart from the API's reader), then the directories."""
        jobs, volumes, blobs = self.store.read_apart([
            "SELECT id, owner_uid, owner, phase FROM jobs "
            "WHERE collected_at IS NULL AND removed_at IS NULL",
            "SELECT name, owner_uid, owner FROM volumes",
            "SELECT owner_uid, SUM(size) FROM (SELECT j.owner_uid, o.sha256, o.size FROM "
            "outputs o JOIN jobs j ON j.id = o.job_id WHERE o.sha256 != '' UNION "
            "SELECT owner_uid, sha256, size FROM sources) GROUP BY owner_uid"])
        users: dict[int, UserUsage] = {}

        def of(uid: int, name: str) -> UserUsage:
            return users.setdefault(uid, UserUsage(uid, name))

        kept: dict[int, tuple[int, int]] = {}
        for job_id, uid, name, phase in jobs:
            directory = self.layout.job_dir(job_id)
            try:
                mtime = os.stat(directory).st_mtime_ns
            except FileNotFoundError:
                continue
            cached = self._ended.get(job_id)
            if cached is not None and cached[0] == mtime:
                size = cached[1]
            else:
                size, _ = allocated(directory, sys.maxsize)
            if phase in TERMINAL:
                kept[job_id] = (mtime, size)
            usage = of(uid, name)
            usage.jobs += 1
            usage.workspaces += size
        self._ended = kept
        # A job's source, unpacked once per owner and content and shared by their tasks'
        # overlays, counts once among that owner's job directories (their copies did once
        # each): a user's distinct sources are theirs to pay for.
        snapshots: dict[Path, int] = {}
        for uid, path in self.layout.overlays.owned():
            size = self._snapshots.get(path)
            if size is None:
                size = allocated(path, sys.maxsize)[0]
            snapshots[path] = size
            if uid in users:
                users[uid].workspaces += size
            else:
                of(uid, user_name(uid)).workspaces += size
        self._snapshots = snapshots
        for volume, uid, name in volumes:
            of(uid, name).volumes += allocated(self.layout.volume_dir(volume), sys.maxsize)[0]
        for uid, size in blobs:
            if uid in users:
                users[uid].blobs += size
            else:
                of(uid, user_name(uid)).blobs += size
        return users

    def require_under_quota(self, uid: int, user: str, what: str) -> None:
        """Refuse new work (`what`: "new jobs") of a user at or over their disk quota, as
        last measured."""
        quota = self.live.current.quota_for(user)
        usage = self.users.get(uid)
        if quota is None or usage is None or usage.total < quota:
            return
        ago = round(time.time() - (self.measured_at or time.time()))
        raise errors.ResourceExhausted(
            f"disk quota: {what} of {user} are refused: {user} holds {fmt_bytes(usage.total)} "
            f"here, over the quota of {fmt_bytes(quota)} (job directories "
            f"{fmt_bytes(usage.workspaces)}, volumes {fmt_bytes(usage.volumes)}, blobs "
            f"{fmt_bytes(usage.blobs)}; measured {ago}s ago); free some with `noduslocal job "
            "rm`, `noduslocal sweep gc` or `noduslocal volume rm` (see `noduslocal du`), or "
            "ask an admin")
