"""The lifecycle's coordinator: builds its parts (admission and the queue pass, the
attempt runner, stops and owners' controls, recovery, GPU health and cost, the sweeps, the
disk) around one board of attempts, and the API's services over them; the daemon starts,
stops and feeds it (runtimes that come and go, committed events, GPUs). Every part reads
the settings from one LiveSettings holder; build.py makes it, and the daemon around it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from noduslocal.daemon.admin import AdminService
from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.settings import Settings
from noduslocal.daemon.disk.reclaim import Reclaimer
from noduslocal.daemon.disk.room import Room
from noduslocal.daemon.disk.usage import DiskUsage
from noduslocal.daemon.disk.watch import DiskWatch
from noduslocal.daemon.events import EventHub
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.files.outputs import OutputLimits
from noduslocal.daemon.gpus.model import Inventory
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.admission import Admission
from noduslocal.daemon.jobs.attempt import Attempt, Board
from noduslocal.daemon.jobs.background import Background
from noduslocal.daemon.jobs.dispatch import Dispatch
from noduslocal.daemon.jobs.gpu_health import GpuHealth
from noduslocal.daemon.jobs.runner import AttemptRunner
from noduslocal.daemon.jobs.service import JobService, OwnerControls
from noduslocal.daemon.jobs.stops import Stopper
from noduslocal.daemon.jobs.user_admin import UserAdmin
from noduslocal.daemon.recovery import Recovery
from noduslocal.daemon.resources import ResourceService
from noduslocal.daemon.runtime.base import Runtime
from noduslocal.daemon.scheduler.cluster_lanes import ClusterLanes
from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.daemon.scheduler.queue import Capacity, Limits, Queue
from noduslocal.daemon.store import Store
from noduslocal.daemon.sweeps.admission import SweepAdmission
from noduslocal.daemon.sweeps.controller import SweepController
from noduslocal.daemon.sweeps.controls import SweepControls
from noduslocal.daemon.sweeps.reports import SweepReports
from noduslocal.daemon.sweeps.service import SweepService
from noduslocal.daemon.sweeps.webhooks import Webhooks
from noduslocal.domain.jobs import Event
from noduslocal.domain.states import TERMINAL, Phase


def submit_cap(live: LiveSettings, region: str) -> int | None:
    """The most jobs one user may have submitted to `region` at once, as configured now;
    None: the region is not configured (any more)."""
    configured = live.current.regions.get(region)
    return None if configured is None else configured.max_submitted_per_user


class Lifecycle:
    def __init__(self, live: LiveSettings, store: Store, layout: JobLayout,
                 runtimes: Mapping[str, Runtime], inventory: Inventory | None = None, *,
                 hub: EventHub) -> None:
        """`live`: the settings every part reads; `runtimes`: by kind (JobSpec.runtime),
        each job goes to its own. `hub`: where committed events fan out (the store's); the
        services' long polls wait on it."""
        # What the parts take once, here; the live values among them are made again in
        # _settings_changed.
        settings = live.current
        self.store = store
        self.layout = layout
        self.runtimes = runtimes
        self.board = Board()
        self.background = Background()
        inventory = inventory or Inventory([], "none", "no GPU inventory")
        capacity = Capacity(settings.cpus_m, settings.memory,
                            gpus=GpuPool(inventory, settings.gpu_busy_memory))
        self.accounting = GpuAccounting(live, capacity, inventory)
        self.queue = Queue(capacity, limits=Limits(settings.user_max_gpus,
                                                   settings.user_max_jobs),
                           usage=self.accounting.usage, describe=self.board.job_name)
        self.stopper = Stopper(live, store, self.board, runtimes, self.background)
        self.dispatch = Dispatch(store, self.queue, self.board, self.accounting, self.stopper,
                                 self.background, on_start=self._run,
                                 lanes=ClusterLanes(lambda region: submit_cap(live, region),
                                                    self.queue.held_users.get))
        self.admission = Admission(live, store, capacity, self.dispatch, self.background)
        self.reports = SweepReports(store, settings.region, self.accounting,
                                    lambda job_id: self.jobs.running_cost(job_id),
                                    lambda job_id: self.jobs.running_metrics(job_id),
                                    lambda job, n, stream: self.jobs.log_path(job, n, stream))
        self.disk = DiskWatch(settings.data_dir, settings.disk_reserve, settings.disk_poll,
                              layout, self.board, self.stopper, capacity,
                              store.commits_stalled, self.dispatch.kick)
        self.runner = AttemptRunner(store, layout, runtimes, self.board, self.dispatch,
                                    self.stopper, self.accounting,
                                    OutputLimits(settings.max_output_size,
                                                 settings.max_job_outputs),
                                    self.disk.room,
                                    lambda job_id, phase: self.sweeps.cell_ending(job_id, phase),
                                    stderr_line=self.reports.stderr_line,
                                    on_launch=lambda job_id: self.sweeps.cell_launched(job_id))
        self.webhooks = Webhooks(live, self.background, self.reports)
        self.sweeps = SweepController(store, self.dispatch, self.background, self.webhooks,
                                      hub, lambda job_id: self.jobs.running_cost(job_id),
                                      self.runner.prepare_ahead, self.runner.arm_ahead)
        self.sweep_admission = SweepAdmission(store, self.admission, self.sweeps)
        self.controls = OwnerControls(store, layout, self.dispatch, self.board, self.stopper,
                                      withdraw=self.sweeps.withdraw,
                                      return_to_unreleased=self.sweeps.return_to_unreleased)
        self.sweep_controls = SweepControls(store, self.sweeps, self.dispatch, self.controls)
        self.recovery = Recovery(store, layout, runtimes, self.board, self.dispatch,
                                 self.accounting, self.runner, self.sweeps)
        self.health = GpuHealth(live, capacity, self.accounting, self.board,
                                self.stopper, self.dispatch.kick)
        self.users = UserAdmin(live, store, self.queue, self.accounting, self.dispatch)
        self.usage = DiskUsage(live, store, layout)
        self.retention = Reclaimer(live, store, layout, self.board, self.usage)
        self.room = Room(self.disk, self.usage, store)
        # The API's doors: one service per domain, each given the parts it needs.
        self.jobs = JobService(live, store, hub, layout, runtimes, self.board, self.queue,
                               self.dispatch, self.admission, self.controls, self.runner,
                               self.accounting, self.room, self.usage,
                               is_cell=self.sweeps.is_cell,
                               sweep_wait_reason=self.sweeps.wait_reason)
        self.sweep_service = SweepService(store, hub, layout, self.room, self.usage,
                                          self.webhooks, self.sweep_admission, self.sweeps,
                                          self.sweep_controls, self.reports)
        self.admin = AdminService(live, store, runtimes, self.queue, self.board,
                                  self.accounting, self.health, self.users, self.disk,
                                  self.usage, self.retention, self.recovery, layout)
        self.resources = ResourceService(store, layout, self.room, self.usage)
        live.subscribe(self._settings_changed)

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
        self.dispatch.gate.on_events(events)
        for event in events:
            # A cell that ends (or is set aside) before its first attempt: the workspace
            # mount made ahead for it goes (an attempt's own end unmounts its own).
            if ((event.phase in TERMINAL or event.phase == Phase.SUSPENDED)
                    and self.layout.ahead_unused(event.job_id)):
                self.background.spawn(asyncio.to_thread(self.layout.drop_ahead,
                                                        event.job_id))

    def describe(self) -> list[str]:
        """The lifecycle's state, a line each: what an admin (or a test that found a job
        stuck) reads after `kill -USR1` of the daemon (main.py)."""
        attempts = [f"{a.job.name}({job_id})#{a.number}:{a.life.name}"
                    f"{'' if a.started is None or a.started.done() else ':start-unsaved'}"
                    f"{':stop=' + a.stop_reason if a.stop_reason else ''}"
                    for job_id, a in self.board.active.items()]
        return [f"board: active {attempts[:32]} ({len(attempts)}), finishing "
                f"{sorted(self.board.finishing)[:16]}, settling {sorted(self.board.settling)[:16]}",
                self.store.describe(), *self.dispatch.describe(),
                *self.sweeps.describe()]

    def set_inventory(self, inventory: Inventory) -> None:
        self.health.set_inventory(inventory)

    def _settings_changed(self, settings: Settings) -> None:
        """A reloaded config: the parts read the new settings themselves; what is derived
        from them is made again here, and a raised limit may let a held job start now."""
        self.queue.limits = Limits(settings.user_max_gpus, settings.user_max_jobs)
        if self.queue.capacity.gpus is not None:
            self.queue.capacity.gpus.busy_memory = settings.gpu_busy_memory
        self.disk.reserve = settings.disk_reserve
        self.dispatch.kick()
