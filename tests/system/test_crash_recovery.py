"""What the daemon survives: kill -9 of itself while jobs run, wait and are created, cancels
and timeouts it had not finished, lost boxes it finds at its next start, a stream of jobs
whose spawner dies, a workspace it died making, and a client that rides out its restart.
Everything here is real: a noduslocald process, shim-supervised job processes and the
SQLite file on disk. How jobs end while the daemon stays up: tests/daemon/test_job_ends.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.timefmt import parse_iso
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import process_gone as gone
from noduslocal.testing import wait_until
from tests.daemon.test_job_ends import (
    GRACE_1S,
    TERMINAL,
    events,
    events_of,
    gated,
    phase,
    pid_json,
    recorded_exits,
    running,
    stubborn,
)

# Beside the other system tests (scripts/test.sh): its own daemons in temporary
# directories, no other user, no docker.
pytestmark = pytest.mark.beside

T = TypeVar("T")
DEADLINE = 30.0  # generous: how long we wait for something that must happen


# --- helpers ----------------------------------------------------------------------------


@pytest.fixture
def fresh() -> Iterator[Callable[..., testing.Daemon]]:
    """Daemons this test starts, kills and restarts itself; all cleaned up at the end."""
    made: list[testing.Daemon] = []

    def make(**kwargs: Any) -> testing.Daemon:
        d = testing.Daemon(**kwargs)
        made.append(d)
        return d.start()

    try:
        yield make
    finally:
        for d in made:
            d.close()


# --- kill -9 of the daemon ---------------------------------------------------------------


def test_kill9_with_running_and_pending_jobs_then_restart(
        fresh: Callable[..., testing.Daemon], tmp_path: Path) -> None:
    d = fresh(cpus=2)
    c = d.client()
    gate = tmp_path / "gate"
    codes = {f"crash-{n}": n for n in range(6)}  # crash-0 exits 0, crash-3 exits 3, ...
    for name, code in codes.items():
        c.create_job({"name": name, "command": gated(gate, code), "cpu": 1})
    wait_until(lambda: len(running(c)) == 2, "two jobs running")
    by_phase = {j["name"]: j["phase"] for j in c.list_jobs()}
    assert by_phase == {"crash-0": "Running", "crash-1": "Running", "crash-2": "Pending",
                        "crash-3": "Pending", "crash-4": "Pending", "crash-5": "Pending"}
    was_running, was_pending = ["crash-0", "crash-1"], ["crash-2", "crash-3", "crash-4",
                                                         "crash-5"]
    killed_at = time.time()
    d.kill()
    gate.touch()  # the running jobs end while no daemon watches them
    wait_until(lambda: len(recorded_exits(d)) == 2,
               "the two running jobs to exit while the daemon is down")
    assert len(list(d.data_dir.glob("jobs/*/attempt-*"))) == 2, "a pending job started " \
        "without a daemon"

    restarted_at = time.time()
    d.start()
    for name, code in codes.items():
        job = c.wait_job(name, timeout=DEADLINE)
        assert job["exit_code"] == code, name
        if code == 0:
            assert (job["phase"], job["reason"]) == ("Succeeded", "Completed"), name
        else:
            assert (job["phase"], job["reason"]) == ("Failed", "Error"), name
        assert job["attempts"] == 1, name
        attempts = c.attempts(name)
        assert [(a["number"], a["phase"], a["exit_code"]) for a in attempts] == [
            (1, "Exited", code)], name
        started = parse_iso(attempts[0]["started_at"])
        assert started is not None
        if name in was_running:
            assert started < killed_at, f"{name} ran before the kill"
        else:
            assert name in was_pending
            assert started >= restarted_at - 0.01, f"{name} started only after the restart"

    history = events(c)
    for name, code in codes.items():
        mine = [e for e in history if e["job"] == name]
        terminal = [e for e in mine if e["phase"] in TERMINAL]
        assert len(terminal) == 1, (name, mine)
        assert terminal[0]["phase"] == ("Succeeded" if code == 0 else "Failed")
        assert mine[-1] is terminal[0], f"{name} changed after it ended: {mine}"
        assert [e["phase"] for e in mine].count("Running") == 1, (name, mine)
    assert [e["seq"] for e in history] == sorted({e["seq"] for e in history})


def test_kill9_then_restart_adopts_running_jobs(
        fresh: Callable[..., testing.Daemon], tmp_path: Path) -> None:
    d = fresh(cpus=2)
    c = d.client()
    gate = tmp_path / "gate"
    codes = {"adopt-a": 0, "adopt-b": 9, "adopt-c": 4}  # adopt-c waits for a CPU
    for name, code in codes.items():
        c.create_job({"name": name, "command": gated(gate, code), "cpu": 1})
    wait_until(lambda: running(c) == {"adopt-a", "adopt-b"}, "two jobs running")
    pids = {name: pid_json(d, name)[1]["pid"] for name in ("adopt-a", "adopt-b")}

    d.kill()
    assert not any(gone(pid) for pid in pids.values()), "jobs died with the daemon"
    d.start()
    # Adopted, not restarted and not lost: still the first attempt, still Running.
    for name in ("adopt-a", "adopt-b"):
        job = c.get_job(name)
        assert (job["phase"], job["attempts"]) == ("Running", 1), job
    assert phase(c, "adopt-c") == "Pending"

    gate.touch()
    for name, code in codes.items():
        job = c.wait_job(name, timeout=DEADLINE)
        assert job["exit_code"] == code, job
        assert job["phase"] == ("Succeeded" if code == 0 else "Failed"), job
        assert [(a["phase"], a["exit_code"]) for a in c.attempts(name)] == [("Exited", code)]
        mine = events_of(c, name)
        assert sum(e["phase"] in TERMINAL for e in mine) == 1, mine


def test_pending_job_survives_kill9_and_starts_after_restart(
        fresh: Callable[..., testing.Daemon]) -> None:
    d = fresh(cpus=2)
    c = d.client()
    c.create_job({"name": "blocker", "command": ["sleep", "60"], "cpu": 2})
    c.create_job({"name": "waiter", "command": ["true"], "cpu": 1})
    wait_until(lambda: running(c) == {"blocker"}, "the blocker to run")
    assert phase(c, "waiter") == "Pending"

    d.kill()
    d.start()
    waiter = c.get_job("waiter")
    assert (waiter["phase"], waiter["attempts"]) == ("Pending", 0), waiter
    assert phase(c, "blocker") == "Running"
    restarted_at = time.time()
    c.cancel_job("blocker")
    job = c.wait_job("waiter", timeout=DEADLINE)
    assert (job["phase"], job["attempts"]) == ("Succeeded", 1), job
    started = parse_iso(c.attempts("waiter")[0]["started_at"])
    assert started is not None and started >= restarted_at - 0.01
    assert c.wait_job("blocker", timeout=DEADLINE)["phase"] == "Cancelled"


def test_job_created_right_before_kill9_is_never_lost(
        fresh: Callable[..., testing.Daemon]) -> None:
    d = fresh(cpus=2)
    c = d.client()
    names: list[str] = []
    for round_ in range(3):
        # Some of these are still Pending at the kill, some Starting, some Running.
        for i in range(4):
            names.append(c.create_job({"command": ["true"], "cpu": "500m",
                                       "labels": {"round": str(round_), "i": str(i)}})["name"])
        d.kill()
        d.start()
    listed = [j["name"] for j in c.list_jobs(all=True)]
    assert sorted(listed) == sorted(names) and len(set(names)) == 12
    for name in names:
        job = c.wait_job(name, timeout=DEADLINE)
        assert (job["phase"], job["exit_code"]) == ("Succeeded", 0), job
        attempts = c.attempts(name)
        # An attempt the daemon was killed before spawning is NotStarted and costs nothing;
        # exactly one attempt ran.
        assert [a["phase"] for a in attempts].count("Exited") == 1, attempts
        assert {a["phase"] for a in attempts} <= {"Exited", "NotStarted"}, attempts
        assert attempts[-1]["phase"] == "Exited"
        mine = events_of(c, name)
        assert sum(e["phase"] in TERMINAL for e in mine) == 1, mine


def test_creates_in_flight_during_kill9_are_recorded_exactly_once(
        fresh: Callable[..., testing.Daemon]) -> None:
    d = fresh(cpus=2)
    created: list[str] = []
    failures: list[BaseException] = []
    stop = threading.Event()

    def submit() -> None:
        client = ApiClient(d.socket)  # retries a lost request with the same idempotency key
        try:
            while not stop.is_set():
                key = uuid.uuid4().hex
                for _ in range(200):
                    try:
                        job = client.create_job({"command": ["true"], "cpu": "100m"},
                                                idempotency_key=key)
                        break
                    except errors.DaemonUnavailable:
                        # The socket file is briefly missing while a daemon starts (see
                        # test_client_rides_out_the_startup_of_a_restarted_daemon): we retry
                        # with the same key, as the client does for a refused connection.
                        time.sleep(0.05)
                else:
                    raise AssertionError("the daemon did not come back")
                created.append(job["name"])
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=submit)
    thread.start()
    try:
        for round_ in range(4):
            floor = len(created) + 5
            wait_until(lambda f=floor: failures or len(created) > f, "creates to go through")
            assert not failures, failures
            if round_ == 3:
                break
            d.kill()  # most likely with a create on the wire
            time.sleep(0.1)
            d.start()
    finally:
        stop.set()
        thread.join(DEADLINE)
    assert not failures, failures
    c = d.client()
    listed = [j["name"] for j in c.list_jobs(all=True, limit=100_000)]
    assert len(set(created)) == len(created)
    assert sorted(listed) == sorted(created), "a create was lost or recorded twice"
    for name in created[-3:]:
        assert c.wait_job(name, timeout=DEADLINE)["phase"] == "Succeeded"


def start_stubborn(fresh: Callable[..., testing.Daemon]) -> tuple[testing.Daemon, ApiClient]:
    """A daemon with a 1 s kill grace running `stubborn`, a job that ignores SIGTERM."""
    d = fresh(cpus=2, config=GRACE_1S)
    return d, stubborn(d)


def test_cancel_survives_kill9_before_the_job_stopped(
        fresh: Callable[..., testing.Daemon]) -> None:
    d, c = start_stubborn(fresh)
    pid = pid_json(d, "stubborn")[1]
    c.cancel_job("stubborn")  # SIGTERM is ignored; the SIGKILL was to follow in 1 s
    d.kill()
    assert not gone(pid["pid"])
    d.start()
    job = c.wait_job("stubborn", timeout=DEADLINE)
    assert (job["phase"], job["reason"], job["signal"]) == ("Cancelled", "Cancelled", 9), job
    assert gone(pid["pid"])
    assert sum(e["phase"] in TERMINAL for e in events_of(c, "stubborn")) == 1


def test_timeout_survives_kill9(fresh: Callable[..., testing.Daemon]) -> None:
    """The restarted daemon times the job out at the time its first one would have, or at
    once when that has passed while it was away (a loaded CI box once took the restart
    longer than the 2 s), never lets it run its 30 s."""
    d = fresh(cpus=2)
    c = d.client()
    c.create_job({"name": "slow", "command": ["sleep", "30"], "timeout": 2})
    wait_until(lambda: phase(c, "slow") == "Running", "slow running")
    d.kill()
    d.start()
    job = c.wait_job("slow", timeout=DEADLINE)
    assert (job["phase"], job["reason"], job["attempts"]) == ("Failed", "Timeout", 1), job
    (attempt,) = c.attempts("slow")
    ran = parse_iso(attempt["ended_at"]) - parse_iso(attempt["started_at"])
    assert 2 <= ran < 20, attempt


# --- job processes killed from outside, lost attempts, retries ----------------------------


def test_lost_attempt_is_retried_and_without_retries_fails_lost(
        fresh: Callable[..., testing.Daemon]) -> None:
    d = fresh(cpus=2)
    c = d.client()
    c.create_job({"name": "lost-retry", "command": ["sleep", "30"], "retries": 1})
    c.create_job({"name": "lost-final", "command": ["sleep", "30"], "retries": 0})
    wait_until(lambda: running(c) == {"lost-retry", "lost-final"}, "both jobs running")
    pids = [pid_json(d, name)[1] for name in ("lost-retry", "lost-final")]

    d.kill()
    # The box is lost: the shim goes first so nobody records an exit status, then the job.
    for pid in pids:
        os.kill(pid["shim_pid"], signal.SIGKILL)
        wait_until(lambda p=pid: gone(p["shim_pid"]), "the shim to die")
        os.killpg(pid["pgid"], signal.SIGKILL)
        wait_until(lambda p=pid: gone(p["pid"]), "the job to die")
    assert not recorded_exits(d), "an exit was recorded"
    d.start()

    final = c.wait_job("lost-final", timeout=DEADLINE)
    assert (final["phase"], final["reason"]) == ("Failed", "Lost"), final
    assert final["exit_code"] is None
    assert [(a["number"], a["phase"]) for a in c.attempts("lost-final")] == [(1, "Lost")]

    retried = wait_until(
        lambda: (j := c.get_job("lost-retry"))["phase"] == "Running" and j["attempts"] == 2
        and j, "lost-retry to run its second attempt")
    assert retried["retries_used"] == 1
    attempts = c.attempts("lost-retry")
    assert [(a["number"], a["phase"]) for a in attempts] == [(1, "Lost"), (2, "Running")]
    assert attempts[0]["reason"] == "Lost"
    second = pid_json(d, "lost-retry", number=2)[1]
    assert not gone(second["pid"])
    c.cancel_job("lost-retry")
    assert c.wait_job("lost-retry", timeout=DEADLINE)["phase"] == "Cancelled"
    for name in ("lost-retry", "lost-final"):
        mine = events_of(c, name)
        assert sum(e["phase"] in TERMINAL for e in mine) == 1, mine


# --- many clients at once ---------------------------------------------------------------


# --- cancel and timeout -----------------------------------------------------------------


# --- idempotency ------------------------------------------------------------------------


def test_idempotency_key_holds_across_kill9(fresh: Callable[..., testing.Daemon]) -> None:
    d = fresh(cpus=2)
    c = d.client()
    body = {"command": ["sleep", "30"], "labels": {"what": "idem"}}
    first = c.create_job(body, idempotency_key="idem-key-1")
    d.kill()
    d.start()
    second = c.create_job(body, idempotency_key="idem-key-1")
    assert second["name"] == first["name"]
    assert [j["name"] for j in c.list_jobs(all=True)] == [first["name"]]
    # A different key is a different job.
    third = c.create_job(body, idempotency_key="idem-key-2")
    assert third["name"] != first["name"]
    assert len(c.list_jobs(all=True)) == 2


# --- bugs found while writing these tests ------------------------------------------------


def test_restart_never_runs_more_than_the_cpus(fresh: Callable[..., testing.Daemon]) -> None:
    """After kill -9, adopted jobs take their CPUs back before any queue pass may start a
    pending job (with a requeued job at the head, a pass used to run mid-reconcile)."""
    d = fresh(cpus=2)
    c = d.client()
    for name in ("run-a", "run-b", "wait-c"):
        c.create_job({"name": name, "command": ["sleep", "60"], "cpu": 1})
    wait_until(lambda: running(c) == {"run-a", "run-b"}, "run-a and run-b running")
    d.kill()
    d.start()

    def settled() -> dict[str, Any] | None:
        job = c.get_job("wait-c")
        held = job["phase"] == "Pending" and (job["hold"] or "").startswith("needs")
        return job if held or job["phase"] != "Pending" else None

    job = wait_until(settled, "a queue pass after the restart")
    cpus = sum(j["spec"]["cpu"] for j in c.list_jobs(phases=["Starting", "Running"]))
    assert cpus <= 2, f"{cpus} CPUs of jobs running on a 2-CPU daemon"
    assert (job["phase"], job["hold"]) == ("Pending", "needs 1 CPU, 0 free"), job
    assert running(c) == {"run-a", "run-b"}


def test_client_rides_out_the_startup_of_a_restarted_daemon(
        fresh: Callable[..., testing.Daemon]) -> None:
    d = fresh(cpus=2)
    c = d.client()
    name = c.create_job({"command": ["true"]})["name"]
    assert c.wait_job(name, timeout=DEADLINE)["phase"] == "Succeeded"
    d.kill()  # leaves its socket file: clients retry a refused connection
    starter = threading.Thread(target=d.start)
    starter.start()
    try:
        # Catch the moment the new daemon has removed the stale socket and not yet bound its
        # own; a daemon that swaps the socket atomically never shows this gap.
        while starter.is_alive() and os.path.lexists(d.socket):
            pass
        job = ApiClient(d.socket).wait_job(name, timeout=DEADLINE)  # allowed to retry for 30 s
    finally:
        starter.join(DEADLINE)
    assert job["phase"] == "Succeeded"


# --- the daemon's own failures: nothing is ever left Starting or Running unwatched --------


@pytest.mark.parametrize("config", ["", 'host_shim = "python"\n'])
def test_spawner_killed_under_a_stream_of_jobs_strands_none(
        fresh: Callable[..., testing.Daemon], config: str) -> None:
    daemon = fresh(config=config)
    c = daemon.client()
    names = [c.create_job({"command": ["true"], "cpu": "100m"})["name"] for _ in range(20)]
    spawner = int(subprocess.run(["pgrep", "-f", "-P", str(daemon.proc.pid), "shim"],
                                 capture_output=True, text=True).stdout.split()[0])
    os.kill(spawner, signal.SIGKILL)
    names += [c.create_job({"command": ["true"], "cpu": "100m"})["name"] for _ in range(40)]
    phases = {c.wait_job(n, timeout=DEADLINE)["phase"] for n in names}
    assert phases <= {"Succeeded", "Failed"}, phases  # every job ended; none is stuck
    assert c.list_jobs() == []


def test_empty_pid_json_does_not_stop_the_daemon_from_starting(
        fresh: Callable[..., testing.Daemon]) -> None:
    """A power loss can leave a renamed pid.json without its data."""
    d = fresh(cpus=2)
    c = d.client()
    c.create_job({"name": "torn", "command": ["sleep", "60"], "retries": 1})
    wait_until(lambda: phase(c, "torn") == "Running", "torn to run")
    directory, pid = pid_json(d, "torn")
    d.kill()
    os.kill(pid["shim_pid"], signal.SIGKILL)
    os.killpg(pid["pgid"], signal.SIGKILL)
    (directory / "pid.json").write_bytes(b"")
    d.start()
    job = wait_until(lambda: (j := c.get_job("torn"))["attempts"] == 2 and j, "a retry")
    assert c.attempts("torn")[0]["phase"] == "Lost"
    assert job["phase"] in ("Starting", "Running")


def test_outputs_are_collected_for_a_job_that_ended_while_the_daemon_was_down(
        fresh: Callable[..., testing.Daemon], tmp_path: Path) -> None:
    d = fresh(cpus=2)
    c = d.client()
    gate = tmp_path / "gate"
    c.create_job({"name": "out", "outputs": {"result": "result.txt"}, "command": [
        "sh", "-c", f"while [ ! -e {gate} ]; do sleep 0.05; done; echo 42 > result.txt"]})
    wait_until(lambda: phase(c, "out") == "Running", "the job to run")
    d.kill()
    gate.touch()
    wait_until(lambda: recorded_exits(d), "the job to end while the daemon is down")
    d.start()
    assert c.wait_job("out", timeout=DEADLINE)["phase"] == "Succeeded"
    [row] = c.list_outputs("out")
    assert (row["collected"], row["size"]) == (True, 3)
    assert c.download_output("out", None, "result", tmp_path / "r").read_text() == "42\n"


def test_a_workspace_the_daemon_died_making_is_made_again(
        fresh: Callable[..., testing.Daemon], tmp_path: Path) -> None:
    """Found by tests/system/test_chaos.py: a kill -9 while the first attempt's workspace was
    being filled (source unpacked, volume links made) left it half made, and the next
    attempt took it for one kept from an earlier run: the job ran without its code."""
    d = fresh(cpus=2)
    c = d.client()
    code = tmp_path / "code"
    code.mkdir()
    (code / "main.sh").write_text("echo code-ran\n")
    source = c.upload_source([code], contents_of_single_dir=True)
    c.create_volume("vol")
    # The unpack reads the source's blob: a FIFO in its place holds the daemon inside
    # the workspace's making until we kill it, with no race.
    blob = d.data_dir / "blobs" / source["sha256"][:2] / source["sha256"]
    real = blob.read_bytes()
    blob.unlink()
    os.mkfifo(blob)
    c.create_job({"name": "torn", "source": source, "volumes": {"v": "vol"}, "command": [
        "sh", "-c", "sh main.sh; test -L v && echo volume-linked"]})
    job_dir = wait_until(lambda: next(d.data_dir.glob("jobs/*/workspace"), None),
                         "the workspace to be made").parent
    d.kill()
    assert not list(job_dir.glob("attempt-*")), "the attempt's directory was made"
    blob.unlink()
    blob.write_bytes(real)
    d.start()
    job = c.wait_job("torn", timeout=DEADLINE)
    assert (job["phase"], job["retries_used"]) == ("Succeeded", 0), job
    assert [a["phase"] for a in c.attempts("torn")] == ["NotStarted", "Exited"]
    assert b"".join(c.logs("torn")).decode() == "code-ran\nvolume-linked\n"
