"""How a job ends, through a real daemon and real shim-supervised processes: an exit code
is final whatever its retries, a kill from outside is Signaled, a lost box (its shim killed)
is retried with its checkpoint and leaves no orphan, a cancel sends SIGTERM and a SIGKILL
after the grace, a pending job cancelled never starts, a timeout fails the job, and 200
creates from 20 clients at once are each recorded once. What survives a kill -9 of the
daemon is in tests/system/test_crash_recovery.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from noduslocal import testing
from noduslocal.sdk.api_client import ApiClient
from noduslocal.testing import process_gone as gone
from noduslocal.testing import wait_until

DEADLINE = 30.0  # generous: how long we wait for something that must happen
GRACE_1S = 'kill_grace = "1s"\n'


TERMINAL = {"Succeeded", "Failed", "Cancelled"}


def phase(c: ApiClient, name: str) -> str:
    return str(c.get_job(name)["phase"])


def events(c: ApiClient) -> list[dict[str, Any]]:
    raw = b"".join(c.events())
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def events_of(c: ApiClient, name: str) -> list[dict[str, Any]]:
    return [e for e in events(c) if e["job"] == name]


def environ_names(pid: int) -> set[str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return set()
    return {item.decode(errors="replace") for item in raw.split(b"\0") if item}


def pid_json(d: testing.Daemon, name: str, number: int = 1) -> tuple[Path, dict[str, Any]]:
    """The attempt directory and pid.json of a running job, found by the NODUS_JOB variable
    the daemon puts in the job's environment."""

    def find() -> tuple[Path, dict[str, Any]] | None:
        for path in d.data_dir.glob(f"jobs/*/attempt-{number}/pid.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if f"NODUS_JOB={name}" in environ_names(data["pid"]):
                return path.parent, data
        return None

    return wait_until(find, f"pid.json of {name} attempt {number}")


def recorded_exits(d: testing.Daemon) -> list[Path]:
    """The exit.json files that hold an exit status (a shim may create it empty early)."""
    found = []
    for path in d.data_dir.glob("jobs/*/attempt-*/exit.json"):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_size > 0:
                found.append(path)
    return found


def gated(gate: Path, code: int) -> list[str]:
    """A job that runs until `gate` exists, then exits with `code`."""
    return ["sh", "-c", f"while [ ! -e '{gate}' ]; do sleep 0.05; done; exit {code}"]


def running(c: ApiClient) -> set[str]:
    return {j["name"] for j in c.list_jobs(phases=["Running"])}


def test_job_sigkilled_from_outside_is_failed_signaled(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "victim", "command": ["sh", "-c", "sleep 30"]})
    wait_until(lambda: phase(c, "victim") == "Running", "victim running")
    _, pid = pid_json(daemon, "victim")
    os.killpg(pid["pgid"], signal.SIGKILL)
    job = c.wait_job("victim", timeout=DEADLINE)
    assert (job["phase"], job["reason"], job["signal"]) == ("Failed", "Signaled", 9), job
    assert job["exit_code"] == 128 + 9
    assert [(a["phase"], a["signal"]) for a in c.attempts("victim")] == [("Exited", 9)]
    assert sum(e["phase"] in TERMINAL for e in events_of(c, "victim")) == 1


def test_nonzero_exit_is_final_even_with_retries(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "exit3", "command": ["sh", "-c", "exit 3"], "retries": 2})
    job = c.wait_job("exit3", timeout=DEADLINE)
    assert (job["phase"], job["reason"], job["exit_code"]) == ("Failed", "Error", 3), job
    assert (job["attempts"], job["retries_used"]) == (1, 0)
    assert [(a["phase"], a["exit_code"]) for a in c.attempts("exit3")] == [("Exited", 3)]


def test_200_jobs_from_20_concurrent_clients_are_each_recorded_once(
        own_daemon: testing.Daemon) -> None:
    daemon = own_daemon  # its own: every job and event of the daemon is the test's
    created: list[str] = []
    failures: list[BaseException] = []
    lock = threading.Lock()
    start = threading.Barrier(20)

    def submit(worker: int) -> None:
        client = ApiClient(daemon.socket)
        try:
            start.wait()
            for i in range(10):
                job = client.create_job({"command": ["true"], "cpu": "100m",
                                         "labels": {"worker": str(worker), "i": str(i)}})
                with lock:
                    created.append(job["name"])
        except BaseException as exc:
            with lock:
                failures.append(exc)

    threads = [threading.Thread(target=submit, args=(w,)) for w in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not failures, failures
    assert len(created) == 200 and len(set(created)) == 200

    c = daemon.client()
    listed = c.list_jobs(all=True)
    assert sorted(j["name"] for j in listed) == sorted(created)
    labels = {(j["labels"]["worker"], j["labels"]["i"]) for j in listed}
    assert len(labels) == 200, "a create was recorded twice or not at all"

    def all_done() -> list[dict[str, Any]] | None:
        jobs = c.list_jobs(all=True)
        return jobs if all(j["phase"] in TERMINAL for j in jobs) else None

    done = wait_until(all_done, "all 200 jobs to end", timeout=90)
    assert {j["phase"] for j in done} == {"Succeeded"}
    assert {j["attempts"] for j in done} == {1}
    history = events(c)
    for phase_name in ("Starting", "Running", "Succeeded"):
        names = [e["job"] for e in history if e["phase"] == phase_name]
        assert sorted(names) == sorted(created), phase_name


def test_cancel_running_job_sends_sigterm(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "to-cancel", "command": ["sleep", "60"]})
    wait_until(lambda: phase(c, "to-cancel") == "Running", "to-cancel running")
    _, pid = pid_json(daemon, "to-cancel")
    c.cancel_job("to-cancel")
    job = c.wait_job("to-cancel", timeout=DEADLINE)
    assert (job["phase"], job["reason"], job["signal"]) == ("Cancelled", "Cancelled", 15), job
    assert [(a["phase"], a["signal"]) for a in c.attempts("to-cancel")] == [("Exited", 15)]
    assert gone(pid["pid"])
    assert sum(e["phase"] in TERMINAL for e in events_of(c, "to-cancel")) == 1


def stubborn(d: testing.Daemon) -> ApiClient:
    """`stubborn`, a job that ignores SIGTERM, running on `d` (a daemon with GRACE_1S)."""
    c = d.client()
    c.create_job({"name": "stubborn",
                  "command": ["sh", "-c", "trap '' TERM; echo trapped; sleep 60"]})
    wait_until(lambda: b"trapped" in b"".join(c.logs("stubborn")), "the trap to be set")
    return c


def test_cancel_job_that_ignores_sigterm_is_killed_after_grace() -> None:
    with testing.daemon(cpus=2, config=GRACE_1S) as d:
        c = stubborn(d)
        _, pid = pid_json(d, "stubborn")
        asked = time.monotonic()
        c.cancel_job("stubborn")
        job = c.wait_job("stubborn", timeout=DEADLINE)
        waited = time.monotonic() - asked
        assert (job["phase"], job["reason"], job["signal"]) == ("Cancelled", "Cancelled", 9), \
            job
        assert waited >= 0.9, "SIGKILL came before the grace period was over"
        assert gone(pid["pid"])


def test_cancel_pending_job_never_starts(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "hog", "command": ["sleep", "60"], "cpu": 2})
    c.create_job({"name": "queued", "command": ["true"], "cpu": 1})
    wait_until(lambda: phase(c, "hog") == "Running", "hog running")
    assert phase(c, "queued") == "Pending"
    job = c.cancel_job("queued")
    assert (job["phase"], job["reason"]) == ("Cancelled", "Cancelled"), job
    c.cancel_job("hog")
    assert c.wait_job("hog", timeout=DEADLINE)["phase"] == "Cancelled"
    # The CPUs are free again: a later job runs, the cancelled one still does not.
    c.create_job({"name": "later", "command": ["true"], "cpu": 2})
    assert c.wait_job("later", timeout=DEADLINE)["phase"] == "Succeeded"
    job = c.get_job("queued")
    assert (job["phase"], job["attempts"], job["started_at"]) == ("Cancelled", 0, None)
    assert c.attempts("queued") == []
    assert [e["phase"] for e in events_of(c, "queued")] == ["Pending", "Cancelled"]


def test_timeout_fails_the_job(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "slow", "command": ["sleep", "30"], "timeout": 1})
    job = c.wait_job("slow", timeout=DEADLINE)
    assert (job["phase"], job["reason"]) == ("Failed", "Timeout"), job
    assert [a["phase"] for a in c.attempts("slow")] == ["Exited"]
    assert sum(e["phase"] in TERMINAL for e in events_of(c, "slow")) == 1


def test_lost_attempt_leaves_no_orphan_running_beside_the_retry(
        daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "orphan", "command": ["sleep", "60"], "retries": 1})
    wait_until(lambda: phase(c, "orphan") == "Running", "orphan running")
    first = pid_json(daemon, "orphan")[1]
    os.kill(first["shim_pid"], signal.SIGKILL)  # e.g. the OOM killer picked the shim
    wait_until(lambda: (j := c.get_job("orphan"))["attempts"] == 2
               and j["phase"] == "Running", "the retry to run")
    assert [a["phase"] for a in c.attempts("orphan")] == ["Lost", "Running"]
    second = pid_json(daemon, "orphan", number=2)[1]
    assert not gone(second["pid"])
    # Attempt 1's process must not run on beside attempt 2.
    wait_until(lambda: gone(first["pid"]), "attempt 1's process to be killed", timeout=5)


def lost_head_with_two_behind(d: testing.Daemon) -> ApiClient:
    """cpus=2: lost-a (retries=1), busy-b and busy-c, one CPU each; a's shim and process
    group are killed while the daemon runs, so its attempt is lost and it is requeued."""
    c = d.client()
    c.create_job({"name": "lost-a", "command": ["sleep", "60"], "cpu": 1, "retries": 1})
    c.create_job({"name": "busy-b", "command": ["sleep", "60"], "cpu": 1})
    c.create_job({"name": "busy-c", "command": ["sleep", "60"], "cpu": 1})
    wait_until(lambda: running(c) == {"lost-a", "busy-b"}, "lost-a and busy-b running")
    pid = pid_json(d, "lost-a")[1]
    os.kill(pid["shim_pid"], signal.SIGKILL)
    wait_until(lambda: gone(pid["shim_pid"]), "the shim to die")
    os.killpg(pid["pgid"], signal.SIGKILL)
    wait_until(lambda: ((a := c.get_job("lost-a"))["attempts"] == 2
                        and a["phase"] == "Running") or phase(c, "busy-c") == "Running",
               "the freed CPU to be given to a job")
    return c


def test_requeued_lost_job_keeps_its_place_in_the_queue(daemon: testing.Daemon) -> None:
    c = lost_head_with_two_behind(daemon)
    by_phase = {j["name"]: (j["phase"], j["attempts"]) for j in c.list_jobs()}
    assert by_phase == {"lost-a": ("Running", 2), "busy-b": ("Running", 1),
                        "busy-c": ("Pending", 0)}


def test_job_that_kills_its_own_shim_is_lost_and_its_processes_killed(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    """A root job may signal its root shim. It then ends Lost (retried within retries), its
    leftovers are killed, and its CPU is free again: never a job stuck Running."""
    c = daemon.client()
    marker = tmp_path / "sleeper.pid"
    c.create_job({"name": "parricide", "retries": 1, "command": [
        "sh", "-c", f'sleep 300 & echo $! >> {marker}; kill -9 $PPID; wait'], "cpu": 1})
    job = c.wait_job("parricide", timeout=DEADLINE)
    assert (job["phase"], job["reason"], job["attempts"]) == ("Failed", "Lost", 2), job
    assert [a["phase"] for a in c.attempts("parricide")] == ["Lost", "Lost"]
    sleepers = [int(x) for x in marker.read_text().split()]
    assert len(sleepers) == 2
    for pid in sleepers:
        wait_until(lambda p=pid: gone(p), f"leftover sleep {pid} to be killed")
    wait_until(lambda: c.info()["capacity"]["cpus_used"] == 0, "its CPU to be freed")


def test_stale_job_directory_fails_the_job_instead_of_reusing_it(
        own_daemon: testing.Daemon) -> None:
    daemon = own_daemon  # its own: the next job's id is 2
    c = daemon.client()
    c.create_job({"name": "blocker", "command": ["sleep", "60"], "cpu": 2})
    wait_until(lambda: phase(c, "blocker") == "Running", "blocker to run")
    # Job ids count from 1; the next job is 2. A directory left there by another database
    # holds someone's workspace: it must not be handed to the new job.
    stale = daemon.data_dir / "jobs" / "2" / "workspace"
    stale.mkdir(parents=True)
    (stale / "old.txt").write_text("not yours\n")
    c.create_job({"name": "victim", "command": ["cat", "old.txt"], "cpu": 1})
    c.cancel_job("blocker")
    job = c.wait_job("victim", timeout=DEADLINE)
    assert (job["phase"], job["reason"]) == ("Failed", "StartFailed"), job
    assert "exists" in job["message"]
    wait_until(lambda: c.info()["capacity"]["cpus_used"] == 0, "its CPU to be freed")


def test_a_retried_attempt_sees_the_checkpoint_the_lost_one_wrote(
        daemon: testing.Daemon) -> None:
    c = daemon.client()
    script = ('if [ -e "$NODUS_CHECKPOINT_DIR/step" ]; then '
              'echo "resumed at $(cat "$NODUS_CHECKPOINT_DIR/step")"; exit 0; fi; '
              'echo 41 > "$NODUS_CHECKPOINT_DIR/step"; sleep 60')
    c.create_job({"name": "ckpt", "retries": 1, "checkpoint": "/workspace/ckpt",
                  "command": ["sh", "-c", script]})
    _, pid = pid_json(daemon, "ckpt")
    wait_until(lambda: list(daemon.data_dir.glob("jobs/*/workspace/ckpt/step")),
               "the first attempt's checkpoint")
    os.kill(pid["shim_pid"], signal.SIGKILL)  # the box is lost under the job
    job = c.wait_job("ckpt", timeout=DEADLINE)
    assert (job["phase"], job["attempts"]) == ("Succeeded", 2), job
    assert b"".join(c.logs("ckpt")).decode() == "resumed at 41\n"

