"""The lifecycle's coordinator: builds its parts (admission and the queue pass, the
attempt runner, stops and owners' controls, recovery, GPU health and cost) around one
board of attempts, and is their one face for the daemon and the API.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from noduslocal.daemon.config.settings import Settings
from noduslocal.daemon.disk.reclaim import Reclaimer
from noduslocal.daemon.disk.room import Room
from noduslocal.daemon.disk.usage import DiskUsage
from noduslocal.daemon.disk.watch import DiskWatch
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.files.outputs import OutputLimits
from noduslocal.daemon.gpus.model import Inventory
from noduslocal.daemon.jobs import gang_view
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.admission import Admission
from noduslocal.daemon.jobs.attempt import Attempt, Board
from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.jobs.controls import OwnerControls
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.jobs.gang_logs import merged_path
from noduslocal.daemon.jobs.gpu_health import GpuHealth
from noduslocal.daemon.jobs.indexed_run import (
    attempt_of_index,
    index_dir,
    index_view,
    running_index_launch,
)
from noduslocal.daemon.jobs.orphans import Orphan
from noduslocal.daemon.jobs.runner import AttemptRunner
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.jobs.user_admin import UserAdmin
from noduslocal.daemon.recovery import Recovery
from noduslocal.daemon.runtime.base import Runtime
from noduslocal.daemon.runtime.host.execute import ExecResult
from noduslocal.daemon.scheduler.fairshare import Ledger
from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.daemon.scheduler.queue import Capacity, Limits, Queue
from noduslocal.daemon.store import Store, job_writes
from noduslocal.daemon.store import sweeps as sweep_ops
from noduslocal.daemon.sweeps.admission import SweepAdmission
from noduslocal.daemon.sweeps.controller import SweepController
from noduslocal.daemon.sweeps.controls import SweepControls
from noduslocal.daemon.sweeps.reports import SweepReports
from noduslocal.daemon.sweeps.webhooks import Webhooks
from noduslocal.domain import errors
from noduslocal.domain.jobs import CreateRequest, Diagnosis, Event, JobRecord, SweepRecord
from noduslocal.domain.states import SWEEP_TERMINAL, TERMINAL, Phase
from noduslocal.domain.sweep_plan import Plan


class Lifecycle:
    def __init__(self, settings: Settings, store: Store, layout: JobLayout,
                 runtimes: Mapping[str, Runtime], inventory: Inventory | None = None) -> None:
        """`runtimes`: by kind (JobSpec.runtime), each job goes to its own."""
        self.store = store
        self.layout = layout
        self.runtimes = runtimes
        self._execs: Counter[int] = Counter()  # execs running, by the job owner's uid
        self._max_execs = settings.user_max_execs
        self.board = Board()
        self.background = Background()
        inventory = inventory or Inventory([], "none", "no GPU inventory")
        capacity = Capacity(settings.cpus_m, settings.memory,
                            gpus=GpuPool(inventory, settings.gpu_busy_memory))
        self.accounting = GpuAccounting(settings, capacity, inventory)
        self.queue = Queue(capacity, limits=Limits(settings.user_max_gpus,
                                                   settings.user_max_jobs),
                           usage=self.accounting.usage, describe=self.board.job_name)
        self.stopper = Stopper(settings, store, self.board, runtimes, self.background)
        self.dispatch = Dispatch(store, self.queue, self.board, self.accounting, self.stopper,
                                 self.background, on_start=self._run)
        self.admission = Admission(settings, store, capacity, self.dispatch, self.background)
        self.reports = SweepReports(store, settings.region, self.accounting,
                                    self.running_cost,
                                    self.running_metrics, self.log_path)
        self.disk = DiskWatch(settings.data_dir, settings.disk_reserve, settings.disk_poll,
                              layout, self.board, self.stopper, capacity,
                              store.commits_stalled, self.dispatch.kick)
        self.runner = AttemptRunner(store, layout, runtimes, self.board, self.dispatch,
                                    self.stopper, self.accounting,
                                    OutputLimits(settings.max_output_size,
                                                 settings.max_job_outputs),
                                    self.disk.room,
                                    lambda job_id, phase: self.sweeps.cell_ending(job_id, phase))
        self.webhooks = Webhooks(settings, self.background, self.reports)
        self.sweeps = SweepController(store, self.dispatch, self.background, self.webhooks,
                                      self.running_cost, self.runner.prepare_ahead)
        self.sweep_admission = SweepAdmission(store, self.admission, self.sweeps)
        self.controls = OwnerControls(store, layout, self.dispatch, self.board, self.stopper,
                                      withdraw=self.sweeps.withdraw,
                                      hold_again=self.sweeps.hold_again)
        self.sweep_controls = SweepControls(store, self.sweeps, self.dispatch, self.controls)
        self.recovery = Recovery(store, layout, runtimes, self.board, self.dispatch,
                                 self.accounting, self.runner, self.sweeps)
        self.health = GpuHealth(settings, capacity, self.accounting, self.board,
                                self.stopper, self.dispatch.kick)
        self.users = UserAdmin(settings, store, self.queue, self.accounting, self.dispatch)
        self.usage = DiskUsage(settings, store, layout)
        self.retention = Reclaimer(settings, store, layout, self.board, self.usage)
        self.room = Room(self.disk, self.usage, store)

    def _run(self, attempt: Attempt) -> None:
        attempt.task = asyncio.create_task(self.runner.run(attempt))

    # --- the daemon's -------------------------------------------------------------------

    async def start(self) -> None:
        self.runtime_changed()
        await self.users.recover()  # before any pass: a held queue stays held
        await self.recovery.recover()
        self.background.spawn(self.health.watch_costs())
        await self.disk.first_reading()
        self.background.spawn(self.disk.follow())
        self.background.spawn(self.usage.follow())
        self.background.spawn(self.retention.follow())

    async def stop(self) -> None:
        """Stop supervising; jobs keep running and are adopted by the next daemon."""
        self.background.close()
        attempts = list(self.board.active.values())
        for attempt in attempts:
            for timer in attempt.timers:
                timer.cancel()
        tasks = [a.task for a in attempts if a.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def runtime_changed(self) -> None:
        """A runtime came or went (dockerd): its jobs wait with the reason as their hold,
        without holding up the jobs behind them, or may start again."""
        for kind, runtime in self.runtimes.items():
            why = runtime.wait_reason()
            if why is None:
                self.queue.blocked.pop(kind, None)
            else:
                self.queue.blocked[kind] = why
        self.dispatch.kick()

    def on_committed(self, events: list[Event]) -> None:
        """Every committed job event (the store's hub calls this)."""
        self.sweeps.on_events(events)

    def set_inventory(self, inventory: Inventory) -> None:
        self.health.set_inventory(inventory)

    async def diagnose(self) -> list[Diagnosis]:
        """Each runtime's own checks, for `noduslocal doctor`."""
        gpus = self.inventory.source == "nvml"
        return [d for runtime in self.runtimes.values() for d in await runtime.diagnose(gpus)]

    def apply_settings(self, settings: Settings) -> None:
        """A reloaded config's live settings (config.LIVE) to every part that reads them;
        a raised limit may let a held job start now."""
        for part in (self.admission, self.stopper, self.accounting, self.health, self.users,
                     self.usage, self.retention, self.webhooks):
            part.settings = settings
        self._max_execs = settings.user_max_execs
        self.queue.limits = Limits(settings.user_max_gpus, settings.user_max_jobs)
        if self.queue.capacity.gpus is not None:
            self.queue.capacity.gpus.busy_memory = settings.gpu_busy_memory
        self.disk.reserve = settings.disk_reserve
        self.dispatch.kick()

    def set_drained(self, uuid: str, drained: bool) -> None:
        self.health.set_drained(uuid, drained)

    # --- the API's ----------------------------------------------------------------------

    async def create(self, req: CreateRequest, owner: job_writes.Owner, idempotency_key: str | None,
                     request_hash: str | None) -> tuple[JobRecord, bool]:
        await self.room.require_unless_made("new jobs", owner.uid, owner.name, "jobs",
                                            idempotency_key)
        return await self.admission.create(req, owner, idempotency_key, request_hash)

    async def cancel(self, job: JobRecord) -> None:
        await self.controls.cancel(job)

    async def suspend(self, job: JobRecord) -> None:
        await self.controls.suspend(job)

    async def resume(self, job: JobRecord) -> None:
        await self.controls.resume(job)

    async def remove(self, job: JobRecord, by: str) -> None:
        await self.controls.remove(job, by)
        self.usage.refresh_soon()

    async def create_sweep(self, plan: Plan, owner: job_writes.Owner, idempotency_key: str | None,
                           request_hash: str | None) -> tuple[SweepRecord, bool]:
        await self.webhooks.check(plan.webhook)
        await self.room.require_unless_made("new sweeps", owner.uid, owner.name, "sweeps",
                                            idempotency_key)
        return await self.sweep_admission.create(plan, owner, idempotency_key, request_hash)

    async def cancel_sweep(self, sweep: SweepRecord, remaining_only: bool = False) -> None:
        """End the sweep Cancelled: cells not started are cancelled, and running ones too
        unless `remaining_only`."""
        await self.sweep_controls.cancel(sweep, remaining_only)

    async def suspend_sweep(self, sweep: SweepRecord) -> None:
        await self.sweep_controls.suspend(sweep)

    async def resume_sweep(self, sweep: SweepRecord) -> None:
        await self.sweep_controls.resume(sweep)

    async def retry_sweep(self, sweep: SweepRecord, include_cancelled: bool = False) -> None:
        self.room.require("new jobs", sweep.owner_uid, sweep.owner)
        await self.sweep_controls.retry(sweep, include_cancelled)

    async def set_max_parallel(self, sweep: SweepRecord, max_parallel: int) -> None:
        await self.sweep_controls.set_max_parallel(sweep, max_parallel)

    async def free_sweep(self, sweep: SweepRecord) -> None:
        """`sweep gc`: free the workspaces of every job a finished sweep made; their
        history, logs and cost stay."""
        if sweep.phase not in SWEEP_TERMINAL:
            raise errors.Conflict(f"sweep {sweep.name!r} is {sweep.phase}; gc frees a "
                                  "finished sweep only (cancel it first)")
        made = await self.store.sweep_made(sweep.id)
        if live := [job.name for job in made if job.phase not in TERMINAL]:
            raise errors.Conflict(f"sweep {sweep.name!r}: {len(live)} of its jobs have not "
                                  f"ended ({live[0]} first); gc once they have")
        await asyncio.to_thread(lambda: [self.layout.free(job.id) for job in made])
        await self.store.write(lambda c: sweep_ops.mark_freed(c, sweep.id, time.time()))
        self.usage.refresh_soon()

    def sweep_changed(self, sweep_id: int) -> asyncio.Future[None]:
        """A future for the sweep's next transition."""
        return self.sweeps.next_change(sweep_id)

    @property
    def orphans(self) -> list[Orphan]:
        """Job directories the database did not know at start (admins see them)."""
        return self.recovery.orphans

    @property
    def inventory(self) -> Inventory:
        return self.accounting.inventory

    def gpu_hour_rate(self, model: str | None) -> float:
        return self.accounting.gpu_hour_rate(model)

    @property
    def ledger(self) -> Ledger:
        return self.accounting.ledger

    def wait_reason(self, job_id: int) -> str | None:
        if (pause := self.dispatch.retry_hold(job_id)) is not None:
            return pause
        if (why := self.queue.wait_reason(job_id)) is not None and self.sweeps.is_cell(job_id):
            return f"blocked on capacity: {why}"  # released by its sweep, waiting its turn
        return why or self.sweeps.wait_reason(job_id)

    def job_label(self, job_id: int) -> str | None:
        """`project/name` of a job that runs or waits, for messages about it."""
        job = self.board.running_job(job_id) or self.dispatch.pending.get(job_id)
        return None if job is None else f"{job.project}/{job.name}"

    def pending_job(self, job_id: int) -> JobRecord | None:
        return self.dispatch.pending.get(job_id)

    def running_job(self, job_id: int) -> JobRecord | None:
        return self.board.running_job(job_id)

    def active_count(self) -> int:
        return len(self.board.active)

    def running_metrics(self, job_id: int) -> dict[str, float] | None:
        """What a running job has reported so far (None when it does not run)."""
        attempt = self.board.active.get(job_id)
        return None if attempt is None else attempt.metrics

    def rank_view(self, job: JobRecord) -> list[dict[str, Any]] | None:
        """A gang's ranks: state, exit code and GPUs; None for a job that is no gang, or
        whose directory (where they are recorded) retention removed."""
        if job.spec.gang is None or job.collected_at is not None:
            return None
        directory = self.layout.attempt_dir(job.id, job.attempts) if job.attempts else None
        return gang_view.rank_view(job, self.board.active.get(job.id), directory,
                                   self.accounting.inventory)

    def index_view(self, job: JobRecord) -> dict[str, Any] | None:
        """An indexed job's indexes: succeeded, running, failed; None for any other job, or
        one whose directory (where they are recorded) retention removed."""
        if job.spec.indexed is None or job.collected_at is not None:
            return None
        return index_view(self.layout, job, self.board.active.get(job.id))

    def running_cost(self, job_id: int) -> float:
        attempt = self.board.active.get(job_id)
        return 0.0 if attempt is None else self.accounting.attempt_cost(attempt)

    def log_path(self, job: JobRecord, number: int, stream: str, rank: int | None = 0
                 ) -> Path:
        """Where attempt `number`'s log is (stream "all" or "stderr"), of one rank or
        (None) of every rank of a gang merged."""
        directory = self.layout.attempt_dir(job.id, number)
        if rank is None:
            return merged_path(directory, stream)
        if job.spec.indexed is not None:  # `rank` is the index, in a directory of its own
            return self.runtimes[job.spec.runtime].log_path(index_dir(directory, rank),
                                                            stream)
        return self.runtimes[job.spec.runtime].log_path(directory, stream, rank)

    def log_attempt(self, job: JobRecord, rank: int | None) -> int:
        """The attempt whose log a reader gets unless it names one: the last, or for an
        index, the last that ran it."""
        if job.spec.indexed is not None and rank is not None:
            return attempt_of_index(self.layout, job, rank)
        return job.attempts

    def writing_logs(self, job_id: int, number: int) -> bool:
        """Whether attempt `number` of the job may still add to its log."""
        attempt = self.board.active.get(job_id)
        return attempt is not None and number > 0 and attempt.number == number

    async def exec(self, job: JobRecord, command: list[str], timeout: float,
                   rank: int = 0) -> ExecResult:
        """Run a command beside one of the job's running ranks, as its owner."""
        attempt = self.board.active.get(job.id)
        if job.phase != Phase.RUNNING or attempt is None or not attempt.running:
            raise errors.Conflict(f"job {job.name!r} is {job.phase}; exec needs it Running")
        runtime = self.runtimes[job.spec.runtime]
        if not attempt.ends:
            why = runtime.wait_reason() or "the daemon has just restarted"
            raise errors.Conflict(f"job {job.name!r}: it is not adopted yet ({why}); try "
                                  "again shortly")
        owner = job.owner_uid
        if self._execs[owner] >= self._max_execs:
            raise errors.ResourceExhausted(
                f"exec: {job.owner} has {self._execs[owner]} execs running, the most one "
                f"user may (user_max_execs = {self._max_execs}); wait for one to end")
        self._execs[owner] += 1
        try:
            launch = await self.runner.launch_of(attempt)
            if job.spec.indexed is not None:
                launch = running_index_launch(launch, rank)
            running = [h for h, end in zip(attempt.handles, attempt.ends, strict=True)
                       if h.rank == rank and not end.done()]
            if not running:
                what = "index" if job.spec.indexed is not None else "rank"
                raise errors.Conflict(f"job {job.name!r}: its {what} {rank} is not running "
                                      "now")
            return await runtime.exec(launch, running[-1], command, timeout)
        finally:
            self._execs[owner] -= 1
