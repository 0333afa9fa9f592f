"""The CLI as a separate process, the way people and scripts use it: exit codes, --json,
attached runs that stream and return the job's code, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from noduslocal import testing

Cli = Callable[..., subprocess.CompletedProcess[str]]


def test_attached_run_streams_and_returns_the_exit_code(cli: Cli) -> None:
    done = cli("job", "run", "--name", "att", "--", "sh", "-c", "echo hi; echo err >&2; exit 4")
    assert done.returncode == 4
    assert done.stdout == "hi\nerr\n"
    assert "att: Failed (Error): exited with code 4" in done.stderr


def test_attached_success_is_zero(cli: Cli) -> None:
    done = cli("job", "run", "--env", "A=1", "--", "sh", "-c", "echo $A")
    assert (done.returncode, done.stdout, done.stderr) == (0, "1\n", "")


def test_detach_prints_the_name_and_wait_returns_the_code(cli: Cli) -> None:
    done = cli("job", "run", "--detach", "--name", "det", "--", "sh", "-c", "sleep 0.3; exit 3")
    assert (done.returncode, done.stdout) == (0, "det\n")
    waited = cli("job", "wait", "det")
    assert waited.returncode == 3
    assert "det: Failed" in waited.stdout


def test_read_commands_have_json(cli: Cli) -> None:
    cli("job", "run", "--name", "j1", "--label", "team=a", "--", "true")
    listed = json.loads(cli("job", "list", "--all", "--json").stdout)
    assert [j["name"] for j in listed] == ["j1"]
    status = json.loads(cli("job", "status", "j1", "--json").stdout)
    assert status["phase"] == "Succeeded" and status["labels"] == {"team": "a"}
    attempts = json.loads(cli("job", "attempts", "j1", "--json").stdout)
    assert [(a["number"], a["exit_code"]) for a in attempts] == [(1, 0)]
    human = cli("job", "list", "--all")
    assert "j1" in human.stdout and "Succeeded" in human.stdout


def test_logs_and_follow(cli: Cli) -> None:
    cli("job", "run", "--detach", "--name", "lf", "--", "sh", "-c",
        "echo one; sleep 0.5; echo two")
    followed = cli("job", "logs", "-f", "lf")
    assert (followed.returncode, followed.stdout) == (0, "one\ntwo\n")
    assert cli("job", "logs", "--tail", "1", "lf").stdout == "two\n"


def test_kill_cancels(cli: Cli) -> None:
    cli("job", "run", "--detach", "--name", "k", "--", "sleep", "60")
    killed = cli("job", "kill", "k")
    assert killed.returncode == 0
    waited = cli("job", "wait", "k", "--json")
    assert json.loads(waited.stdout)["phase"] == "Cancelled"
    assert waited.returncode == 143  # 128 + SIGTERM, as docker reports it


def test_timeout_and_wait_timeout(cli: Cli) -> None:
    run = cli("job", "run", "--timeout", "1s", "--", "sleep", "30")
    assert run.returncode == 143 and "Timeout" in run.stderr
    cli("job", "run", "--detach", "--name", "w", "--", "sleep", "30")
    waited = cli("job", "wait", "w", "--timeout", "0.3")
    assert waited.returncode == 124 and "still" in waited.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (("job", "run", "--name", "Bad", "--", "true"), "name"),
    (("job", "run", "--env", "NOEQUALS", "--", "true"), "--env"),
    (("job", "run", "--timeout", "soon", "--", "true"), "--timeout"),
    (("job", "run", "--cpu", "99", "--", "true"), "cpu"),
    (("job", "run", "--memory", "lots", "--", "true"), "memory"),
    (("job", "run", "--env", "1X=2", "--", "true"), "env"),
    (("job", "run"), "COMMAND"),
    (("job", "list", "--phase", "Done"), "phase"),
])
def test_usage_errors_exit_2_with_one_line(cli: Cli, daemon: testing.Daemon,
                                           args: tuple[str, ...], needle: str) -> None:
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr
    assert daemon.client().list_jobs(all=True) == []


def test_not_found_is_exit_1(cli: Cli) -> None:
    done = cli("job", "status", "nope")
    assert done.returncode == 1
    assert done.stderr.strip() == "noduslocal: job 'nope' not found in project 'root'"


def test_no_daemon_prints_where_it_looked(tmp_path: object) -> None:
    import os

    env = {**os.environ, "NODUSLOCAL_SOCKET": "/tmp/nl-absent/api.sock"}
    done = subprocess.run([sys.executable, "-m", "noduslocal.cli", "job", "list"],
                          capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "/tmp/nl-absent/api.sock" in lines[0] and "noduslocal daemon" in lines[0]


def test_daemon_command_runs_in_the_foreground(tmp_path: object) -> None:
    d = testing.Daemon()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "noduslocal.cli", "daemon", "--socket", str(d.socket),
             "--data-dir", str(d.data_dir), "--cpus", "1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 15
        while not d.socket.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert d.client().info()["capacity"]["cpus"] == 1.0
        proc.terminate()
        assert proc.wait(10) == 0
        assert "serving on" in (proc.stdout.read() if proc.stdout else "")
    finally:
        d.close()
