"""The CLI as a separate process, the way people and scripts use it: exit codes, --json,
attached runs that stream and return the job's code, one-line errors in one style, sizes
that need their unit, the caller's environment exported as sbatch does, and `job rm`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.testing import wait_until
from tests.conftest import run_cli
from tests.daemon.conftest import job_names

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


def test_read_commands_have_json(own_cli: Cli) -> None:
    cli = own_cli  # its own daemon: `job list --all` lists every job there is
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


def test_cancel_is_kill_under_the_apis_word(cli: Cli) -> None:
    cli("job", "run", "--detach", "--name", "c", "--", "sleep", "60")
    cancelled = cli("job", "cancel", "c", "--json")
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["name"] == "c"
    waited = cli("job", "wait", "c", "--json")
    assert json.loads(waited.stdout)["phase"] == "Cancelled"


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
    before = job_names(daemon)
    done = cli(*args)
    assert done.returncode == 2, done.stderr
    assert needle in done.stderr
    assert job_names(daemon) == before


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


def test_a_size_without_its_unit_is_refused_and_so_is_too_little_memory(
        daemon: testing.Daemon) -> None:
    before = job_names(daemon)
    bare = run_cli(daemon, "job", "run", "--memory", "16", "--", "true")
    assert bare.returncode == 2
    assert bare.stderr.strip() == ("noduslocal: memory: '16' has no unit; write 16G, 16GiB or "
                                   "16M (a bare number would be bytes)"), bare.stderr
    with pytest.raises(errors.InvalidArgument, match="too little to start a process") as info:
        daemon.client().create_job({"command": ["true"], "memory": 16})
    assert info.value.field == "memory"
    with pytest.raises(errors.InvalidArgument, match="too little"):
        daemon.client().create_job({"command": ["true"], "memory": "1MiB"})
    assert job_names(daemon) == before
    ok = daemon.client().create_job({"command": ["true"], "memory": "64MiB"})
    assert ok["spec"]["memory"] == 64 * 2**20


def test_cli_refusals_have_one_style(daemon: testing.Daemon) -> None:
    local = run_cli(daemon, "job", "run", "--timeout", "2x", "--", "true")
    remote = run_cli(daemon, "job", "run", "--cpu", "lots", "--", "true")
    unknown = run_cli(daemon, "job", "frobnicate")
    for out in (local, remote, unknown):
        assert out.returncode == 2, out
        assert out.stderr.startswith("noduslocal: ") and "Error:" not in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert local.stderr.startswith("noduslocal: --timeout: '2x' is not a duration"), local.stderr
    assert "see `noduslocal job run --help`" in local.stderr


def test_the_cli_exports_the_callers_environment_as_sbatch_does(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    tools = tmp_path / "bin"
    tools.mkdir()
    (tools / "mytool").write_text("#!/bin/sh\necho tool ran\n")
    (tools / "mytool").chmod(0o755)
    caller = {"PATH": f"{tools}:/usr/bin:/bin", "MYVAR": "from-the-shell"}
    script = 'echo "var=$MYVAR"; mytool'
    ran = run_cli(daemon, "job", "run", "--", "sh", "-c", script, env=caller)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["var=from-the-shell", "tool ran"], ran.stdout
    only = run_cli(daemon, "job", "run", "--export", "MYVAR", "--", "sh", "-c",
                   'echo "var=$MYVAR path=$PATH"', env=caller)
    assert only.returncode == 0 and "var=from-the-shell" in only.stdout, only
    assert str(tools) not in only.stdout
    bare = run_cli(daemon, "job", "run", "--export", "NONE", "--", "mytool", env=caller)
    assert bare.returncode == 127, bare
    assert "not found in PATH" in bare.stdout + bare.stderr
    assert "`--export PATH`" in bare.stdout + bare.stderr, bare
    explicit = run_cli(daemon, "job", "run", "--env", "MYVAR=given", "--", "sh", "-c",
                       'echo "var=$MYVAR"', env=caller)
    assert explicit.stdout.strip() == "var=given", explicit  # --env wins over the export
    missing = run_cli(daemon, "job", "run", "--export", "NOPE_NOT_SET", "--", "true",
                      env=caller)
    assert missing.returncode == 2
    assert missing.stderr.startswith("noduslocal: --export: NOPE_NOT_SET is not set"), missing
    secret = run_cli(daemon, "job", "run", "--secret", "MYVAR=s3cr3t", "--", "sh", "-c",
                     'echo "var=$MYVAR"', env=caller)
    assert secret.returncode == 0 and secret.stdout.strip() == "var=***", secret


def test_job_rm_frees_the_name_and_replace_runs_again(own_daemon: testing.Daemon,
                                                      tmp_path: Path) -> None:
    import sqlite3

    daemon = own_daemon  # its own: it reads every row of the database

    client = daemon.client()
    first = run_cli(daemon, "job", "run", "--name", "train", "--", "sh", "-c", "echo one")
    assert first.returncode == 0 and first.stdout.strip() == "one", first
    again = run_cli(daemon, "job", "run", "--name", "train", "--", "true")
    assert again.returncode != 0 and "already exists" in again.stderr, again
    removed = run_cli(daemon, "job", "rm", "train")
    assert removed.returncode == 0 and removed.stdout.strip() == "train: removed", removed
    with pytest.raises(errors.NotFound):
        client.get_job("train")
    assert [j["name"] for j in client.list_jobs(all=True)] == []
    with sqlite3.connect(daemon.data_dir / "noduslocal.db") as db:
        rows = db.execute("SELECT id, name, removed_at FROM jobs").fetchall()
        attempts = db.execute("SELECT COUNT(*) FROM attempts").fetchone()[0]
    assert len(rows) == 1 and rows[0][1] == f"train~{rows[0][0]}" and rows[0][2], rows
    assert attempts == 1  # kept: fair share and cost history count it
    assert not (daemon.data_dir / "jobs" / str(rows[0][0])).exists()

    gate = tmp_path / "gate"
    run_cli(daemon, "job", "run", "--detach", "--name", "train", "--", "sh", "-c",
            f"while [ ! -e {gate} ]; do sleep 0.05; done")
    wait_until(lambda: client.get_job("train")["phase"] == "Running", "running")
    busy = run_cli(daemon, "job", "rm", "train")
    assert busy.returncode == 1 and "cancel it first" in busy.stderr, busy
    replaced = run_cli(daemon, "job", "run", "--name", "train", "--replace", "--", "sh", "-c",
                       "echo two")
    assert replaced.returncode == 0 and replaced.stdout.strip() == "two", replaced
    assert [j["phase"] for j in client.list_jobs(all=True)] == ["Succeeded"]
    assert run_cli(daemon, "job", "run", "--replace", "--", "true").returncode == 2


def test_an_attached_run_on_a_terminal_names_its_job_first(daemon: testing.Daemon) -> None:
    """Issue 28: on a terminal the attached run says which job it made (for `download`,
    `logs` later); into a pipe its stderr stays the job's and the CLI's own words only."""
    import pty

    pid, fd = pty.fork()
    if pid == 0:
        os.environ["NODUSLOCAL_SOCKET"] = str(daemon.socket)
        os.execv(sys.executable, [sys.executable, "-m", "noduslocal.cli", "job", "run",
                                  "--", "echo", "from-the-job"])
    text = testing.pty_output(pid, fd)
    named = re.search(r"noduslocal: job (\S+) \(project \S+\); Ctrl-C detaches", text)
    assert named is not None and text.index("noduslocal: job") < text.index("from-the-job"), text


def test_sweep_watch_into_a_pipe_prints_a_line_per_change(daemon: testing.Daemon) -> None:
    """Issue 28: `sweep status --watch` into a pipe printed nothing until the end."""
    with daemon.as_default():
        import noduslocal as nodus

        nodus.Sweep({"command": ["sh", "-c", "sleep 1"]}, grid={"x": ["1", "2", "3"]},
                    name="watched", max_parallel=1).run()
    done = subprocess.run([sys.executable, "-m", "noduslocal.cli", "sweep", "status",
                           "watched", "--watch"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NODUSLOCAL_SOCKET": str(daemon.socket)})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) >= 2 and all(" watched: " in line for line in lines), lines
    assert "Succeeded" in lines[-1] and "3/3 done" in lines[-1], lines
    assert len(set(line.split(" ", 1)[1] for line in lines)) == len(lines)  # changes only
