"""Admission against CPU and memory: submission order, no starvation of a large head, and
never more requested than the host has (a property test over random mixes)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from noduslocal.daemon.scheduler.queue import Capacity, Queue, Request

GiB = 2**30


def make(cpu: int = 4000, mem: int = 16 * GiB) -> Queue:
    return Queue(Capacity(cpu, mem))


def test_fifo_within_capacity() -> None:
    q = make(cpu=2000)
    for i in range(1, 5):
        q.push(Request(i, 1000, 0))
    assert [r.job_id for r in q.schedule()] == [1, 2]
    assert q.wait_reason(3) and "needs 1 CPU, 0 free" in q.wait_reason(3)
    assert q.wait_reason(4) == "queued behind 1 job"
    q.capacity.give(Request(1, 1000, 0))
    assert [r.job_id for r in q.schedule()] == [3]


def test_large_head_is_not_starved_by_small_jobs() -> None:
    q = make(cpu=4000)
    q.push(Request(1, 3000, 0))
    q.schedule()
    q.push(Request(2, 4000, 0))  # needs the whole host
    q.push(Request(3, 1000, 0))  # would fit now, but must not jump the head
    assert q.schedule() == []
    assert "needs 4 CPUs, 1 free" in (q.wait_reason(2) or "")
    q.capacity.give(Request(1, 3000, 0))
    assert [r.job_id for r in q.schedule()] == [2]


def test_memory_is_admitted_too() -> None:
    q = make(cpu=8000, mem=4 * GiB)
    q.push(Request(1, 1000, 3 * GiB))
    q.push(Request(2, 1000, 2 * GiB))
    assert [r.job_id for r in q.schedule()] == [1]
    assert "memory" in (q.wait_reason(2) or "")


def test_requeued_job_keeps_its_place() -> None:
    q = make(cpu=1000)
    for i in (5, 6, 7):
        q.push(Request(i, 1000, 0))
    q.push(Request(2, 1000, 0))  # an older job coming back after a lost attempt
    assert [r.job_id for r in q.schedule()] == [2]


def test_remove_and_refusal() -> None:
    q = make(cpu=2000, mem=GiB)
    q.push(Request(1, 1000, 0))
    assert q.remove(1) is not None and 1 not in q and q.remove(1) is None
    assert "cpu" in (q.capacity.refusal(Request(2, 3000, 0)) or "")
    assert "memory" in (q.capacity.refusal(Request(2, 1000, 2 * GiB)) or "")
    assert q.capacity.refusal(Request(2, 2000, GiB)) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4000), st.integers(0, 8 * GiB), st.booleans()),
                min_size=1, max_size=60))
def test_never_overcommits_and_starts_in_order(ops: list[tuple[int, int, bool]]) -> None:
    q = make(cpu=4000, mem=8 * GiB)
    running: list[Request] = []
    started: list[int] = []
    for job_id, (cpu, mem, finish_one) in enumerate(ops, start=1):
        q.push(Request(job_id, cpu, mem))
        if finish_one and running:
            q.capacity.give(running.pop(0))
        for req in q.schedule():
            running.append(req)
            started.append(req.job_id)
        assert sum(r.cpu_m for r in running) <= 4000
        assert sum(r.memory for r in running) <= 8 * GiB
        assert q.capacity.used_cpu_m == sum(r.cpu_m for r in running)
    while running:
        q.capacity.give(running.pop(0))
        for req in q.schedule():
            running.append(req)
            started.append(req.job_id)
    assert started == sorted(started) == list(range(1, len(ops) + 1))
    assert len(q) == 0


def test_a_blocked_runtime_keeps_its_place_without_holding_up_others() -> None:
    q = make(cpu=2000)
    q.blocked["docker"] = "dockerd unreachable: not running"
    q.push(Request(1, 1000, 0, "docker"))
    q.push(Request(2, 1000, 0))
    q.push(Request(3, 1000, 0, "docker"))
    q.push(Request(4, 1000, 0))
    q.push(Request(5, 1000, 0))
    assert [r.job_id for r in q.schedule()] == [2, 4]
    assert q.wait_reason(1) == q.wait_reason(3) == "dockerd unreachable: not running"
    assert "needs 1 CPU, 0 free" in (q.wait_reason(5) or "")
    del q.blocked["docker"]
    q.capacity.give(Request(2, 1000, 0))
    q.capacity.give(Request(4, 1000, 0))
    assert [r.job_id for r in q.schedule()] == [1, 3]  # back at their places, first
    assert len(q) == 1 and q.wait_reason(5) is not None
