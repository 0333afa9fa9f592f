"""Queue order and admission: pure logic, no I/O.

Order: priority (higher first), interruptible jobs last within it, then fair share (the
user with the fewest decayed GPU-hours first), then submission. A job whose user is at a
per-user limit, whose runtime cannot start anything, or whose GPUs are broken or drained
for now, is passed over without holding up the rest. The first job that does not fit is
the head: behind it starts only what takes nothing the head waits for (no GPU it could
use, and CPU and memory to spare), or what, by its expected_duration, ends before the
start reserved for the head (backfill); so a big job is never starved. A head that is not
interruptible may preempt running interruptible jobs. Each waiting job gets a hold.

A pass reads the order from buckets kept sorted (pending.py) rather than sorting every
job, and once nothing more can start it stops walking jobs one by one: what is left only
gets its wait reason, which then depends on its owner alone (see _Pass).
"""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from noduslocal.daemon.scheduler.capacity import Capacity, Request, fmt_cpu
from noduslocal.daemon.scheduler.pending import JOB_ID, Group, Pending
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
    _pending: Pending = field(default_factory=Pending)
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
        return len(self._pending)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self._pending.by_id

    def push(self, req: Request) -> None:
        self._pending.add(req)

    def remove(self, job_id: int) -> Request | None:
        req = self._pending.remove(job_id)
        self.wait_reasons.pop(job_id, None)
        self._place = None
        return req

    def request(self, job_id: int) -> Request | None:
        return self._pending.by_id.get(job_id)

    def replace(self, req: Request) -> None:
        """A queued job's request changed (its priority): the next pass orders by it."""
        if self._pending.replace(req):
            self._place = None

    def last_order(self) -> list[Request]:
        """The order of the last pass (what the holds describe), newer arrivals last."""
        seen = {r.job_id for r in self._last_order}
        return self._last_order + sorted((r for r in self._pending.by_id.values()
                                          if r.job_id not in seen), key=lambda r: r.job_id)

    def order(self) -> list[Request]:
        # Interruptible jobs are opportunistic: behind every other job of their priority,
        # so a preempted one never takes back what it was stopped for.
        order: list[Request] = []
        for reqs, _ in self._pending.groups(self.usage):
            order += reqs
        return order

    def schedule(self) -> list[Request]:
        """Take every request that may start now; set the holds of the rest."""
        now = self.clock()
        groups = self._pending.groups(self.usage)
        order: list[Request] = []
        for reqs, _ in groups:
            order += reqs
        run = _Pass(self, now)
        run.walk(groups)
        started, head, reserved, wait_reasons = run.started, run.head, run.reserved, \
            run.wait_reasons
        self._pending.remove_started(started)
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
        req = self._pending.by_id.get(job_id)
        if req is None:
            return None
        if (why := self.blocked.get(req.runtime)) is not None:
            return why
        if job_id in self.wait_reasons:
            return self.wait_reasons[job_id]
        if self._place is None:
            self._place = {r.job_id: i for i, r in enumerate(
                r for r in self._last_order if r.job_id in self._pending.by_id)}
        ahead = self._place.get(job_id)
        if ahead is None or ahead == 0:
            return "waiting for the scheduler"  # queued since the last pass
        return f"queued behind {ahead} job{'s' if ahead != 1 else ''}"

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


_NONE_HELD = (0, 0)


class _Pass:
    """One pass down the queue order and what it found: the jobs it starts, the head, the
    head's reserved start, the wait reasons.

    Every check a job meets only turns from yes to no as the pass starts jobs (CPU, memory
    and free GPUs shrink, owners' counts grow). So once no pending job could fit what is
    left (by the least CPU and memory any asks, and whether any GPU is free), nothing more
    starts, and what remains only gets its wait reason, which then depends on its owner
    (held, at a limit) and its GPU request alone, not on its place: settled per owner,
    most owners at once. Answers of the GPU pool are kept until a start takes GPUs.
    """

    def __init__(self, queue: Queue, now: float) -> None:
        self.queue, self.now = queue, now
        cap = self.cap = queue.capacity
        pool = self.pool = cap.gpus
        self.max_jobs, self.max_gpus = queue.limits.max_jobs, queue.limits.max_gpus
        self.limited = self.max_jobs is not None or self.max_gpus is not None
        self.blocked, self.held_users = queue.blocked, queue.held_users
        self.impaired = pool is not None and any(  # some GPU unusable for now
            not g.healthy or g.mig or g.uuid in pool.drained for g in pool.inventory.gpus)
        # Whether a job that gets no start may still get a reason of its own.
        self.recording = bool(self.held_users) or self.limited or self.impaired
        self.preempting = any(job_id in cap.running for job_id in queue.stopping)
        self.started: list[Request] = []
        self.wait_reasons: dict[int, str] = {}
        self.head: Request | None = None
        self.reserved: float | None = None
        self.short_ok = False  # whether a job may pass the head by ending before its start
        self._possible: dict[GpuRequest, bool] = {}
        self._pickable: dict[GpuRequest, bool] = {}
        self._gpu_why: dict[GpuRequest, str] = {}
        self._gpu_free: bool | None = None
        self._limit_why: dict[tuple[int, int, int], str] = {}
        self._least: tuple[int, int, int | None, int | None] | None = None

    def walk(self, groups: list[Group]) -> None:
        # Inlined and in locals: this loop may walk every pending job on every pass.
        cap, now, queue = self.cap, self.now, self.queue
        blocked, held_users, by_user = self.blocked, self.held_users, cap.by_user
        limited, max_jobs, max_gpus = self.limited, self.max_jobs, self.max_gpus
        impaired, wait_reasons = self.impaired, self.wait_reasons
        cpu_total, mem_total = cap.cpu_m, cap.memory
        head: Request | None = None
        head_gpu: GpuRequest | None = None
        head_model: str | None = None
        head_cpu = head_mem = head_disk = used_cpu = used_mem = 0
        left: int | None = None
        reserved, short_ok, frozen = 0.0, False, False
        for reqs, owners in groups:
            if frozen:
                if not self.recording:
                    break
                for uid, bucket in owners:
                    self._settle(uid, bucket)
                continue
            if len(owners) == 1 and self._whole(owners[0][0], reqs):
                continue
            for req in reqs:
                if blocked and req.runtime in blocked:
                    continue
                uid = req.owner_uid
                if held_users and uid in held_users:
                    wait_reasons[req.job_id] = held_users[uid]
                    continue
                gpu = req.gpu
                if limited:
                    held = by_user.get(uid, _NONE_HELD)
                    if ((max_jobs is not None and held[0] >= max_jobs)
                            or (max_gpus is not None and gpu is not None
                                and held[1] + gpu.count > max_gpus)):
                        wait_reasons[req.job_id] = self._limit_reason(held, req)
                        continue
                if impaired and gpu is not None and not self._can(gpu):
                    # Its GPUs are broken or drained for now: it is no head.
                    wait_reasons[req.job_id] = self._gpu_reason(gpu)
                    continue
                if head is None:
                    if cap.fits(req):
                        self._take(req)
                        continue
                    head = self.head = req
                    self.reserved = queue._reservation(req, now)
                    short_ok = self.short_ok = (self.reserved is not None
                                                and not self.preempting)
                    reserved = self.reserved or 0.0
                    head_gpu, head_cpu, head_mem, head_disk = (
                        req.gpu, req.cpu_m, req.memory, req.disk)
                    head_model = head_gpu.model if head_gpu is not None else None
                    used_cpu, used_mem, left = cap.used_cpu_m, cap.used_memory, cap.disk_left()
                    if self._frozen():
                        frozen = True
                        self._reasons(reqs[bisect_right(reqs, req.job_id, key=JOB_ID):])
                        break
                    continue
                # Behind a head that waits: what takes nothing it waits for, or what is
                # sure to end before its reserved start (not while jobs are being
                # preempted for it: what they free is the head's, or a victim would take
                # back its own GPU); and in either case what fits.
                cpu_m, memory, disk = req.cpu_m, req.memory, req.disk
                if (used_cpu + cpu_m > cpu_total or used_mem + memory > mem_total
                        or (disk and left is not None and disk > left)):
                    continue
                if not (short_ok and (expected := req.expected) is not None
                        and now + expected <= reserved):
                    if gpu is not None and head_gpu is not None and (
                            gpu.model is None or head_model is None
                            or gpu.model == head_model):
                        continue  # it could take a GPU the head waits for
                    if (cpu_total - used_cpu - cpu_m < head_cpu
                            or mem_total - used_mem - memory < head_mem
                            # One that reserves no disk leaves the head's reservation
                            # alone (it may write, as every job does, but holding back
                            # all such jobs behind a head that waits for disk would
                            # stall the box).
                            or (head_disk and disk and left is not None
                                and left - disk < head_disk)):
                        continue  # it would take the head's CPU, memory or disk
                if gpu is not None and not self._fits_gpu(gpu):
                    continue
                self._take(req)
                used_cpu, used_mem, left = cap.used_cpu_m, cap.used_memory, cap.disk_left()
                if self._frozen():
                    frozen = True
                    self._reasons(reqs[bisect_right(reqs, req.job_id, key=JOB_ID):])
                    break

    def _take(self, req: Request) -> None:
        self.cap.take(req, started_at=self.now)
        self.started.append(req)
        if req.gpu is not None:  # the pool changed: its answers so far may not hold
            self._pickable.clear()
            self._gpu_why.clear()
            self._gpu_free = None

    def _frozen(self) -> bool:
        """Whether no pending job can start any more in this pass (the head is found)."""
        cap, head = self.cap, self.head
        assert head is not None
        if self._least is None:  # read once: the pending index changes after the pass
            self._least = self.queue._pending.least()
        least_cpu, least_mem, alone_cpu, alone_mem = self._least
        free_cpu, free_mem = cap.cpu_m - cap.used_cpu_m, cap.memory - cap.used_memory
        if not self.short_ok:  # only what leaves the head's share alone may pass it
            free_cpu -= head.cpu_m
            free_mem -= head.memory
        if free_cpu < least_cpu or free_mem < least_mem:
            return True
        gpus_out = not self._any_gpu_free() or (
            not self.short_ok and head.gpu is not None and head.gpu.model is None)
        return gpus_out and (alone_cpu is None or alone_mem is None or free_cpu < alone_cpu
                             or free_mem < alone_mem)

    def _any_gpu_free(self) -> bool:
        if self._gpu_free is None:
            pool = self.pool
            self._gpu_free = pool is not None and any(
                g.uuid not in pool.holder and pool.busy(g) is None
                for g in pool.inventory.gpus)
        return self._gpu_free

    def _whole(self, uid: int, reqs: list[Request]) -> bool:
        """Settle a run of one owner's jobs at once when none of them may start: the owner
        is held, or at the job limit (only their own starts could change that)."""
        if self.held_users and uid in self.held_users:
            self._all(reqs, self.held_users[uid])
            return True
        if self.max_jobs is not None:
            held = self.cap.by_user.get(uid, _NONE_HELD)
            if held[0] >= self.max_jobs:
                self._all(reqs, self._limit_reason(held, reqs[0]))
                return True
        return False

    def _settle(self, uid: int, reqs: list[Request]) -> None:
        """The wait reasons of an owner's jobs once nothing more starts."""
        if self._whole(uid, reqs):
            return
        if self.max_gpus is not None:
            counts = self.queue._pending.gpu_counts.get(uid)
            held = self.cap.by_user.get(uid, _NONE_HELD)
            if counts and held[1] + max(counts) > self.max_gpus:
                self._reasons(reqs)  # some may be over the GPU limit
                return
        if self.impaired:
            self._reasons(reqs)

    def _reasons(self, reqs: list[Request]) -> None:
        """The wait reasons of jobs that cannot start, one by one: the walk's own checks,
        which it inlines (as a method called per job they made the walk case half again as
        slow: 10.5 -> 16.1 ms at 40,000, scripts/bench/schedule_pass.py)."""
        if not self.recording:
            return
        blocked, held_users, by_user = self.blocked, self.held_users, self.cap.by_user
        limited, max_jobs, max_gpus = self.limited, self.max_jobs, self.max_gpus
        impaired, wait_reasons = self.impaired, self.wait_reasons
        for req in reqs:
            if blocked and req.runtime in blocked:
                continue
            uid = req.owner_uid
            if held_users and uid in held_users:
                wait_reasons[req.job_id] = held_users[uid]
                continue
            gpu = req.gpu
            if limited:
                held = by_user.get(uid, _NONE_HELD)
                if ((max_jobs is not None and held[0] >= max_jobs)
                        or (max_gpus is not None and gpu is not None
                            and held[1] + gpu.count > max_gpus)):
                    wait_reasons[req.job_id] = self._limit_reason(held, req)
                    continue
            if impaired and gpu is not None and not self._can(gpu):
                wait_reasons[req.job_id] = self._gpu_reason(gpu)

    def _all(self, reqs: list[Request], why: str) -> None:
        blocked = self.blocked  # a blocked runtime's jobs show its reason instead
        ids = ([r.job_id for r in reqs if r.runtime not in blocked] if blocked
               else map(JOB_ID, reqs))
        self.wait_reasons.update(dict.fromkeys(ids, why))

    def _limit_reason(self, held: tuple[int, int] | list[int], req: Request) -> str:
        key = (held[0], held[1], req.gpu_count)
        if (why := self._limit_why.get(key)) is None:
            why = self._limit_why[key] = self.queue._over_limit(req) or "user limit"
        return why

    def _can(self, gpu: GpuRequest) -> bool:
        if (can := self._possible.get(gpu)) is None:
            assert self.pool is not None
            can = self._possible[gpu] = self.pool.possible(gpu)
        return can

    def _gpu_reason(self, gpu: GpuRequest) -> str:
        if (why := self._gpu_why.get(gpu)) is None:
            assert self.pool is not None
            why = self._gpu_why[gpu] = self.pool.wait_reason(gpu)
        return why

    def _fits_gpu(self, gpu: GpuRequest) -> bool:
        if (fits := self._pickable.get(gpu)) is None:
            pool = self.pool
            fits = self._pickable[gpu] = pool is not None and pool.pick(gpu) is not None
        return fits


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
