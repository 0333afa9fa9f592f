"""Queue order and admission: pure logic, no I/O.

Order: priority (higher first), interruptible jobs last within it, then fair share (the
user with the fewest decayed GPU-hours first), then submission. A job whose user is at a
per-user limit, whose runtime cannot start anything, or whose GPUs are broken or drained
for now, is passed over without holding up the rest. The first job that does not fit is
the head: behind it starts only what takes nothing the head waits for (no GPU it could
use, and CPU and memory to spare), or what, by its expected_duration, ends before the
start reserved for the head (backfill); so a big job is never starved. A head that is not
interruptible may preempt running interruptible jobs. Each waiting job gets a hold.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from noduslocal.daemon.scheduler.capacity import Capacity, Request, fmt_cpu
from noduslocal.domain.gpu_request import GpuRequest
from noduslocal.domain.units import fmt_bytes

__all__ = ["Capacity", "Limits", "Queue", "Request"]


@dataclass(frozen=True)
class Limits:
    max_gpus: int | None = None  # GPUs one user may hold at once
    max_jobs: int | None = None  # jobs one user may run at once


@dataclass
class Queue:
    capacity: Capacity
    limits: Limits = field(default_factory=Limits)
    usage: Callable[[int], float] = lambda uid: 0.0  # decayed GPU-hours of a user
    clock: Callable[[], float] = time.time
    _requests: dict[int, Request] = field(default_factory=dict)
    wait_reasons: dict[int, str] = field(default_factory=dict)
    etas: dict[int, float] = field(default_factory=dict)  # the head's reserved start
    # Running interruptible jobs to stop for the head (the supervisor acts on it), and
    # those being stopped already (their share is on its way back).
    preempt: list[int] = field(default_factory=list)
    stopping: set[int] = field(default_factory=set)
    describe: Callable[[int], str | None] = lambda job_id: None  # a job's name, for holds
    _freed_by: int | None = None  # the running job whose end lets the head start
    _last_order: list[Request] = field(default_factory=list)
    _place: dict[int, int] | None = None  # place in the last pass's order, when asked
    # Runtimes that cannot start anything now, with the reason: their jobs keep their place
    # but do not hold up the jobs behind them (e.g. "docker": "dockerd unreachable: ...").
    blocked: dict[str, str] = field(default_factory=dict)
    # Users whose queue an admin holds, with the hold their pending jobs show.
    held_users: dict[int, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._requests

    def push(self, req: Request) -> None:
        self._requests.setdefault(req.job_id, req)

    def remove(self, job_id: int) -> Request | None:
        req = self._requests.pop(job_id, None)
        self.wait_reasons.pop(job_id, None)
        self._place = None
        return req

    def request(self, job_id: int) -> Request | None:
        return self._requests.get(job_id)

    def replace(self, req: Request) -> None:
        """A queued job's request changed (its priority): the next pass orders by it."""
        if req.job_id in self._requests:
            self._requests[req.job_id] = req
            self._place = None

    def last_order(self) -> list[Request]:
        """The order of the last pass (what the holds describe), newer arrivals last."""
        seen = {r.job_id for r in self._last_order}
        return self._last_order + sorted((r for r in self._requests.values()
                                          if r.job_id not in seen), key=lambda r: r.job_id)

    def order(self) -> list[Request]:
        usage: dict[int, float] = {}
        for req in self._requests.values():
            if req.owner_uid not in usage:
                usage[req.owner_uid] = self.usage(req.owner_uid)
        # Interruptible jobs are opportunistic: behind every other job of their priority,
        # so a preempted one never takes back what it was stopped for.
        return sorted(self._requests.values(), key=lambda r: (
            -r.priority, r.interruptible, usage[r.owner_uid], r.job_id))

    def schedule(self) -> list[Request]:
        """Take every request that may start now; set the holds of the rest."""
        cap, now = self.capacity, self.clock()
        started: list[Request] = []
        wait_reasons: dict[int, str] = {}
        head: Request | None = None
        reserved: float | None = None
        order = self.order()
        max_jobs, max_gpus = self.limits.max_jobs, self.limits.max_gpus
        limited = max_jobs is not None or max_gpus is not None
        blocked, by_user, pool = self.blocked, cap.by_user, cap.gpus
        possible: dict[GpuRequest, bool] = {}
        preempting = any(job_id in cap.running for job_id in self.stopping)
        impaired = pool is not None and any(  # some GPU unusable for now: check each job
            not g.healthy or g.mig or g.uuid in pool.drained for g in pool.inventory.gpus)
        held_users = self.held_users
        for req in order:
            if blocked and req.runtime in blocked:
                continue
            if held_users and req.owner_uid in held_users:
                wait_reasons[req.job_id] = held_users[req.owner_uid]
                continue
            # Inlined: this loop walks every pending job on every pass.
            if limited:  # inlined: this loop walks every pending job on every pass
                held = by_user.get(req.owner_uid, (0, 0))
                if ((max_jobs is not None and held[0] >= max_jobs)
                        or (max_gpus is not None and req.gpu is not None
                            and held[1] + req.gpu.count > max_gpus)):
                    wait_reasons[req.job_id] = self._over_limit(req) or "user limit"
                    continue
            if impaired and req.gpu is not None:
                assert pool is not None
                if (can := possible.get(req.gpu)) is None:
                    can = possible[req.gpu] = pool.possible(req.gpu)
                if not can:  # its GPUs are broken or drained for now: it is no head
                    wait_reasons[req.job_id] = pool.wait_reason(req.gpu)
                    continue
            if head is None:
                if cap.fits(req):
                    cap.take(req, started_at=now)
                    started.append(req)
                    continue
                head, reserved = req, self._reservation(req, now)
                continue
            # Behind a head that waits: what takes nothing it waits for, or what is sure
            # to end before its reserved start (not while jobs are being preempted for
            # it: what they free is the head's, or a victim would take back its own GPU).
            if ((self._apart(req, head) or (
                    reserved is not None and req.expected is not None and not preempting
                    and now + req.expected <= reserved)) and cap.fits(req)):
                cap.take(req, started_at=now)
                started.append(req)
        for req in started:
            del self._requests[req.job_id]
        self.preempt = []
        if head is not None and not head.interruptible:
            self.preempt = [r.job_id for r in self._victims(head)]
        if head is not None:  # said after the backfill, so the free counts are current
            wait_reasons[head.job_id] = self._head_wait_reason(head, reserved, now)
            if self.preempt or any(j in self.stopping for j in self.capacity.running):
                wait_reasons[head.job_id] += "; preempting interruptible jobs for it"
        self.etas = {head.job_id: reserved} if head is not None and reserved else {}
        self.wait_reasons = wait_reasons
        self._last_order = order
        self._place = None  # worked out when a hold is first asked for
        return started

    def wait_reason(self, job_id: int) -> str | None:
        req = self._requests.get(job_id)
        if req is None:
            return None
        if (why := self.blocked.get(req.runtime)) is not None:
            return why
        if job_id in self.wait_reasons:
            return self.wait_reasons[job_id]
        if self._place is None:
            self._place = {r.job_id: i for i, r in enumerate(
                r for r in self._last_order if r.job_id in self._requests)}
        ahead = self._place.get(job_id)
        if ahead is None or ahead == 0:
            return "waiting for the scheduler"  # queued since the last pass
        return f"queued behind {ahead} job{'s' if ahead != 1 else ''}"

    def _apart(self, req: Request, head: Request) -> bool:
        """Whether `req` leaves the head's share alone: no GPU the head could use, and the
        head's CPU and memory still free after it."""
        cap = self.capacity
        if req.gpu is not None and head.gpu is not None and (
                req.gpu.model is None or head.gpu.model is None
                or req.gpu.model == head.gpu.model):
            return False  # it could take a GPU the head waits for
        left = cap.disk_left()
        return (cap.cpu_m - cap.used_cpu_m - req.cpu_m >= head.cpu_m
                and cap.memory - cap.used_memory - req.memory >= head.memory
                # One that reserves no disk leaves the head's reservation alone (it may
                # write, as every job does, but holding back all such jobs behind a head
                # that waits for disk would stall the box).
                and (not head.disk or not req.disk or left is None
                     or left - req.disk >= head.disk))

    def _over_limit(self, req: Request) -> str | None:
        jobs, gpus = self.capacity.by_user.get(req.owner_uid, (0, 0))
        limit = self.limits
        if limit.max_jobs is not None and jobs + 1 > limit.max_jobs:
            return f"user limit {jobs}/{limit.max_jobs} running jobs"
        if (limit.max_gpus is not None and req.gpu_count
                and gpus + req.gpu_count > limit.max_gpus):
            return f"user limit {gpus}/{limit.max_gpus} GPUs"
        return None

    def _victims(self, head: Request) -> list[Request]:
        """The fewest running interruptible jobs (of no higher priority; lowest priority,
        then the most recently started, first) whose share would let the head start;
        none when even all of them would not."""
        cap = self.capacity
        pool, gpu = cap.gpus, head.gpu
        free = [cap.cpu_m - cap.used_cpu_m, cap.memory - cap.used_memory,
                len(pool.free(gpu)) if pool is not None and gpu is not None else 0]

        def add(req: Request) -> None:
            free[0] += req.cpu_m
            free[1] += req.memory
            free[2] += self._usable_held(req.job_id, gpu)

        def fits() -> bool:
            return (free[0] >= head.cpu_m and free[1] >= head.memory
                    and free[2] >= (gpu.count if gpu is not None else 0))

        for job_id in self.stopping:
            if job_id in cap.running:
                add(cap.running[job_id][0])
        if fits():
            return []  # what is being stopped already makes room
        candidates = sorted(
            (req for job_id, (req, _) in cap.running.items()
             if req.interruptible and job_id not in self.stopping
             and req.priority <= head.priority),
            key=lambda r: (r.priority, -cap.started.get(r.job_id, 0.0)))
        victims = []
        for req in candidates:
            victims.append(req)
            add(req)
            if fits():
                return victims
        return []

    def _usable_held(self, job_id: int, gpu: GpuRequest | None) -> int:
        """How many of a running job's GPUs the request `gpu` could use once it ends."""
        pool = self.capacity.gpus
        if pool is None or gpu is None:
            return 0
        by_uuid = pool.inventory.by_uuid()
        return sum(1 for u in pool.by_job.get(job_id, [])
                   if u in by_uuid and pool.matches(by_uuid[u], gpu)
                   and pool.busy(by_uuid[u]) is None)

    def _reservation(self, req: Request, now: float) -> float | None:
        """When the head could start, if the running jobs end when they expect to; None
        when that depends on a job without an expected duration."""
        cap = self.capacity
        free_cpu, free_mem = cap.cpu_m - cap.used_cpu_m, cap.memory - cap.used_memory
        pool, gpu = cap.gpus, req.gpu
        free_gpus = len(pool.free(gpu)) if pool is not None and gpu is not None else 0
        need_gpus = gpu.count if gpu is not None else 0
        left = cap.disk_left()
        free_disk = left if left is not None and req.disk else req.disk

        def enough() -> bool:
            return (free_cpu >= req.cpu_m and free_mem >= req.memory
                    and free_gpus >= need_gpus and free_disk >= req.disk)

        ends = sorted(cap.running.values(), key=lambda item: (item[1] is None, item[1] or 0))
        self._freed_by = None
        for running, end in ends:
            if enough():
                break
            if end is None:
                return None
            free_cpu += running.cpu_m
            free_mem += running.memory
            free_gpus += self._usable_held(running.job_id, gpu)
            free_disk += running.disk
            now = max(now, end)
            self._freed_by = running.job_id
        return now if enough() else None

    def _head_wait_reason(self, req: Request, reserved: float | None, now: float) -> str:
        cap = self.capacity
        if req.gpu is not None and cap.gpus is not None and cap.gpus.pick(req.gpu) is None:
            why = cap.gpus.wait_reason(req.gpu)
        else:
            free_cpu = cap.cpu_m - cap.used_cpu_m
            free_mem = cap.memory - cap.used_memory
            left = cap.disk_left()
            if req.cpu_m > free_cpu:
                unit = "CPU" if req.cpu_m == 1000 else "CPUs"
                why = f"needs {fmt_cpu(req.cpu_m)} {unit}, {fmt_cpu(max(free_cpu, 0))} free"
            elif req.disk and left is not None and req.disk > left:
                why = (f"needs {fmt_bytes(req.disk)} disk, {fmt_bytes(max(left, 0))} free "
                       "above the reserve less what running jobs reserved")
            else:
                why = (f"needs {fmt_bytes(req.memory)} memory, "
                       f"{fmt_bytes(max(free_mem, 0))} free")
        if reserved is not None and reserved > now:
            freer = self._freed_by
            name = self.describe(freer) if freer is not None else None
            why += (f"; job {name} frees what it needs in ~{_minutes(reserved - now)}"
                    if name else f"; expected to start in ~{_minutes(reserved - now)}")
        return why


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
