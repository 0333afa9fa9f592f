"""Issue 12, what a new user hit: sizes that need their unit, one error style in the CLI,
refusals that say what the box has and name the job waited for, durations shown as
durations, errors that always carry `field`, a client leaving mid-stream logged as
nothing worse, and downloads that keep the file's permission bits. Real daemons.
"""

from __future__ import annotations

import json
import socket
import stat
import time
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.testing import wait_until
from tests.conftest import run_cli


def test_a_size_without_its_unit_is_refused_and_so_is_too_little_memory(
        daemon: testing.Daemon) -> None:
    bare = run_cli(daemon, "job", "run", "--memory", "16", "--", "true")
    assert bare.returncode == 2
    assert bare.stderr.strip() == ("noduslocal: memory: '16' has no unit; write 16G, 16GiB or "
                                   "16M (a bare number would be bytes)"), bare.stderr
    with pytest.raises(errors.InvalidArgument, match="too little to start a process") as info:
        daemon.client().create_job({"command": ["true"], "memory": 16})
    assert info.value.field == "memory"
    with pytest.raises(errors.InvalidArgument, match="too little"):
        daemon.client().create_job({"command": ["true"], "memory": "1MiB"})
    assert daemon.client().list_jobs(all=True) == []
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


def test_too_many_gpus_are_refused_with_what_the_box_has() -> None:
    with testing.daemon(config='simulate_gpus = "4xH100"\n') as d:
        for count in ("7", "99"):
            out = run_cli(d, "job", "run", "--gpus", count, "--", "true")
            assert out.returncode == 2, out
            assert f"gpu: {count} x GPU requested; this host has 4 x H100" in out.stderr, \
                out.stderr


def test_estimate_names_the_job_it_waits_for_and_status_shows_durations(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    client = daemon.client()
    blocker = client.create_job({"name": "hog", "cpu": 2,
                                 "command": ["sh", "-c", f"while [ ! -e {gate} ]; do "
                                             "sleep 0.05; done"]})
    wait_until(lambda: client.get_job("hog")["phase"] == "Running", "hog running")
    waiting = nodus.Job.create(name="after", command=["true"], cpu=2, timeout="2h",
                               expected_duration="90s")
    estimate = waiting.estimate()
    assert estimate["start_at"] is None
    assert f"({blocker['project']}/hog)" in estimate["start_basis"], estimate
    shown = run_cli(daemon, "job", "status", "after").stdout
    assert "timeout:    2h00m" in shown and "expected:   1m30s" in shown, shown
    gate.touch()
    assert waiting.wait(timeout=30).phase == "Succeeded"


def test_every_error_body_carries_field(daemon: testing.Daemon) -> None:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(daemon.socket))
        sock.sendall(b"GET /v1/jobs/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    body = json.loads(raw.split(b"\r\n\r\n", 1)[1])
    assert body["error"]["code"] == "NotFound" and body["error"]["field"] is None, body


def test_a_follower_that_leaves_is_no_error_in_the_daemons_log(
        daemon: testing.Daemon) -> None:
    daemon.client().create_job({"name": "talker", "command": [
        "sh", "-c", "while :; do echo tick; sleep 0.05; done"]})
    wait_until(lambda: daemon.client().get_job("talker")["phase"] == "Running", "running")
    for _ in range(3):
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(daemon.socket))
            sock.sendall(b"GET /v1/jobs/talker/logs?follow=1 HTTP/1.1\r\nHost: x\r\n\r\n")
            seen = b""
            while b"tick" not in seen:
                seen += sock.recv(65536)
            # Gone without a word, mid-stream, as Ctrl-C on `job logs -f` leaves.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00"
                            b"\x00\x00")
    time.sleep(0.5)  # lets the daemon's next write find the peer gone; no assertion on it
    daemon.client().cancel_job("talker")
    daemon.client().wait_job("talker", timeout=30)
    log = daemon.log()
    assert "Traceback" not in log and "Error handling request" not in log, log[-3000:]


def test_a_download_keeps_the_files_permission_bits(daemon: testing.Daemon,
                                                    tmp_path: Path) -> None:
    job = nodus.Job.run(name="modes", command=["sh", "-c", (
        "echo a > plain; chmod 644 plain; printf '#!/bin/sh\\necho hi\\n' > run.sh; "
        "chmod 755 run.sh; echo s > secret; chmod 600 secret; echo x > setid; "
        "chmod 4755 setid")])
    job.wait(timeout=30)
    for name, want in (("plain", 0o644), ("run.sh", 0o755), ("secret", 0o600),
                       ("setid", 0o755)):
        saved = job.files.download(name, tmp_path / name)
        assert stat.S_IMODE(saved.stat().st_mode) == want, (name, oct(saved.stat().st_mode))
    cli = run_cli(daemon, "download", "modes", "run.sh", str(tmp_path / "again.sh"))
    assert cli.returncode == 0, cli.stderr
    assert stat.S_IMODE((tmp_path / "again.sh").stat().st_mode) == 0o755


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


def test_job_rm_frees_the_name_and_replace_runs_again(daemon: testing.Daemon,
                                                      tmp_path: Path) -> None:
    import sqlite3

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
