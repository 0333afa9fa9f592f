"""After a daemon restart: the fair-share ledger and drains are read back, what the job
directories prove of commits the database lost is put back (or kept aside) and reported
loudly, every attempt that may still run takes its share back (CPUs, memory, the same
GPUs) before any pass, and is adopted if its ranks live, or ended as what it became
meanwhile (a workspace it left half made, dropped).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import time
from collections.abc import Mapping
from typing import Any

from noduslocal.daemon.files.layout import OTHER, JobLayout
from noduslocal.daemon.gpus.cost import Meter
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.attempt import Attempt, Board, recorded_life
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.jobs.orphans import (
    BOOT_RECORD,
    RECOVERED,
    Orphan,
    find_orphans,
    lost_problems,
    lost_starts,
    lost_summary,
    lost_view,
    power_loss_note,
    swap_boot_record,
)
from noduslocal.daemon.jobs.runner import AttemptRunner
from noduslocal.daemon.runtime import shim
from noduslocal.daemon.runtime.base import NeverStarted, Rank, Runtime
from noduslocal.daemon.scheduler.queue import Request
from noduslocal.daemon.store import Store, job_writes
from noduslocal.daemon.store.restore import catch_up, restore_job
from noduslocal.daemon.sweeps.controller import SweepController
from noduslocal.domain.jobs import AttemptRecord, JobRecord
from noduslocal.domain.states import AttemptPhase, Phase

log = logging.getLogger(__name__)


class Recovery:
    def __init__(self, store: Store, layout: JobLayout, runtimes: Mapping[str, Runtime],
                 board: Board, dispatch: Dispatch, accounting: GpuAccounting,
                 runner: AttemptRunner, sweeps: SweepController) -> None:
        self.store = store
        self.layout = layout
        self.runtimes = runtimes
        self.board = board
        self.dispatch = dispatch
        self.accounting = accounting
        self.runner = runner
        self.sweeps = sweeps
        self.orphans: list[Orphan] = []  # job directories the database does not know
        # Known jobs whose lost starts were put back: (owner uid, PROJECT/NAME).
        self.caught_up: list[tuple[int, str]] = []
        # The last daemon ran in another boot: the machine stopped under it, and the starts
        # it had not synced may be lost without any damage (store/writer.py).
        self.machine_stopped = False

    def lost_problems(self) -> list[str]:
        """Why the daemon is degraded after finding job directories the database lost."""
        return lost_problems(self.orphans, [] if self.machine_stopped else self.caught_up)

    def lost_view(self, uid: int, admin: bool) -> dict[str, Any]:
        if self.machine_stopped:
            return {**lost_view(self.orphans, [], uid, admin),
                    "power_loss_starts": len(self.caught_up)}
        return lost_view(self.orphans, self.caught_up, uid, admin)

    async def recover(self) -> None:
        self.layout.create_root()
        previous = await asyncio.to_thread(swap_boot_record, self.layout.root / BOOT_RECORD)
        self.machine_stopped = previous is not None and previous != shim.boot_id()
        pool = self.dispatch.queue.capacity.gpus
        if pool is not None:
            pool.drained = await self.store.drained_gpus()
        await self.accounting.replay(self.store)
        self.orphans = await asyncio.to_thread(find_orphans, self.layout,
                                               await self.store.max_job_id())
        await self._put_back(self.orphans)
        jobs = await self.store.active_jobs()
        if await self._catch_up(jobs):
            jobs = await self.store.active_jobs()
        damage = [] if self.machine_stopped else self.caught_up
        if self.orphans or damage:
            log.error("%s", lost_summary(self.orphans, damage, self.layout.jobs_dir))
        if self.caught_up and self.machine_stopped:
            log.warning("%s", power_loss_note(self.caught_up))
        # The sweeps first: an adopted cell's end, committed from here on, then reaches a
        # sweep that knows the cell (it holds back its pending cells; nothing starts yet).
        await self.sweeps.recover()
        # Before any adopted attempt can end: the workspace mounts of attempts that may
        # still run stay theirs, every other one (a dead daemon's) goes.
        await asyncio.to_thread(self.layout.overlays.settle, {
            job.id: job.attempts for job in jobs
            if job.phase in (Phase.STARTING, Phase.RUNNING)})
        # Everything that may still run takes its share back before any pass can start a
        # pending job; the pass is held until then.
        queued = await self._queued_in_clusters(jobs)
        for job in jobs:
            if job.phase in (Phase.STARTING, Phase.RUNNING) or job.id in queued:
                await self._reconcile(job)
        for job in jobs:
            # A sweep's smoke canary (no cell) is its sweep's to queue, or to hold.
            if (job.phase == Phase.PENDING and job.sweep_id is None
                    and not self.sweeps.is_cell(job.id) and job.id not in queued):
                self.dispatch.enqueue(job)
        self.dispatch.ready = True
        self.dispatch.kick()

    async def _put_back(self, orphans: list[Orphan]) -> None:
        """Each lost job its directory proves, back in the database in a transaction of its
        own; one that fails to go back is kept aside, and the daemon starts all the same."""
        for orphan in orphans:
            if orphan.job is None:
                continue
            job = orphan.job
            try:
                name = await self.store.write(lambda c, j=job: restore_job(c, j, time.time()))
            except Exception as exc:
                log.exception("job directory %s: putting its job back failed", orphan.path)
                orphan.note += f"; putting it back failed ({exc}), so it is kept aside"
                orphan.job = None
                continue
            if name is not None:
                orphan.recovered = f"{job.project}/{name}"
                log.warning("job directory %s: recovered as %s, %s (%s)", orphan.path,
                            orphan.recovered, job.phase, job.message)

    async def _catch_up(self, jobs: list[JobRecord]) -> bool:
        """Unended jobs whose directories prove starts the database lost: those starts put
        back, the last attempt left for _reconcile() to adopt or end (never started again
        into a directory that ran). True when any was. The one next attempt of a job whose
        shim was armed is no loss: that shim was let go as its start was queued, and this
        daemon's last one was stopped before the commit (runner.py's _launch_armed)."""
        on_disk = set(await asyncio.to_thread(self.layout.job_ids_on_disk))
        put_back = False
        for job in jobs:
            if job.id not in on_disk or job.phase == Phase.SUSPENDED:
                continue
            try:
                if (job.phase == Phase.PENDING and not job.attempts
                        and await asyncio.to_thread(drop_torn_first, self.layout, job)):
                    log.warning("job %s: the last daemon died while making its first "
                                "attempt's directories; they are made again", job.name)
                    continue
                current, later = await asyncio.to_thread(lost_starts, self.layout, job)
            except Exception:  # a disk that fails one job's look stops no daemon's start
                log.exception("job %s: reading what its directory proves failed; it is left "
                              "as the database has it", job.name)
                continue
            if not later:
                continue
            try:
                number = await self.store.write(functools.partial(
                    catch_up, job_id=job.id, known=job.attempts, current=current,
                    later=later, message=RECOVERED, now=time.time()))
            except Exception:
                log.exception("job %s: putting back the starts its directory proves failed; "
                              "it is left as the database has it", job.name)
                continue
            if number is None:
                continue
            put_back = True
            if len(later) == 1 and later[0].abandoned:
                log.info("job %s: attempt %d was let go as its start was queued, and the "
                         "daemon stopped before that start was committed and before it "
                         "ran; it is spent as not started", job.name, number)
                continue
            if len(later) == 1 and later[0].armed:
                log.info("job %s: attempt %d was let go as its start was queued, and the "
                         "daemon stopped before that start was committed; put back",
                         job.name, number)
                continue
            self.caught_up.append((job.owner_uid, f"{job.project}/{job.name}"))
            log.warning("job %s: the database had lost the start of attempts %s, which "
                        "its directory proves; put back", job.name,
                        ", ".join(str(a.number) for a in later))
        return put_back

    async def _queued_in_clusters(self, jobs: list[JobRecord]) -> set[int]:
        """Pending jobs of cluster regions with an attempt still open: submitted, waiting
        in the cluster's queue. They are adopted as running ones are, never queued again."""
        queued = set()
        for job in jobs:
            if job.phase == Phase.PENDING and job.spec.region is not None and job.attempts:
                last = (await self.store.attempts(job.id))[-1]
                if last.phase == AttemptPhase.STARTING:
                    queued.add(job.id)
        return queued

    async def _reconcile(self, job: JobRecord) -> None:
        last: AttemptRecord = (await self.store.attempts(job.id))[-1]
        attempt = Attempt(job, Request.of(job.id, job.spec, job.owner_uid),
                          number=last.number,
                          directory=self.layout.attempt_dir(job.id, last.number),
                          life=recorded_life(last.phase == AttemptPhase.RUNNING,
                                             last.stop_reason is not None),
                          handles=last.handles, stop_reason=last.stop_reason)
        attempt.gpus = last.gpus
        if last.gpus:  # the energy before the restart is not known: time only, from here
            attempt.meter = Meter.start(last.gpus, self.accounting.inventory,
                                        last.started_at or last.created_at)
            attempt.meter.energy_start = dict.fromkeys(last.gpus)
        self.board.active[job.id] = attempt
        if job.spec.region is not None:  # a cluster's: it holds its lane's place, no more
            self.dispatch.lanes.hold(job.id, job.spec.region, job.owner_uid)
        else:
            self.dispatch.queue.capacity.take(attempt.request, gpus=last.gpus,
                                              started_at=last.started_at or last.created_at)
        # Its own task: a runtime may be away (dockerd), and the attempt holds its share
        # until it is back and says what became of it.
        attempt.task = asyncio.create_task(self._adopt(attempt, last))

    async def _adopt(self, attempt: Attempt, last: AttemptRecord) -> None:
        job = attempt.job
        try:
            launch = await self.runner.launch_of(attempt)
            indexed = self.runner.indexed
            array = job.spec.indexed is not None and indexed.array_runtime(job) is not None
            if job.spec.indexed is not None and not array:
                # adopts what runs, then goes on with the rest
                await self.runner.watch(attempt, last.started_at or time.time(),
                                        until=indexed.run(attempt, launch, True))
                return
            found = await (indexed.adopt(attempt, launch) if array else
                           self.runner.runtime_of(job).adopt(
                               launch, attempt.handles, recorded_running=attempt.launched,
                               stopping=attempt.stop_reason is not None))
            if not isinstance(found, list):
                if isinstance(found, NeverStarted) and await asyncio.to_thread(
                        drop_torn_workspace, self.layout, job.id):
                    log.warning("job %s: the last daemon died while making its workspace; "
                                "it is made again for the next attempt", job.name)
                await self.runner.finish(attempt, found)
                return
            await self._watch_adopted(attempt, last, found, array)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("reconciling job %s failed", job.name)
            await self.runner.give_up(attempt, f"the daemon could not adopt it: {exc}")

    async def _watch_adopted(self, attempt: Attempt, last: AttemptRecord,
                             ranks: list[Rank], array: bool = False) -> None:
        """`array`: the ranks are an indexed job's indexes in one array of the runtime's."""
        job = attempt.job
        recorded_running = attempt.launched
        self.runner.take(attempt, ranks)
        started = last.started_at
        if not recorded_running or started is None:
            # The daemon died between the launch and its commit, or it waits in a
            # cluster's queue (and may have started there meanwhile, or even ended).
            now = await self.runner.until_running(attempt, ranks, adopted=True)
            if not isinstance(now, float):
                await self.runner.finish(attempt, now)
                return
            started = now
            await self.store.write(lambda c, at=started: job_writes.attempt_running(
                c, job.id, attempt.number, at, attempt.handles))
        await self.runner.watch(attempt, started, until=self.runner.indexed.follow(
            attempt, ranks) if array else None)


def drop_torn_first(layout: JobLayout, job: JobRecord) -> bool:
    """Remove the directory of a pending job that never had an attempt when it holds more
    than its first attempt's prepare() takes, and no attempt directory: an armed start
    makes them before its start is committed (runner.py's _launch_armed), and the daemon
    died while making them (a volume's link in the workspace, say). Its shim is let go only
    once they are all made, so nothing ran there; prepare() would refuse them (File
    exists, which failed the job). False when there is nothing to drop."""
    if (layout.attempt_dir(job.id, 1).exists()
            or layout.first_look(job) != OTHER):
        return False
    layout.remove(job.id)  # its overlay unmounted first; renamed aside, then removed
    return True


def drop_torn_workspace(layout: JobLayout, job_id: int) -> bool:
    """Remove the workspace of a job that no attempt has a directory for: prepare() makes
    the attempt's directory last, so the daemon died while filling the workspace (its
    source half unpacked, its volume links missing), and the next attempt would take it
    for one kept from an earlier run. Renamed aside first: an unpack the dead daemon
    started may still write into it. False when there is nothing to drop."""
    workspace = layout.workspace(job_id)
    if not workspace.is_dir() or any(layout.job_dir(job_id).glob("attempt-*")):
        return False
    layout.overlays.release(job_id)  # its mount and upper, never removed through it
    aside = layout.job_dir(job_id) / f".torn-workspace-{time.time_ns()}"
    os.rename(workspace, aside)
    shutil.rmtree(aside, ignore_errors=True)  # links in it are removed, never followed
    return True
