"""`job.exec` / `noduslocal job exec` beside a running host-process job: its environment,
workdir and owner, the exit status, masked secrets, and refusals."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

import noduslocal as nodus
from noduslocal import errors, testing

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def running(daemon: testing.Daemon) -> nodus.Job:
    daemon.client().set_secret("TOKEN", "exec-secret-value")
    job = nodus.Job.run(name="target", command=["sh", "-c", "echo ready > flag; sleep 60"],
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


def test_exec_sees_the_job(running: nodus.Job) -> None:
    proc = running.exec("sh", "-c", 'cat flag; echo "$MODE $NODUS_JOB $TOKEN"; pwd; exit 3')
    lines = proc.stdout.splitlines()
    assert lines[:2] == ["ready", "train target ***"]  # the secret is masked in the output
    assert lines[2].endswith("/workspace")
    assert (proc.returncode, proc.stderr, proc.truncated) == (3, "", False)
    running.cancel()


def test_cli_exec_returns_the_code(cli: Cli, running: nodus.Job) -> None:
    done = cli("job", "exec", "target", "--", "sh", "-c", "echo out; echo err >&2; exit 4")
    assert (done.returncode, done.stdout, done.stderr) == (4, "out\n", "err\n")
    missing = cli("job", "exec", "target", "--", "no-such-command")
    assert missing.returncode == 127 and "cannot execute" in missing.stderr
    running.cancel()


def test_exec_timeout_kills_it(running: nodus.Job, daemon: testing.Daemon) -> None:
    with pytest.raises(errors.WaitTimeout, match="killed"):
        daemon.client().exec_job("target", None, ["sleep", "30"], timeout=0.5)
    running.cancel()


def test_exec_needs_a_running_job(daemon: testing.Daemon) -> None:
    done = nodus.Job.run(command=["true"])
    done.wait(timeout=30)
    with pytest.raises(errors.Conflict, match="needs it Running"):
        done.exec("ls")
    with pytest.raises(errors.Unsupported, match="pty"):
        done.exec("sh", pty=True)
