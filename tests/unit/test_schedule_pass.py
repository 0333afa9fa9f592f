"""The scheduling pass against a straightforward reference: the queue as it was before
the pass read its order from sorted buckets and stopped walking once nothing could start
(sort every job, walk every job). On random queues and events both must start the same
jobs and leave the same wait reasons, etas, victims, order and capacity."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from noduslocal.daemon.gpus.model import GpuProcess
from noduslocal.daemon.gpus.service import simulated_inventory
from noduslocal.daemon.scheduler.capacity import Capacity, Request, fmt_cpu
from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.daemon.scheduler.queue import Limits, Queue
from noduslocal.domain.gpu_request import GpuRequest
from noduslocal.domain.units import fmt_bytes

GiB = 2**30


@dataclass
class Reference:
    """The pass as it was (noduslocal/daemon/scheduler/queue.py before issue 24's speed
    work), kept verbatim in its logic: sort everything, walk everything."""

    capacity: Capacity
    limits: Limits = field(default_factory=Limits)
    usage: Callable[[int], float] = lambda uid: 0.0
    clock: Callable[[], float] = time.time
    requests: dict[int, Request] = field(default_factory=dict)
    wait_reasons: dict[int, str] = field(default_factory=dict)
    etas: dict[int, float] = field(default_factory=dict)
    preempt: list[int] = field(default_factory=list)
    stopping: set[int] = field(default_factory=set)
    describe: Callable[[int], str | None] = lambda job_id: None
    freed_by: int | None = None
    last: list[Request] = field(default_factory=list)
    blocked: dict[str, str] = field(default_factory=dict)
    held_users: dict[int, str] = field(default_factory=dict)
    place: dict[int, int] | None = None

    def push(self, req: Request) -> None:
        self.requests.setdefault(req.job_id, req)

    def remove(self, job_id: int) -> Request | None:
        req = self.requests.pop(job_id, None)
        self.wait_reasons.pop(job_id, None)
        self.place = None
        return req

    def replace(self, req: Request) -> None:
        if req.job_id in self.requests:
            self.requests[req.job_id] = req
            self.place = None

    def last_order(self) -> list[Request]:
        seen = {r.job_id for r in self.last}
        return self.last + sorted((r for r in self.requests.values()
                                   if r.job_id not in seen), key=lambda r: r.job_id)

    def order(self) -> list[Request]:
        usage = {r.owner_uid: self.usage(r.owner_uid) for r in self.requests.values()}
        return sorted(self.requests.values(), key=lambda r: (
            -r.priority, r.interruptible, usage[r.owner_uid], r.job_id))

    def schedule(self) -> list[Request]:
        cap, now = self.capacity, self.clock()
        started: list[Request] = []
        wait_reasons: dict[int, str] = {}
        head: Request | None = None
        reserved: float | None = None
        order = self.order()
        pool = cap.gpus
        preempting = any(job_id in cap.running for job_id in self.stopping)
        impaired = pool is not None and any(
            not g.healthy or g.mig or g.uuid in pool.drained for g in pool.inventory.gpus)
        for req in order:
            if req.runtime in self.blocked:
                continue
            if req.owner_uid in self.held_users:
                wait_reasons[req.job_id] = self.held_users[req.owner_uid]
                continue
            held = cap.by_user.get(req.owner_uid, (0, 0))
            max_jobs, max_gpus = self.limits.max_jobs, self.limits.max_gpus
            if ((max_jobs is not None and held[0] >= max_jobs)
                    or (max_gpus is not None and req.gpu is not None
                        and held[1] + req.gpu.count > max_gpus)):
                wait_reasons[req.job_id] = self._over_limit(req) or "user limit"
                continue
            if impaired and req.gpu is not None:
                assert pool is not None
                if not pool.possible(req.gpu):
                    wait_reasons[req.job_id] = pool.wait_reason(req.gpu)
                    continue
            if head is None:
                if cap.fits(req):
                    cap.take(req, started_at=now)
                    started.append(req)
                    continue
                head, reserved = req, self._reservation(req, now)
                continue
            if ((self._apart(req, head) or (
                    reserved is not None and req.expected is not None and not preempting
                    and now + req.expected <= reserved)) and cap.fits(req)):
                cap.take(req, started_at=now)
                started.append(req)
        for req in started:
            del self.requests[req.job_id]
        self.preempt = []
        if head is not None and not head.interruptible:
            self.preempt = [r.job_id for r in self._victims(head)]
        if head is not None:
            wait_reasons[head.job_id] = self._head_wait_reason(head, reserved, now)
            if self.preempt or any(j in self.stopping for j in self.capacity.running):
                wait_reasons[head.job_id] += "; preempting interruptible jobs for it"
        self.etas = {head.job_id: reserved} if head is not None and reserved else {}
        self.wait_reasons = wait_reasons
        self.last = order
        self.place = None
        return started

    def wait_reason(self, job_id: int) -> str | None:
        req = self.requests.get(job_id)
        if req is None:
            return None
        if (why := self.blocked.get(req.runtime)) is not None:
            return why
        if job_id in self.wait_reasons:
            return self.wait_reasons[job_id]
        if self.place is None:
            self.place = {r.job_id: i for i, r in enumerate(
                r for r in self.last if r.job_id in self.requests)}
        ahead = self.place.get(job_id)
        if ahead is None or ahead == 0:
            return "waiting for the scheduler"
        return f"queued behind {ahead} job{'s' if ahead != 1 else ''}"

    def _apart(self, req: Request, head: Request) -> bool:
        cap = self.capacity
        if req.gpu is not None and head.gpu is not None and (
                req.gpu.model is None or head.gpu.model is None
                or req.gpu.model == head.gpu.model):
            return False
        left = cap.disk_left()
        return (cap.cpu_m - cap.used_cpu_m - req.cpu_m >= head.cpu_m
                and cap.memory - cap.used_memory - req.memory >= head.memory
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
            return []
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
        pool = self.capacity.gpus
        if pool is None or gpu is None:
            return 0
        by_uuid = pool.inventory.by_uuid()
        return sum(1 for u in pool.by_job.get(job_id, [])
                   if u in by_uuid and pool.matches(by_uuid[u], gpu)
                   and pool.busy(by_uuid[u]) is None)

    def _reservation(self, req: Request, now: float) -> float | None:
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
        self.freed_by = None
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
            self.freed_by = running.job_id
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
            name = self.describe(self.freed_by) if self.freed_by is not None else None
            minutes = reserved - now
            text = f"{minutes:.0f} s" if minutes < 90 else f"{minutes / 60:.0f} min"
            why += (f"; job {name} frees what it needs in ~{text}"
                    if name else f"; expected to start in ~{text}")
        return why


# Two worlds fed the same events: the queue under test and the reference.

class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


BOXES = ("4xH100", "4xH100,2xL4", "8xH100", "2xH100,2xL4,2xA10")
MODELS = (None, None, None, "H100", "L4", "A10")
USAGE = (0.0, 0.0, 1.0, 2.5, 7.0)  # few values: owners' usage often ties


@dataclass
class World:
    queue: Queue | Reference
    pool: GpuPool


def worlds(rnd: random.Random, clock: Clock, usage: dict[int, float],
           big: bool = False) -> tuple[World, World]:
    """`big`: a box with room for hundreds of jobs and no per-user limits."""
    box = rnd.choice(BOXES)
    cpu = 256_000 if big else rnd.choice((4000, 16_000, 64_000))
    memory = (1024 if big else rnd.choice((16, 64, 512))) * GiB
    disk = rnd.choice((None, 50 * GiB))
    limits = Limits() if big else rnd.choice((
        Limits(), Limits(max_gpus=2), Limits(max_jobs=3), Limits(max_gpus=4, max_jobs=8)))
    made = []
    for kind in (Queue, Reference):
        pool = GpuPool(simulated_inventory(box))
        cap = Capacity(cpu, memory, disk_free=disk, gpus=pool)
        made.append(World(kind(cap, limits=limits, usage=lambda uid: usage.get(uid, 0.0),
                               clock=clock,
                               describe=lambda j: f"job-{j}" if j % 3 else None), pool))
    return made[0], made[1]


def request(rnd: random.Random, job_id: int) -> Request:
    gpu = None
    if rnd.random() < 0.6:
        count = rnd.choice((1, 1, 1, 2, 4))
        gpu = GpuRequest(count, rnd.choice(MODELS),
                         48 * GiB if rnd.random() < 0.1 else None)
    ranks = 2 if gpu is not None and gpu.count % 2 == 0 and rnd.random() < 0.2 else 1
    return Request(job_id, rnd.choice((500, 1000, 1000, 2000, 4000)),
                   rnd.choice((GiB // 2, GiB, 4 * GiB)),
                   runtime=rnd.choice(("process", "process", "docker")), gpu=gpu,
                   owner_uid=rnd.randrange(6), priority=rnd.choice((0, 0, 0, 1, 5)),
                   expected=rnd.choice((None, 60.0, 600.0, 7200.0)),
                   interruptible=rnd.random() < 0.2,
                   disk=rnd.choice((0, 0, 0, GiB, 20 * GiB)), ranks=ranks)


def compare(new: Queue, ref: Reference, started: list[Request],
            ref_started: list[Request]) -> None:
    assert [r.job_id for r in started] == [r.job_id for r in ref_started]
    assert new.preempt == ref.preempt
    assert new.etas == ref.etas
    assert new.wait_reasons == ref.wait_reasons  # read as is once a runtime is unblocked
    assert [r.job_id for r in new.last_order()] == [r.job_id for r in ref.last_order()]
    assert [r.job_id for r in new.order()] == [r.job_id for r in ref.order()]
    assert len(new) == len(ref.requests)
    for job_id in ref.requests:
        assert job_id in new
        assert new.wait_reason(job_id) == ref.wait_reason(job_id), job_id
    a, b = new.capacity, ref.capacity
    assert (a.used_cpu_m, a.used_memory, a.used_disk) == (b.used_cpu_m, b.used_memory,
                                                           b.used_disk)
    assert {j: (r.job_id, end) for j, (r, end) in a.running.items()} == \
        {j: (r.job_id, end) for j, (r, end) in b.running.items()}
    assert a.by_user == b.by_user
    assert a.gpus is not None and b.gpus is not None
    assert a.gpus.by_job == b.gpus.by_job


def play(seed: int, steps: list[tuple[int, int]], batch: int = 6, big: bool = False,
         ) -> None:
    """Apply the same random events to both worlds, comparing after every pass."""
    rnd = random.Random(seed)
    clock, usage = Clock(), {}
    new, ref = worlds(rnd, clock, usage, big)
    next_id = 1
    known: dict[int, Request] = {}
    requeue: list[Request] = []
    for kind, arg in steps:
        r = random.Random(arg)
        q, o = new.queue, ref.queue
        assert isinstance(q, Queue) and isinstance(o, Reference)
        if kind <= 4:  # jobs arrive
            for _ in range(r.randint(1, batch)):
                req = known[next_id] = request(r, next_id)
                next_id += 1
                q.push(req)
                o.push(req)
        elif kind == 5 and q.capacity.running:  # a running job ends, maybe queued again
            job_id = r.choice(sorted(q.capacity.running))
            for world in (new, ref):
                world.queue.capacity.give(world.queue.capacity.running[job_id][0])
                world.queue.stopping.discard(job_id)
            if r.random() < 0.5:  # lost or preempted: the same job comes back later
                requeue.append(known[job_id])
        elif kind == 6 and requeue:
            req = requeue.pop(r.randrange(len(requeue)))
            q.push(req)
            o.push(req)
        elif kind == 7 and o.requests:  # cancelled while pending
            job_id = r.choice(sorted(o.requests))
            assert q.remove(job_id) is not None and o.remove(job_id) is not None
        elif kind == 8 and o.requests:  # its priority changed
            job_id = r.choice(sorted(o.requests))
            changed = replace(o.requests[job_id], priority=r.choice((0, 1, 5, -1)))
            q.replace(changed)
            o.replace(changed)
        elif kind == 9:  # an admin holds or releases a user
            uid = r.randrange(6)
            for queue in (q, o):
                if uid in queue.held_users:
                    del queue.held_users[uid]
                else:
                    queue.held_users[uid] = f"held by root: user {uid}"
        elif kind == 10:  # dockerd comes and goes
            for queue in (q, o):
                if "docker" in queue.blocked:
                    del queue.blocked["docker"]
                else:
                    queue.blocked["docker"] = "dockerd unreachable: not running"
        elif kind == 11:  # a GPU breaks, is drained, is taken by a foreign process
            index = r.randrange(len(new.pool.inventory.gpus))
            what = r.randrange(5)
            for world in (new, ref):
                gpu = world.pool.inventory.gpus[index]
                if what == 0:
                    gpu.healthy, gpu.problem = not gpu.healthy, "Xid 79"
                elif what == 1:
                    world.pool.drained ^= {gpu.uuid}
                elif what == 2:
                    gpu.mig = not gpu.mig
                elif what == 3:
                    gpu.processes = [] if gpu.processes else [GpuProcess(42, GiB, "eve")]
                else:
                    gpu.memory_used = 0 if gpu.memory_used else 3 * GiB
        elif kind == 12 and o.capacity.running:  # a victim is being stopped
            job_id = r.choice(sorted(o.capacity.running))
            q.stopping.add(job_id)
            o.stopping.add(job_id)
        elif kind == 13:  # fair share moves
            usage[r.randrange(6)] = r.choice(USAGE)
        elif kind == 14:
            clock.now += r.choice((1.0, 30.0, 600.0, 3600.0))
        elif kind == 15:  # the disk fills or frees
            free = r.choice((None, 0, 10 * GiB, 50 * GiB))
            q.capacity.disk_free = o.capacity.disk_free = free
        elif kind == 16:  # a sweep's cells: many alike jobs of one owner
            cell = request(r, 0)
            for _ in range(r.randint(1, 8 * batch)):
                req = known[next_id] = replace(cell, job_id=next_id)
                next_id += 1
                q.push(req)
                o.push(req)
        started, ref_started = q.schedule(), o.schedule()
        compare(q, o, started, ref_started)


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.tuples(st.integers(0, 16), st.integers(0, 2**32)),
                                       min_size=1, max_size=60))
def test_the_pass_matches_the_reference_on_random_queues(
        seed: int, steps: list[tuple[int, int]]) -> None:
    play(seed, steps)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**32), st.lists(st.tuples(st.integers(0, 16), st.integers(0, 2**32)),
                                       min_size=1, max_size=30))
def test_the_pass_matches_the_reference_on_long_queues(
        seed: int, steps: list[tuple[int, int]]) -> None:
    """Batches of up to 200 jobs: many jobs of one owner start in one pass, ties of
    usage interleave owners, and the walk stops early with much left to settle."""
    play(seed, steps, batch=200)


def test_the_pass_matches_the_reference_with_hundreds_starting_at_once() -> None:
    """Fixed seeds on a big box: sweeps of hundreds of alike cells, most of one owner's
    bucket starting in one pass, ends and requeues in between."""
    for seed in range(12):
        rnd = random.Random(seed)
        steps = [(16, rnd.randrange(2**32)), *((rnd.choice((0, 5, 5, 5, 6, 13, 14, 16)),
                                                rnd.randrange(2**32)) for _ in range(25))]
        play(seed, steps, batch=60, big=True)


def test_a_wait_reason_counts_the_gpus_free_where_the_job_stands() -> None:
    """Two jobs wait on broken GPUs with the same request, and a job between them takes a
    GPU: the second one's reason counts one GPU fewer free, as the reference's does."""
    broken = Request(1, 1000, GiB, gpu=GpuRequest(4, "H100"), owner_uid=1)
    small = Request(2, 1000, GiB, gpu=GpuRequest(1, "H100"), owner_uid=1)
    later = replace(broken, job_id=3)
    results = []
    for kind in (Queue, Reference):
        pool = GpuPool(simulated_inventory("4xH100"))
        pool.inventory.gpus[0].healthy, pool.inventory.gpus[0].problem = False, "Xid 79"
        queue = kind(Capacity(64_000, 64 * GiB, gpus=pool))
        for req in (broken, small, later):
            queue.push(req)
        results.append(([r.job_id for r in queue.schedule()], queue.wait_reason(1),
                         queue.wait_reason(3)))
    assert results[0] == results[1]
    assert results[0][0] == [2]
    assert "needs 4 x H100, 3 free" in (results[0][1] or "")
    assert "needs 4 x H100, 2 free" in (results[0][2] or "")
