"""Issue 4 with real Unix users on a real daemon with 4 simulated H100s, all through the CLI:
fair share between two users (one user's backlog does not keep the other waiting, and the
GPU time of running jobs counts too), a big job that a stream of small ones does not
starve, and the admin-only GPU controls (drain, priority above max_user_priority).

Reuses the users and the world-readable library copy of test_multiuser (its module-scoped
`box` fixture); each test gets its own GPU daemon, so that no earlier test's GPU-hours
weigh in the fair share. Needs root; skipped otherwise, failed under CI.

The scheduler's rules (noduslocal/daemon/scheduler/queue.py) that the first test relies on: order
by priority, interruptible last, then the user's decayed GPU-hours (running time included),
then submission; the first job that does not fit is the head, and behind it starts only what
takes nothing the head waits for, or what by its expected_duration ends before the head's
reserved start. Every 1-GPU job here says `--expected-duration 5s` and sleeps 1 s, so none
of them can pass a waiting 4-GPU head (the head's reserved start is always less than 5 s
away), and a user who ran more GPU-seconds always comes second.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from itertools import pairwise
from typing import Any

import pytest

from noduslocal import testing
from noduslocal.domain.states import TERMINAL, Phase
from tests.system.test_multiuser import ALICE, BOB, DEADLINE, Box, box

__all__ = ["box"]  # the fixture, imported so that pytest finds it in this module

pytestmark = pytest.mark.root

GPUS = 4
ALICE_SMALL = 20  # alice's backlog of 1-GPU jobs
BOB_SMALL = 5
ALICE_LATE = 4  # alice's 1-GPU jobs submitted after her 4-GPU job
# Alice's GPU-seconds before bob submits: more than bob's five 1-second jobs can reach
# before his fifth is placed (four of them running, ~1.2 s each at most), so bob stays
# first in the fair share for as long as he has jobs pending.
ALICE_DONE_BEFORE_BOB = 6
SMALL_JOB = ("--gpus", "1", "--expected-duration", "5s", "--", "sleep", "1")
SLACK = 0.25  # seconds between a job's created_at and its arrival in the queue, at most


@pytest.fixture
def gpu_box(box: Box) -> Iterator[Box]:
    """The users and library of `box`, with a fresh daemon serving 4 simulated H100s (CPU
    and memory ample, so that only GPUs are scarce)."""
    daemon = testing.Daemon(cpus=32, memory="64GiB",
                            config=f'simulate_gpus = "{GPUS}xH100"\n')
    try:
        daemon.start()
        yield Box(daemon, box.lib, box.alice, box.bob)
    finally:
        daemon.close()


def ts(value: str | None) -> float:
    """An API timestamp (RFC 3339, UTC, milliseconds) as seconds since the epoch."""
    assert value is not None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def submit(gb: Box, user: str, name: str, *args: str) -> dict[str, Any]:
    """`noduslocal job run --detach --json --name NAME ARGS...` as USER."""
    return gb.cli_json(user, "job", "run", "--detach", "--json", "--name", name, *args)


def submit_all(gb: Box, user: str, names: list[str], *args: str) -> list[dict[str, Any]]:
    """Submit them all at once, each through its own CLI process."""
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return list(pool.map(lambda n: submit(gb, user, n, *args), names))


def pending(gb: Box) -> list[dict[str, Any]]:
    doc = gb.cli_json(BOB, "queue", "--json")
    assert doc["kind"] == "Queue"
    return list(doc["pending"])


def assert_fair_order(entries: list[dict[str, Any]]) -> None:
    """Bob (fewer GPU-hours) ahead of alice; alice's own jobs in submission order."""
    owners = [e["owner"] for e in entries]
    assert owners == sorted(owners, key=lambda o: o != BOB), entries
    mine = [e for e in entries if e["owner"] == ALICE]
    assert [ts(e["created_at"]) for e in mine] == sorted(ts(e["created_at"]) for e in mine)


def test_fair_share_and_no_starvation_of_a_4_gpu_job(gpu_box: Box) -> None:
    """The issue's fault: alice queues 20 one-GPU jobs, bob 5 a moment later; bob's start
    before alice's backlog is done. Then alice asks for all 4 GPUs and goes on submitting
    1-GPU jobs: the 4-GPU job starts, ahead of her later 1-GPU jobs."""
    began = time.monotonic()
    root = gpu_box.daemon.client()  # for waiting only; every fact asserted comes via the CLI
    small = [f"a{i:02d}" for i in range(1, ALICE_SMALL + 1)]
    bobs = [f"b{i}" for i in range(1, BOB_SMALL + 1)]
    late = [f"a-late{i}" for i in range(1, ALICE_LATE + 1)]
    big = "a-big"

    created = submit_all(gpu_box, ALICE, small, *SMALL_JOB)
    assert all(c["owner"] == ALICE and c["spec"]["expected_duration"] == 5 for c in created), (
        created[0])

    def alice_done() -> bool:
        jobs = root.list_jobs(owner=ALICE, all=True)
        return sum(j["phase"] == Phase.SUCCEEDED for j in jobs) >= ALICE_DONE_BEFORE_BOB

    testing.wait_until(alice_done, f"{ALICE_DONE_BEFORE_BOB} of alice's jobs to end")
    before_bob = pending(gpu_box)
    backlog = [e["name"] for e in before_bob if e["owner"] == ALICE]
    assert len(backlog) >= GPUS, f"alice's backlog is already gone: {before_bob}"

    submit_all(gpu_box, BOB, bobs, *SMALL_JOB)
    after_bob = pending(gpu_box)
    assert_fair_order(after_bob)
    assert {e["name"] for e in after_bob if e["owner"] == ALICE}, (
        f"alice's backlog ended before bob's jobs were queued: {after_bob}")

    submit(gpu_box, ALICE, big, "--gpus", "4", "--expected-duration", "5s", "--",
           "sleep", "1")
    for name in late:  # the stream goes on behind it
        submit(gpu_box, ALICE, name, *SMALL_JOB)
    queued = pending(gpu_box)
    assert_fair_order(queued)
    names = [e["name"] for e in queued]
    assert big in names, queued
    assert all(names.index(big) < names.index(n) for n in late), names

    # Once it is first, the 4-GPU job holds the GPUs that free up; its later siblings wait.
    seen_head: dict[str, Any] | None = None
    while root.get_job(big, ALICE)["phase"] == Phase.PENDING:
        entries = pending(gpu_box)
        if entries and entries[0]["name"] == big:
            seen_head = {"head": entries[0], "rest": entries[1:]}
            break
        time.sleep(0.05)
    assert seen_head is not None, f"{big} started without ever heading the queue"
    head = seen_head["head"]
    assert head["hold"].startswith("needs 4 x GPU, "), head
    assert head["eta"] is not None, head  # every running job said how long it takes
    rest = [e["name"] for e in seen_head["rest"]]
    assert set(rest) <= set(late), rest

    everything = [*small, *bobs, big, *late]
    for name in everything:
        owner = BOB if name in bobs else ALICE
        final = root.wait_job(name, owner, DEADLINE)
        assert final["phase"] == Phase.SUCCEEDED, final

    # The record, as a user sees it: bob lists everyone's jobs.
    listed = gpu_box.cli_json(BOB, "job", "list", "--all", "--json")
    jobs = {j["name"]: j for j in listed if j["name"] in everything}
    assert set(jobs) == set(everything)
    assert all(j["phase"] == Phase.SUCCEEDED for j in jobs.values())
    started = {n: ts(j["started_at"]) for n, j in jobs.items()}
    submitted = {n: ts(j["created_at"]) for n, j in jobs.items()}

    # Each owner's view of the attempts: when the scheduler placed each one, and where.
    def attempts(name: str) -> list[dict[str, Any]]:
        owner = BOB if name in bobs else ALICE
        return list(gpu_box.cli_json(owner, "job", "attempts", name, "--json"))

    with ThreadPoolExecutor(max_workers=8) as pool:
        tried = dict(zip(everything, pool.map(attempts, everything), strict=True))
    assert all(len(a) == 1 for a in tried.values()), tried
    placed = {n: ts(a[0]["created_at"]) for n, a in tried.items()}
    for name, (attempt,) in tried.items():
        assert ts(attempt["started_at"]) == pytest.approx(started[name], abs=0.002)
        assert len(attempt["gpus"]) == (GPUS if name == big else 1), attempt

    # 1. Bob's 5 all started before alice's last 1-GPU job of her backlog did.
    last_alice = max(started[n] for n in small)
    assert max(started[n] for n in bobs) < last_alice, (
        {n: started[n] for n in bobs}, last_alice)
    # ... and, by fair share, ahead of every one of alice's jobs that the scheduler placed
    # after bob's were queued.
    bob_queued = max(submitted[n] for n in bobs) + SLACK
    overtaken = [n for n in small if placed[n] > bob_queued]
    assert overtaken, "alice's backlog was done before bob's jobs were queued"
    for a in overtaken:
        for b in bobs:
            assert placed[b] <= placed[a], (
                f"alice's {a} was placed at {placed[a]:.3f}, before bob's {b} "
                f"({placed[b]:.3f}), though bob's was queued by {bob_queued:.3f}")

    # 2. The 4-GPU job started: after every job ahead of it in the order (bob's, by fair
    # share; alice's earlier ones, by submission) ...
    assert started[big] > max(started[n] for n in [*small, *bobs])
    # ... and before every 1-GPU job alice submitted after it: none of them passed it.
    assert all(started[big] < started[n] for n in late), (
        started[big], {n: started[n] for n in late})
    status = gpu_box.cli_json(ALICE, "job", "status", big, "--json")
    assert status["phase"] == Phase.SUCCEEDED and status["spec"]["gpu"]["count"] == GPUS
    assert len(set(tried[big][0]["gpus"])) == GPUS

    # No GPU ever held by two jobs at once (attempt intervals per GPU do not overlap).
    spans: dict[str, list[tuple[float, float]]] = {}
    for (attempt,) in tried.values():
        for uuid in attempt["gpus"]:
            spans.setdefault(uuid, []).append((ts(attempt["started_at"]),
                                               ts(attempt["ended_at"])))
    for uuid, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in pairwise(intervals):
            assert start >= end, f"GPU {uuid} double-booked: {intervals}"
    assert time.monotonic() - began < 40, "the scenario took longer than it should"


def test_only_admins_drain_gpus_or_raise_priority(gpu_box: Box) -> None:
    """`gpus drain` is for admins; a user may not ask for a priority above
    max_user_priority (0 by default); root may do both."""
    denied = gpu_box.cli(ALICE, "gpus", "drain", "0")
    assert denied.returncode == 1, denied.stdout + denied.stderr
    assert denied.stdout == "" and "Traceback" not in denied.stderr
    assert denied.stderr.strip().splitlines() == [
        f"noduslocal: {ALICE} may not drain GPUs: admins only (root, or the admin group)"]
    assert gpu_box.cli(BOB, "gpus", "undrain", "0").returncode == 1
    doc = gpu_box.cli_json(BOB, "gpus", "--json")
    assert doc["simulated"] is True and len(doc["gpus"]) == GPUS
    assert not any(g["drained"] for g in doc["gpus"])

    refused = gpu_box.cli(ALICE, "job", "run", "--detach", "--name", "a-prio",
                          "--priority", "5", "--gpus", "1", "--", "true")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stdout == "" and refused.stderr.strip().splitlines() == [
        "noduslocal: priority: at most 0 for users; admins may go higher"]
    assert gpu_box.cli_json(ALICE, "job", "list", "--all", "--json") == []
    lower = gpu_box.cli_json(ALICE, "job", "run", "--detach", "--json", "--name", "a-low",
                             "--priority", "-1", "--gpus", "1", "--", "true")
    assert lower["spec"]["priority"] == -1 and lower["owner"] == ALICE

    drained = gpu_box.cli("root", "gpus", "drain", "0")
    try:
        assert drained.returncode == 0, drained.stderr
        assert "GPU 0 drained" in drained.stdout
        doc = gpu_box.cli_json(BOB, "gpus", "--json")
        assert [g["drained"] for g in doc["gpus"]] == [True, False, False, False]
        high = gpu_box.cli_json("root", "job", "run", "--detach", "--json", "--name",
                                "root-prio", "--priority", "5", "--gpus", "1", "--",
                                "true")
        assert high["spec"]["priority"] == 5 and high["owner"] == "root"
        root = gpu_box.daemon.client()
        for name, project in (("root-prio", "root"), ("a-low", ALICE)):
            final = root.wait_job(name, project, DEADLINE)
            assert final["phase"] == Phase.SUCCEEDED, final
        got = gpu_box.cli_json("root", "job", "attempts", "root-prio", "--json")
        assert got[0]["gpus"] and got[0]["gpus"][0] != doc["gpus"][0]["uuid"]
    finally:
        undrained = gpu_box.cli("root", "gpus", "undrain", "0")
    assert undrained.returncode == 0, undrained.stderr
    assert not any(g["drained"] for g in gpu_box.cli_json(BOB, "gpus", "--json")["gpus"])
    assert all(j["phase"] in TERMINAL for j in gpu_box.daemon.client().list_jobs(all=True))



def test_running_gpu_time_counts_in_the_fair_share(gpu_box: Box) -> None:
    """Before anyone's job has ended, alice's 4 running jobs alone put bob's job ahead of
    her next one, though hers was submitted first."""
    root = gpu_box.daemon.client()
    hogs = [f"hog{i}" for i in range(1, GPUS + 1)]
    submit_all(gpu_box, ALICE, hogs, "--gpus", "1", "--expected-duration", "5s", "--",
               "sleep", "2")
    testing.wait_until(lambda: all(root.get_job(n, ALICE)["phase"] == Phase.RUNNING
                                   for n in hogs), "alice's 4 jobs to run")
    submit(gpu_box, ALICE, "a-next", *SMALL_JOB)
    submit(gpu_box, BOB, "b-first", *SMALL_JOB)
    queued = pending(gpu_box)
    assert [(e["name"], e["owner"]) for e in queued] == [("b-first", BOB), ("a-next", ALICE)]
    assert queued[0]["hold"].startswith("needs 1 x GPU, 0 free"), queued[0]
    assert queued[1]["hold"] == "queued behind 1 job", queued[1]
    assert not any(j["phase"] == Phase.SUCCEEDED for j in root.list_jobs(all=True)), (
        "a job ended before the queue was read: the order no longer shows running time")

    for name, owner in (*((n, ALICE) for n in hogs), ("a-next", ALICE), ("b-first", BOB)):
        assert root.wait_job(name, owner, DEADLINE)["phase"] == Phase.SUCCEEDED
    placed = {n: ts(gpu_box.cli_json(o, "job", "attempts", n, "--json")[0]["created_at"])
              for n, o in (("a-next", ALICE), ("b-first", BOB))}
    assert placed["b-first"] <= placed["a-next"], placed


def test_two_users_sweeps_share_the_gpus_by_fair_share(gpu_box: Box) -> None:
    """Issue 9: alice's 16-task sweep is running when bob starts a 4-task one; bob's tasks
    do not wait for the end of alice's sweep: fair share puts them ahead of her remaining
    released tasks, and all of bob's start before alice's last four do."""
    root = gpu_box.daemon.client()
    # Each task sleeps one second: map appends its value, and `sleep 1 N` would sleep 1+N.
    task = ("--gpus", "1", "--max-parallel", "8", "--no-code", "--no-canary", "--",
            "sh", "-c", "sleep 1", ":::")
    created = gpu_box.cli_json(ALICE, "map", "--name", "a-sweep", "--json", *task,
                               *map(str, range(16)))
    assert created["cells"] == 16 and created["owner"] == ALICE
    testing.wait_until(lambda: root.get_sweep("a-sweep", ALICE)["counts"].get(
        "Succeeded", 0) >= GPUS, "alice's first tasks to end")
    gpu_box.cli_json(BOB, "map", "--name", "b-sweep", "--json", *task, *map(str, range(4)))
    for name, owner in (("a-sweep", ALICE), ("b-sweep", BOB)):
        final = root.wait_sweep(name, owner, DEADLINE)
        assert final["phase"] == "Succeeded", final
    started = {}
    for name, owner, cells in (("a-sweep", ALICE, 16), ("b-sweep", BOB, 4)):
        for i in range(cells):
            job = root.get_job(f"{name}-{i}", owner)
            started[(owner, i)] = ts(job["started_at"])
    alice = sorted(t for (o, _), t in started.items() if o == ALICE)
    bob = sorted(t for (o, _), t in started.items() if o == BOB)
    assert max(bob) < alice[-4], (bob, alice)
