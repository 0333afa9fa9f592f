"""Queue order on a simulated clock: priority, fair share between users, per-user limits,
and backfill that never delays a big job at the head."""

from __future__ import annotations

from noduslocal.daemon.gpus.service import simulated_inventory
from noduslocal.daemon.scheduler.fairshare import Ledger
from noduslocal.daemon.scheduler.gpus import GpuPool
from noduslocal.daemon.scheduler.queue import Capacity, Limits, Queue, Request
from noduslocal.domain.gpu_request import GpuRequest

GiB = 2**30
ALICE, BOB = 1001, 1002


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def gpu_queue(clock: Clock, ledger: Ledger | None = None, limits: Limits | None = None,
              n: int = 4) -> Queue:
    pool = GpuPool(simulated_inventory(f"{n}xH100"))
    ledger = ledger or Ledger(3600)
    queue = Queue(Capacity(64_000, 256 * GiB, gpus=pool), limits=limits or Limits(),
                  clock=clock)

    def usage(uid: int) -> float:
        cap = queue.capacity
        running = sum(r.gpu_count * (clock.now - cap.started[j]) / 3600
                      for j, (r, _) in cap.running.items() if r.owner_uid == uid)
        return ledger.value(uid, clock.now) + running

    queue.usage = usage
    return queue


def job(job_id: int, uid: int, gpus: int = 1, *, priority: int = 0,
        expected: float | None = None) -> Request:
    return Request(job_id, 1000, GiB, gpu=GpuRequest(gpus), owner_uid=uid,
                   priority=priority, expected=expected)


def test_priority_then_fair_share_then_submission() -> None:
    clock, ledger = Clock(), Ledger(3600)
    ledger.charge(ALICE, 10.0, clock.now)
    q = gpu_queue(clock, ledger, n=1)
    q.push(job(1, ALICE))
    q.push(job(2, BOB))
    q.push(job(3, ALICE, priority=5))
    assert [r.job_id for r in q.order()] == [3, 2, 1]
    assert [r.job_id for r in q.schedule()] == [3]
    assert "needs 1 x GPU, 0 free" in (q.wait_reason(2) or "")
    assert q.wait_reason(1) == "queued behind 1 job"


def test_user_limits_pass_over_without_blocking_others() -> None:
    q = gpu_queue(Clock(), limits=Limits(max_gpus=2, max_jobs=3))
    for i in range(1, 4):
        q.push(job(i, ALICE))
    q.push(job(4, BOB))
    assert [r.job_id for r in q.schedule()] == [1, 2, 4]
    assert q.wait_reason(3) == "user limit 2/2 GPUs"


def test_second_user_is_not_stuck_behind_the_first_users_backlog() -> None:
    """Alice submits 20 one-GPU jobs of 10 minutes, Bob 5 a little later: Bob's start
    before Alice's backlog is done, and a 4-GPU job submitted later still starts."""
    clock = Clock()
    ledger = Ledger(3600)
    q = gpu_queue(clock, ledger)
    for i in range(1, 21):
        q.push(job(i, ALICE, expected=600))
    running = {r.job_id: clock.now for r in q.schedule()}
    clock.now += 60
    for i in range(21, 26):
        q.push(job(i, BOB, expected=600))
    clock.now += 60
    q.push(job(26, ALICE, gpus=4))  # no expected duration: cannot be backfilled around
    started_at: dict[int, float] = {}
    while q or q.capacity.running:
        for job_id, began in list(running.items()):
            if clock.now - began >= 600:
                req, _ = q.capacity.running[job_id]
                ledger.charge(req.owner_uid, req.gpu_count * (clock.now - began) / 3600,
                              clock.now)
                q.capacity.give(req)
                del running[job_id]
        for req in q.schedule():
            running[req.job_id] = clock.now
            started_at[req.job_id] = clock.now
        clock.now += 30
        assert clock.now < 1_000_000 + 48 * 3600, "the queue never drained"
    bob_done = max(started_at[i] for i in range(21, 26))
    alice_last = max(started_at[i] for i in range(5, 21))
    assert bob_done < alice_last  # Bob did not wait for Alice's whole backlog
    # The 4-GPU job started, and no 1-GPU job submitted before it waited past it forever.
    assert 26 in started_at


def test_backfill_only_what_ends_before_the_heads_reserved_start() -> None:
    clock = Clock()
    q = gpu_queue(clock)
    q.push(job(1, ALICE, gpus=3, expected=3600))
    assert [r.job_id for r in q.schedule()] == [1]
    q.push(job(2, BOB, gpus=2))  # the head: waits for job 1, about an hour
    q.push(job(3, BOB, gpus=1, expected=600))  # ends well before: may go
    q.push(job(4, BOB, gpus=1, expected=7200))  # would delay the head: may not
    q.push(job(5, BOB, gpus=1))  # no expected duration: may not
    assert [r.job_id for r in q.schedule()] == [3]
    hold = q.wait_reason(2) or ""
    assert "needs 2 x GPU, 0 free" in hold and "expected to start in ~60 min" in hold
    clock.now += 3600
    q.capacity.give(q.capacity.running[1][0])
    q.capacity.give(q.capacity.running[3][0])
    assert next(r.job_id for r in q.schedule()) == 2


def test_no_backfill_when_the_head_waits_on_a_job_without_an_expected_end() -> None:
    clock = Clock()
    q = gpu_queue(clock)
    q.push(job(1, ALICE, gpus=3))  # runs with no expected duration
    q.schedule()
    q.push(job(2, BOB, gpus=2))
    q.push(job(3, BOB, gpus=1, expected=1))
    assert q.schedule() == []


def test_a_waiting_job_preempts_interruptible_ones_and_they_do_not_take_it_back() -> None:
    clock = Clock()
    q = gpu_queue(clock)
    spot = [Request(i, 1000, GiB, gpu=GpuRequest(1), owner_uid=ALICE, interruptible=True)
            for i in (1, 2, 3, 4)]
    for req in spot:
        q.push(req)
        clock.now += 1  # 4 is the most recently started
        q.schedule()
    q.push(job(5, BOB, gpus=2))
    assert q.schedule() == []
    assert sorted(q.preempt) == [3, 4]  # the two started last
    assert "preempting" in (q.wait_reason(5) or "")
    q.stopping.update(q.preempt)
    assert q.schedule() == [] and q.preempt == []  # no more victims while those stop
    for job_id in (3, 4):  # they end and are queued again
        q.capacity.give(q.capacity.running[job_id][0])
        q.stopping.discard(job_id)
        q.push(spot[job_id - 1])
    assert [r.job_id for r in q.schedule()] == [5]


def test_an_interruptible_head_preempts_nobody() -> None:
    q = gpu_queue(Clock(), n=1)
    q.push(Request(1, 1000, GiB, gpu=GpuRequest(1), interruptible=True))
    q.schedule()
    q.push(Request(2, 1000, GiB, gpu=GpuRequest(1), interruptible=True))
    assert q.schedule() == [] and q.preempt == []


def test_a_job_waiting_on_broken_or_drained_gpus_is_no_head() -> None:
    clock = Clock()
    q = gpu_queue(clock)
    pool = q.capacity.gpus
    assert pool is not None
    pool.inventory.gpus[0].healthy, pool.inventory.gpus[0].problem = False, "Xid 79"
    pool.drained.add(pool.inventory.gpus[1].uuid)
    q.push(job(1, ALICE, gpus=3))  # only 2 usable GPUs exist now
    q.push(job(2, BOB, gpus=1))
    q.push(Request(3, 1000, GiB, owner_uid=BOB))
    assert [r.job_id for r in q.schedule()] == [2, 3]
    assert "GPU 0 unhealthy: Xid 79" in (q.wait_reason(1) or "")


def test_jobs_that_take_nothing_the_head_waits_for_pass_it() -> None:
    clock = Clock()
    pool = GpuPool(simulated_inventory("2xH100,1xL4"))
    q = Queue(Capacity(4000, 64 * GiB, gpus=pool), clock=clock)
    q.push(Request(1, 1000, GiB, gpu=GpuRequest(1, "L4")))
    q.schedule()
    q.push(Request(2, 1000, GiB, gpu=GpuRequest(1, "L4")))  # the head: the L4 is busy
    q.push(Request(3, 1000, GiB, gpu=GpuRequest(1, "H100")))  # another model: may pass
    q.push(Request(4, 1000, GiB))  # CPU only, with the head's CPU still free: may pass
    q.push(Request(5, 1000, GiB))  # would take the head's last CPU: may not
    assert [r.job_id for r in q.schedule()] == [3, 4]


def test_a_users_first_job_is_held_to_the_gpu_limit_too() -> None:
    q = gpu_queue(Clock(), limits=Limits(max_gpus=2))
    q.push(job(1, ALICE, gpus=2))
    q.push(job(2, ALICE, gpus=1))
    assert [r.job_id for r in q.schedule()] == [1]
    assert q.wait_reason(2) == "user limit 2/2 GPUs"


def test_fair_share_charges_in_any_order_decay_the_same() -> None:
    forward, backward = Ledger(3600), Ledger(3600)
    forward.charge(ALICE, 1.0, 0.0)
    forward.charge(ALICE, 1.0, 36000.0)
    backward.charge(ALICE, 1.0, 36000.0)
    backward.charge(ALICE, 1.0, 0.0)
    assert forward.value(ALICE, 36000.0) == backward.value(ALICE, 36000.0)


def test_a_released_gpu_is_not_busy_with_the_ended_jobs_own_processes() -> None:
    from noduslocal.daemon.gpus.model import GpuProcess

    pool = GpuPool(simulated_inventory("1xH100"))
    gpu = pool.inventory.gpus[0]
    pool.take(1, [gpu.uuid])
    pool.inventory.read_at = 100.0
    gpu.processes = [GpuProcess(42, GiB, "alice")]  # read while job 1 still ran
    pool.give(1, now=101.0)
    assert pool.busy(gpu) is None
    pool.inventory.read_at = 102.0  # a later reading that still shows it: foreign now
    assert pool.busy(gpu) is not None


def test_a_victim_does_not_take_back_its_gpu_while_another_still_stops() -> None:
    clock = Clock()
    q = gpu_queue(clock, n=2)
    v1 = Request(1, 1000, GiB, gpu=GpuRequest(1), interruptible=True, expected=60)
    v2 = Request(2, 1000, GiB, gpu=GpuRequest(1), interruptible=True, expected=3600)
    for req in (v1, v2):
        q.push(req)
        q.schedule()
    q.push(job(3, BOB, gpus=2))
    assert q.schedule() == [] and sorted(q.preempt) == [1, 2]
    q.stopping.update((1, 2))
    q.capacity.give(v1)  # v1 stopped quickly and is queued again; v2 is still stopping
    q.stopping.discard(1)
    q.push(v1)
    assert q.schedule() == []  # v1 would fit and end before v2's expected end: still not
    q.capacity.give(v2)
    q.stopping.discard(2)
    assert [r.job_id for r in q.schedule()] == [3]


def test_stop_reasons_that_override_one_under_way() -> None:
    from noduslocal.daemon.jobs.outcomes import overrides
    from noduslocal.domain.states import Reason

    assert overrides(Reason.CANCELLED, Reason.SUSPENDED)
    assert overrides(Reason.CANCELLED, Reason.PREEMPTED)
    assert overrides(Reason.SUSPENDED, Reason.PREEMPTED)
    assert not overrides(Reason.SUSPENDED, Reason.CANCELLED)
    assert not overrides(Reason.CANCELLED, Reason.TIMEOUT)
    assert not overrides(Reason.PREEMPTED, Reason.SUSPENDED)
