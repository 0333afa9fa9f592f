"""A job's kept workspace through the API, the SDK (`job.files`) and the CLI (`noduslocal
ls` / `noduslocal download`): listing, verified downloads that keep the files' permission
bits, and nothing outside it."""

from __future__ import annotations

import hashlib
import json
import stat
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli

Cli = Callable[..., subprocess.CompletedProcess[str]]

MAKE = ("mkdir -p out/sub && printf 'weights' > out/model.pt && echo hi > notes.txt "
        "&& head -c 3000000 /dev/urandom > out/big.bin && ln -s /etc/shadow out/shadow "
        "&& ln -s .. out/up")


@pytest.fixture(scope="module")
def maker(shared_daemon: testing.Daemon) -> nodus.Job:
    """One job whose workspace the module's tests read (none of them changes it)."""
    with shared_daemon.as_default():
        job = nodus.Job.run(name="maker", command=["sh", "-c", MAKE])
    job.wait(timeout=30)
    return job


@pytest.fixture
def made(daemon: testing.Daemon, maker: nodus.Job) -> nodus.Job:
    return maker


def test_list_top_and_subdirectory(made: nodus.Job) -> None:
    top = {e.name: e.type for e in made.files.list()}
    assert top == {"notes.txt": "file", "out": "dir"}
    sub = {e.name: (e.type, e.get("target")) for e in made.files.list("/workspace/out")}
    assert sub == {"big.bin": ("file", None), "model.pt": ("file", None),
                   "shadow": ("link", "/etc/shadow"), "sub": ("dir", None),
                   "up": ("link", "..")}
    [one] = made.files.list("out/model.pt")
    assert (one.path, one.size) == ("out/model.pt", 7)


def test_download_is_whole_and_verified(made: nodus.Job, tmp_path: Path) -> None:
    saved = made.files.download("out/big.bin", tmp_path)
    assert saved == tmp_path / "big.bin"
    assert saved.stat().st_size == 3_000_000
    assert made.files.read("/workspace/out/model.pt") == b"weights"
    assert list(tmp_path.iterdir()) == [saved]  # no temporary file left beside it


def test_sha256_header_is_the_content_hash(daemon: testing.Daemon, made: nodus.Job) -> None:
    conn, _ = daemon.client().transport._conn(30)
    conn.send("GET", "/v1/jobs/maker/files/content?path=out/big.bin", {})
    resp = conn.response("GET")
    body = resp.read()
    assert resp.header("X-Nodus-SHA256") == hashlib.sha256(body).hexdigest()


@pytest.mark.parametrize(("path", "kind"), [
    ("out/shadow", errors.InvalidArgument),   # a link is never followed
    ("out/up/etc/passwd", errors.NotFound),   # nor walked through
    ("../../../etc/passwd", errors.InvalidArgument),
    ("out", errors.InvalidArgument),           # a directory
    ("nothing.txt", errors.NotFound),
])
def test_nothing_outside_the_workspace_is_read(made: nodus.Job, tmp_path: Path, path: str,
                                               kind: type[Exception]) -> None:
    with pytest.raises(kind):
        made.files.download(path, tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_a_job_that_has_not_started_has_no_workspace(daemon: testing.Daemon) -> None:
    hog = nodus.Job.run(name="hog", command=["sleep", "30"], cpu=2)
    testing.wait_until(lambda: hog.status().phase == "Running", "hog to run")
    never = nodus.Job.run(name="never", command=["true"], cpu=1)
    assert never.status().phase == "Pending"
    with pytest.raises(errors.NotFound, match="no workspace yet"):
        never.files.list()
    never.cancel()
    hog.cancel()


def test_cli_ls_and_download(cli: Cli, made: nodus.Job, tmp_path: Path) -> None:
    listed = cli("ls", "maker", "out", "--json")
    assert listed.returncode == 0
    assert {e["name"] for e in json.loads(listed.stdout)} == {
        "big.bin", "model.pt", "shadow", "sub", "up"}
    human = cli("ls", "maker")
    assert "out/" in human.stdout and "notes.txt" in human.stdout
    got = cli("download", "maker", "/workspace/notes.txt", str(tmp_path / "n.txt"))
    assert got.returncode == 0 and (tmp_path / "n.txt").read_text() == "hi\n"
    refused = cli("download", "maker", "out/shadow", str(tmp_path / "s"))
    assert refused.returncode == 2 and "not a regular file" in refused.stderr
    assert not (tmp_path / "s").exists()


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
