"""The API's door to the box as a whole: its GPUs (who holds each, drains), its health and
doctor's checks, what /metrics and `info` report, disk use and retention, and what admins do
to people's work (hold a user's queue, a job's priority, a backup of the database).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.reload import ConfigReloader
from noduslocal.daemon.disk.reclaim import Reclaimer
from noduslocal.daemon.disk.usage import DiskUsage, UserUsage
from noduslocal.daemon.disk.watch import DiskReading, DiskWatch
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.gpus.model import Gpu, Inventory
from noduslocal.daemon.jobs.accounting import GpuAccounting
from noduslocal.daemon.jobs.attempt import Board
from noduslocal.daemon.jobs.gpu_health import GpuHealth
from noduslocal.daemon.jobs.user_admin import UserAdmin
from noduslocal.daemon.recovery import Recovery
from noduslocal.daemon.runtime.base import Runtime
from noduslocal.daemon.scheduler.queue import Queue
from noduslocal.daemon.store import Store, reports, resources
from noduslocal.daemon.store.integrity import integrity_problems
from noduslocal.domain import errors
from noduslocal.domain.jobs import Diagnosis, JobRecord
from noduslocal.domain.units import fmt_bytes

CLOCK_SLACK = 5.0  # seconds the newest recorded event may lie ahead of the clock
GPU_STATES = ("free", "allocated", "busy", "drained", "failed")


@dataclass(frozen=True)
class GpuNow:
    """One GPU as the scheduler sees it now."""

    gpu: Gpu
    state: str  # one of GPU_STATES
    job: JobRecord | None  # the job that holds it
    rank: int | None  # the holder's gang rank on it
    busy: str | None  # what makes a GPU nobody here holds busy (None: nothing)
    drained: bool  # nothing new lands on it


class AdminService:
    def __init__(self, live: LiveSettings, store: Store, runtimes: Mapping[str, Runtime],
                 queue: Queue, board: Board, accounting: GpuAccounting, health: GpuHealth,
                 users: UserAdmin, disk: DiskWatch, usage: DiskUsage, reclaimer: Reclaimer,
                 recovery: Recovery, layout: JobLayout) -> None:
        self.live = live
        self.store = store
        self.runtimes = runtimes
        self.queue = queue
        self.board = board
        self.accounting = accounting
        self.health = health
        self.users = users
        self.disk = disk
        self.usage = usage
        self.reclaimer = reclaimer
        self.recovery = recovery
        self.layout = layout
        self.config: ConfigReloader | None = None  # the config file followed, once it is

    # --- the GPUs -------------------------------------------------------------------------

    @property
    def inventory(self) -> Inventory:
        return self.accounting.inventory

    def gpus(self) -> list[GpuNow]:
        pool = self.queue.capacity.gpus
        found = []
        for gpu in self.inventory.gpus:
            job_id = pool.holder.get(gpu.uuid) if pool else None
            holder = self.board.running_job(job_id) if job_id is not None else None
            rank = None
            if (holder is not None and pool is not None and holder.spec.gang is not None
                    and holder.spec.gang.gpus_per_node):
                rank = pool.by_job[holder.id].index(gpu.uuid) // holder.spec.gang.gpus_per_node
            busy = pool.busy(gpu) if pool and job_id is None else None
            if not gpu.healthy:
                state = "failed"
            elif pool is not None and gpu.uuid in pool.drained:
                state = "drained"
            elif pool is not None and gpu.uuid in pool.holder:
                state = "allocated"
            elif busy:
                state = "busy"
            else:
                state = "free"
            found.append(GpuNow(gpu, state, holder, rank, busy,
                                bool(pool and gpu.uuid in pool.drained)))
        return found

    async def drain(self, raw: str, drained: bool, by: str) -> Gpu:
        """Nothing new lands on the GPU named by index or UUID (or it may again)."""
        gpu = next((g for g in self.inventory.gpus if str(g.index) == raw or g.uuid == raw),
                   None)
        if gpu is None:
            raise errors.NotFound(f"there is no GPU {raw!r}; `noduslocal gpus` lists them")
        await self.store.write(lambda c: resources.set_drain(c, gpu.uuid, drained, by,
                                                             time.time()))
        self.health.set_drained(gpu.uuid, drained)
        return gpu

    # --- health, info and doctor ----------------------------------------------------------

    def problems(self) -> list[str]:
        """Why the daemon cannot take new work or record what happens, or lost commits."""
        return [*self.disk.problems(), *self.recovery.lost_problems()]

    def capacity(self) -> dict[str, float]:
        capacity = self.queue.capacity
        return {"cpus": capacity.cpu_m / 1000, "memory": capacity.memory,
                "cpus_used": capacity.used_cpu_m / 1000, "memory_used": capacity.used_memory}

    async def regions(self) -> list[dict[str, Any]]:
        """This box's region (its capacity and GPUs now), then each configured cluster's,
        as its runtime reads it (Slurm: sinfo and scontrol)."""
        pool = self.queue.capacity.gpus
        held = {u for uuids in pool.by_job.values() for u in uuids} if pool else set()
        gpus: dict[str, dict[str, int]] = {}
        for gpu in self.inventory.gpus:
            entry = gpus.setdefault(gpu.model, {"total": 0, "used": 0, "free": 0})
            entry["total"] += 1
            entry["used" if gpu.uuid in held else "free"] += 1
        local = {"name": self.live.current.region, "runtime": "local", "this_box": True,
                 "reachable": True, "error": None, **self.capacity(), "gpus": gpus}
        found = [local]
        for runtime in self.runtimes.values():
            found.extend(await runtime.regions())
        return found

    def counts(self) -> dict[str, int]:
        return {"pending": len(self.queue), "active": len(self.board.active)}

    def orphans(self) -> list[dict[str, Any]]:
        """Job directories the database did not know at start (admins see them)."""
        return [o.to_wire() for o in self.recovery.orphans]

    def lost_view(self, uid: int, admin: bool) -> dict[str, Any]:
        return self.recovery.lost_view(uid, admin)

    def config_status(self) -> dict[str, Any] | None:
        return None if self.config is None else self.config.status.to_wire()

    async def doctor(self) -> list[Diagnosis]:
        """Each runtime's own checks, then the GPUs, the disk, the config and the clock."""
        gpus = self.inventory.source == "nvml"
        found = [d for runtime in self.runtimes.values() for d in await runtime.diagnose(gpus)]
        return [*found, self._gpu_check(), self._disk_check(),
                await asyncio.to_thread(self._workspaces_check), self._config_check(),
                await self._clock_check()]

    def _workspaces_check(self) -> Diagnosis:
        overlays = self.layout.overlays
        if overlays.unavailable is not None:
            return Diagnosis("workspaces", None, (
                f"overlayfs is not used ({overlays.unavailable}): each task's workspace gets "
                "a copy of its source"))
        stale = overlays.stale()
        if stale:
            return Diagnosis("workspaces", False, (
                f"{len(stale)} overlay mount(s) no attempt or reader holds: "
                f"{', '.join(map(str, stale[:5]))}; a restart of the daemon unmounts them"))
        return Diagnosis("workspaces", True, (
            f"overlay: {len(overlays.snapshots())} source snapshot(s) shared by their "
            f"tasks, {overlays.count_mounted()} workspace(s) mounted"))

    def _gpu_check(self) -> Diagnosis:
        inventory = self.inventory
        count = len(inventory.gpus)
        if inventory.source == "nvml":
            broken = [g for g in inventory.gpus if not g.healthy]
            detail = f"NVML, driver {inventory.driver}, {count} GPU(s)"
            if broken:
                return Diagnosis("gpus", False, detail + "; unhealthy: " + ", ".join(
                    f"GPU {g.index} ({g.problem})" for g in broken))
            return Diagnosis("gpus", True, detail)
        if inventory.source == "simulated":
            return Diagnosis("gpus", True, f"simulated: {inventory.note} (simulate_gpus; "
                                           "NVML is not used)")
        return Diagnosis("gpus", None, f"none: {inventory.note} (GPU jobs are refused; on a "
                                       "GPU box install the NVIDIA driver and restart the "
                                       "daemon)")

    def _disk_check(self) -> Diagnosis:
        reading = self.disk.reading
        if reading is None:
            return Diagnosis("disk", None, "not read yet")
        detail = (f"{fmt_bytes(reading.free)} free of {fmt_bytes(reading.total)} at "
                  f"{reading.path} (reserve {fmt_bytes(self.live.current.disk_reserve)})")
        if reading.low:
            return Diagnosis("disk", False, (
                f"{reading.describe()}: new work is refused; free space there (`noduslocal "
                "du` says who holds what; `noduslocal gc` removes what is past keep_ended, "
                "`noduslocal job rm` ended jobs), or lower disk_reserve"))
        return Diagnosis("disk", True, detail)

    def _config_check(self) -> Diagnosis:
        if self.config is None:
            return Diagnosis("config", None, "not followed by this daemon")
        status = self.config.status
        if status.error:
            return Diagnosis("config", False, f"{status.error}; the daemon keeps the settings "
                                              "it had: fix the file (it is read again when "
                                              "saved)")
        if not Path(status.path).exists():
            return Diagnosis("config", True, f"no {status.path}: the defaults are in force "
                                             "(scripts/install.sh puts a commented one there)")
        detail = f"{status.path}: in force"
        if status.restart_pending:
            detail += (f"; {', '.join(status.restart_pending)} changed and take effect when "
                       "the daemon restarts (systemctl restart noduslocal)")
        return Diagnosis("config", True, detail)

    async def _clock_check(self) -> Diagnosis:
        newest = await reports.newest_event_time(self.store)
        now = time.time()
        if newest is not None and newest > now + CLOCK_SLACK:
            return Diagnosis("clock", False, f"the clock is {newest - now:.0f}s behind the "
                                             "newest event in the database: ages, timeouts "
                                             "and fair share go wrong (check NTP: "
                                             "timedatectl)")
        return Diagnosis("clock", True, "not behind the database")

    # --- what /metrics reads --------------------------------------------------------------

    def disk_reading(self) -> DiskReading | None:
        return self.disk.reading

    def disk_use(self) -> list[UserUsage]:
        """Each user's use as last measured."""
        return list(self.usage.users.values())

    async def tallies(self) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]]:
        """Jobs by (phase, owner) and ended attempts by (phase, reason)."""
        return await reports.tallies(self.store)

    # --- disk use and retention -----------------------------------------------------------

    async def du(self, uid: int, refresh: bool) -> dict[str, Any]:
        """Each user's job directories, volumes and blobs; `refresh` measures them now."""
        if refresh or self.usage.measured_at is None:
            await self.usage.refresh_for(uid)
        settings = self.live.current
        users = sorted(self.usage.users.values(), key=lambda u: (-u.total, u.user))
        return {"measured_at": self.usage.measured_at,
                "users": [u.to_wire(settings.quota_for(u.user), settings.keep_for(u.user))
                          for u in users]}

    async def reclaim(self, dry_run: bool) -> dict[str, Any]:
        """A retention pass now; `dry_run` says what it would remove and removes nothing."""
        return (await self.reclaimer.run(dry_run)).to_wire()

    # --- admins acting on people's work ---------------------------------------------------

    async def user_report(self) -> list[dict[str, Any]]:
        return await self.users.report()

    async def own_report(self, uid: int, name: str) -> dict[str, Any]:
        """One user's row of the report (`GET /v1/me`): their own use and limits."""
        return (await self.users.report(only=(uid, name)))[0]

    async def hold_user(self, uid: int, name: str, by: str, reason: str | None) -> None:
        await self.users.hold_user(uid, name, by, reason)

    async def release_user(self, uid: int, name: str, by: str) -> None:
        await self.users.release_user(uid, name, by)

    async def set_priority(self, job: JobRecord, priority: int, by: str) -> None:
        await self.users.set_priority(job, priority, by)

    async def integrity(self) -> list[str]:
        """Every problem SQLite's full integrity_check finds (none: sound)."""
        return await asyncio.to_thread(integrity_problems, self.store.path)

    async def backup(self, target: Path) -> None:
        """A consistent copy of the database at `target` (SQLite's online backup)."""
        await asyncio.to_thread(self.store.backup_to, target)
