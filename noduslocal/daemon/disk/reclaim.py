"""The retention pass, every gc_every and on `noduslocal gc`: ended jobs past keep_ended
lose their directory and outputs (one transaction with their events, then the files), and
blobs no row names any more are deleted. Never a job with an attempt on the board, a cell
of a sweep that still runs, nor a blob kept but not yet recorded (BlobStore pins it).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
import time
from functools import partial
from typing import Any

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.disk.usage import DiskUsage
from noduslocal.daemon.disk.watch import allocated
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.jobs.attempt import Board
from noduslocal.daemon.store import Store
from noduslocal.daemon.store.reclaim import Cursor, Reclaimed, blob_refs, gone_dirs, reclaim_due
from noduslocal.domain.jobs import GcReport
from noduslocal.domain.units import fmt_bytes, fmt_duration

log = logging.getLogger(__name__)

# A blob file younger than this is never deleted, whatever the rows say: a second guard,
# beside the pins, for a blob written just before the pass read the rows.
BLOB_GRACE = 600.0
WAKE_EVERY = 5.0  # seconds between looks at whether a pass is due


class Reclaimer:
    def __init__(self, live: LiveSettings, store: Store, layout: JobLayout, board: Board,
                 usage: DiskUsage) -> None:
        self.live = live
        self.store = store
        self.layout = layout
        self.board = board
        self.usage = usage
        self._one_at_a_time = asyncio.Lock()

    async def follow(self) -> None:
        log.info("retention: ended jobs keep their files for %s (keep_ended%s); the first "
                 "pass runs in %s (gc_every); `noduslocal gc --dry-run` shows what it would "
                 "remove", fmt_duration(self.live.current.keep_ended),
                 ", with per-user overrides" if self.live.current.keep_ended_users else "",
                 fmt_duration(self.live.current.gc_every))
        last = time.monotonic()
        while True:
            # In short steps, so a reloaded gc_every counts from the last pass at once.
            await asyncio.sleep(min(self.live.current.gc_every, WAKE_EVERY))
            if time.monotonic() - last < self.live.current.gc_every:
                continue
            last = time.monotonic()
            try:
                await self.run(dry_run=False)
            except Exception:
                log.exception("the retention pass failed")

    async def run(self, dry_run: bool) -> GcReport:
        async with self._one_at_a_time:
            now = time.time()
            active = frozenset(self.board.active) | frozenset(self.board.settling)
            keep_for, shortest = self.live.current.keep_for, self._shortest_keep()
            found, after = Reclaimed(), (-1.0, 0)

            def batch(c: sqlite3.Connection, at: Cursor,
                      due: frozenset[int]) -> tuple[Reclaimed, Any]:
                return reclaim_due(c, now, keep_for, shortest, active, dry_run, at, due)

            while True:  # in batches, each its own transaction with its events
                # What earlier batches found is collected already, unless this is a dry run.
                due = frozenset(job.id for job in found.jobs) if dry_run else frozenset()
                done: Reclaimed = await self.store.write(partial(batch, at=after,
                                                                      due=due))
                found.add(done)
                if done.after is None:
                    break
                after = done.after
            # Blobs released from here on may be recorded where the read below misses them.
            read_since = time.monotonic()
            referenced = await asyncio.to_thread(blob_refs, self.store, found)
            gone = await gone_dirs(self.store,
                                       await asyncio.to_thread(self.layout.job_ids_on_disk))
            report = await asyncio.to_thread(self._files, found, referenced, gone, dry_run,
                                             now, read_since)
        if not dry_run and (report.jobs or report.blobs or gone):
            log.info("retention: removed %d ended jobs' directories (%s) and %d blobs (%s), "
                     "and forgot %d uploads", len(report.jobs),
                     fmt_bytes(sum(j["bytes"] for j in report.jobs)), report.blobs,
                     fmt_bytes(report.blob_bytes), report.sources)
            self.usage.refresh_soon()
        return report

    def _shortest_keep(self) -> float | None:
        settings = self.live.current
        keeps = [k for k in (settings.keep_ended, *settings.keep_ended_users.values())
                 if k is not None]
        return min(keeps, default=None)

    def _files(self, found: Reclaimed, referenced: set[str], gone: list[int],
               dry_run: bool, now: float, read_since: float) -> GcReport:
        """On a thread: the collected jobs' directories (measured, then removed), those a
        crash left of jobs collected or removed before, and the blobs nobody names."""
        report = GcReport(dry_run, now, sources=len(found.sources))
        for job in found.jobs:
            directory = self.layout.job_dir(job.id)
            size = allocated(directory, sys.maxsize)[0] if directory.exists() else 0
            report.jobs.append({"project": job.project, "name": job.name, "owner": job.owner,
                                "bytes": size})
            if not dry_run:
                self.layout.remove(job.id)
        if not dry_run:
            for job_id in gone:
                self.layout.remove(job_id)
        unnamed = [(sha, size) for sha, size, mtime in self.layout.blobs.stored()
                   if sha not in referenced and mtime < now - BLOB_GRACE]
        if dry_run:
            report.blobs, report.blob_bytes = len(unnamed), sum(s for _, s in unnamed)
        else:
            report.blobs, report.blob_bytes = self.layout.blobs.discard(
                [sha for sha, _ in unnamed], read_since, now - BLOB_GRACE)
        return report
