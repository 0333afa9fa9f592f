"""`job.exec` / `noduslocal job exec` beside a running host-process job: its environment,
workdir and owner, the exit status, masked secrets, refusals, each user's cap on execs, and
an exec cut off by a kill -9 of the daemon."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors

Cli = Callable[..., subprocess.CompletedProcess[str]]


TARGETS = itertools.count(1)


def start_target(d: testing.Daemon) -> nodus.Job:
    """A running job to exec beside, named target-N (a name of its own on a shared daemon),
    with MODE in its environment and the secret TOKEN."""
    d.client().set_secret("TOKEN", "exec-secret-value")
    job = nodus.Job.run(name=f"target-{next(TARGETS)}",
                        command=["sh", "-c", "echo ready > flag; sleep 60"],
                        env={"MODE": "train"}, secrets=["TOKEN"])

    def ready() -> bool:
        if job.status().phase != "Running":
            return False
        try:
            return any(e.name == "flag" for e in job.files.list())
        except errors.NotFound:  # no workspace yet
            return False

    testing.wait_until(ready, "the job to run")
    return job


@pytest.fixture
def running(daemon: testing.Daemon) -> nodus.Job:
    return start_target(daemon)


def test_exec_sees_the_job(running: nodus.Job) -> None:
    proc = running.exec("sh", "-c", 'cat flag; echo "$MODE $NODUS_JOB $TOKEN"; pwd; exit 3')
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["ready", f"train {running.name} ***"]  # the secret is masked
    assert lines[2].endswith("/workspace")
    assert (proc.returncode, proc.stderr, proc.truncated) == (3, "", False)
    running.cancel()


def test_cli_exec_returns_the_code(cli: Cli, running: nodus.Job) -> None:
    done = cli("job", "exec", running.name, "--", "sh", "-c", "echo out; echo err >&2; exit 4")
    assert (done.returncode, done.stdout, done.stderr) == (4, "out\n", "err\n")
    missing = cli("job", "exec", running.name, "--", "no-such-command")
    # Found by env(1) inside the job's mount namespace (issue 25), no more by the daemon's
    # own spawn ("cannot execute"): its words name the command.
    assert missing.returncode == 127, missing
    assert "no-such-command" in missing.stderr and "No such file" in missing.stderr
    running.cancel()


def test_exec_timeout_kills_it(running: nodus.Job, daemon: testing.Daemon) -> None:
    with pytest.raises(errors.WaitTimeout, match="killed"):
        daemon.client().exec_job(running.name, None, ["sleep", "30"], timeout=0.5)
    running.cancel()


def test_exec_needs_a_running_job(daemon: testing.Daemon) -> None:
    done = nodus.Job.run(command=["true"])
    done.wait(timeout=30)
    with pytest.raises(errors.Conflict, match="needs it Running"):
        done.exec("ls")
    with pytest.raises(errors.Conflict, match="needs it Running"):
        done.exec("sh", pty=True)  # refused before any terminal is opened


def test_an_exec_the_daemon_died_under_is_killed_by_the_next_one(
        own_daemon: testing.Daemon, tmp_path: Path) -> None:
    """Found by tests/system/test_chaos.py: the exec's timeout and its caller die with the
    daemon, so it used to run on unwatched, past its timeout and past the job."""
    daemon = own_daemon  # its own: it kills the daemon
    running = start_target(daemon)
    pids = tmp_path / "pids"
    failures: list[BaseException] = []

    def cut_off() -> None:
        try:
            daemon.client().exec_job(running.name, None, [
                "sh", "-c", f"sleep 300 & echo $$ $! > {pids}; wait"], timeout=2)
        except errors.DaemonUnavailable:  # the daemon went away under the call
            return
        except BaseException as exc:
            failures.append(exc)
        else:
            failures.append(AssertionError("the exec was answered"))

    caller = threading.Thread(target=cut_off)
    caller.start()
    shell, child = map(int, testing.wait_until(
        lambda: pids.exists() and pids.read_text().split(), "the exec to run"))
    try:
        daemon.kill()
        caller.join(30)
        assert not failures, failures
        assert not testing.process_gone(shell), "the exec died with the daemon by itself"
        daemon.start()
        for pid in (shell, child):
            testing.wait_until(lambda p=pid: testing.process_gone(p),
                               f"exec process {pid} to go")
    finally:  # nothing of it outlives a failed test
        if not testing.process_gone(shell):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(shell, signal.SIGKILL)
    # The exec's end is not the job's: it is adopted and runs on.
    status = running.status()
    assert (status.phase, status["attempts"]) == ("Running", 1)
    assert list((daemon.data_dir / "execs").iterdir()) == []
    running.cancel()


def test_execs_are_capped_per_user_with_a_clear_refusal(tmp_path: Path) -> None:
    """One user's long execs filled the pool that other users' container starts needed."""
    import threading

    from noduslocal.domain import errors

    d = testing.Daemon(cpus=2, memory="4GiB", config="user_max_execs = 2\n")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "box", "command": ["sleep", "120"]})
        testing.wait_until(lambda: client.get_job("box")["phase"] == "Running", "box runs")
        gate = tmp_path / "gate"
        # Each exec says it runs by a file of its own: counting the processes that wait
        # for the gate also counted a shell's fork before it became `sleep`.
        holding = [threading.Thread(target=client.exec_job, args=(
            "box", None, ["sh", "-c", f"touch {tmp_path}/held-$$; "
                                      f"while [ ! -e {gate} ]; do sleep 0.05; done"]))
            for _ in range(2)]
        for thread in holding:
            thread.start()
        testing.wait_until(lambda: len(list(tmp_path.glob("held-*"))) == 2,
                           "two execs running")
        with pytest.raises(errors.ResourceExhausted, match="user_max_execs = 2"):
            client.exec_job("box", None, ["true"])
        gate.touch()
        for thread in holding:
            thread.join(30)
        assert client.exec_job("box", None, ["echo", "again"])["returncode"] == 0
    finally:
        d.close()

