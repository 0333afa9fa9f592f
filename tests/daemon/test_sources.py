"""Sources: packed by the client without .git and with .gitignore and .nodusignore honoured,
sent once by sha256, unpacked into the workspace (as the owner's files) before the first
attempt, and nothing outside it."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.conftest import run_cli
from tests.daemon.conftest import job_names

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    (root / "pkg").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "train.py").write_text("print('training')\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "pkg" / "cache.pyc").write_bytes(b"\0")
    (root / "data" / "big.bin").write_bytes(b"x" * 1000)
    (root / ".nodusignore").write_text("*.pyc\ndata/\n")
    return root


def test_sdk_source_dir_lands_in_the_workspace(daemon: testing.Daemon, project: Path) -> None:
    job = nodus.Job.run(command=["sh", "-c", "find . -type f | sort; python3 train.py"],
                        source=project)
    job.wait(timeout=30)
    assert list(job.iter_logs()) == ["./.nodusignore", "./pkg/util.py", "./train.py",
                                     "training"]


def test_map_from_a_checkout_sends_neither_git_nor_what_it_ignores(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    """`noduslocal map` run in a checkout (its default code is the working directory): the
    task sees neither .git (a directory, and a submodule's .git file) nor the data/ and
    *.ckpt of .gitignore, nor what a nested .gitignore leaves out; stderr says what was sent,
    and --json keeps that line out (stdout stays one JSON document either way)."""
    repo = tmp_path / "repo"
    for rel, content in {".git/HEAD": "ref: refs/heads/main\n", ".git/objects/ab/c": "x",
                         ".gitignore": "data/\n*.ckpt\n", "data/big.bin": "x" * 5000,
                         "model.ckpt": "x", "src/train.py": "print(1)\n",
                         "src/.gitignore": "/scratch.txt\n", "src/scratch.txt": "x",
                         "vendor/lib/.git": "gitdir: ../../.git/modules/lib\n",
                         "vendor/lib/lib.py": "y\n"}.items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(content)
    created = run_cli(daemon, "map", "--name", "checkout", "--no-canary", "--", "sh", "-c",
                      "find . -mindepth 1 | sort", ":::", "a", cwd=repo)
    assert created.returncode == 0, created.stderr
    assert re.search(rf"^code: [0-9.]+ KiB in 4 files from {re.escape(str(repo.resolve()))} "
                     r"\(\.git and ignored files left out\)$", created.stderr, re.M), \
        created.stderr
    assert "the biggest" not in created.stderr  # far under the threshold
    assert run_cli(daemon, "sweep", "wait", "checkout").returncode == 0
    seen = b"".join(daemon.client().logs("checkout-0")).decode().split()
    assert seen == ["./.gitignore", "./src", "./src/.gitignore", "./src/train.py", "./vendor",
                    "./vendor/lib", "./vendor/lib/lib.py"]
    quiet = run_cli(daemon, "map", "--name", "checkout-json", "--no-canary", "--no-wait",
                    "--json", "--", "true", ":::", "a", cwd=repo)
    assert quiet.returncode == 0, quiet.stderr
    assert "code:" not in quiet.stderr
    assert json.loads(quiet.stdout)["name"] == "checkout-json"


def test_cli_upload_puts_each_path_at_its_name(cli: Cli, project: Path) -> None:
    run = cli("job", "run", "--upload", str(project / "train.py"), "--include",
              str(project / "pkg"), "--", "sh", "-c", "find . -type f | sort")
    assert run.returncode == 0, run.stderr
    # proj/.nodusignore is not at the top of the uploaded pkg/, so it does not apply there.
    assert run.stdout.split() == ["./pkg/cache.pyc", "./pkg/util.py", "./train.py"]
    assert cli("job", "run", "--upload", "/nonexistent", "--", "true").returncode == 2


def test_sent_once(own_daemon: testing.Daemon, project: Path) -> None:
    daemon = own_daemon  # its own: it counts every blob of the store
    client = daemon.client()
    first = client.upload_source([project], contents_of_single_dir=True)
    second = client.upload_source([project], contents_of_single_dir=True)
    assert first == second
    assert len(list((daemon.data_dir / "blobs").glob("*/*"))) == 1


def test_a_source_can_only_be_used_by_who_sent_it(daemon: testing.Daemon) -> None:
    before = job_names(daemon)
    with pytest.raises(errors.InvalidArgument, match="uploaded no source"):
        nodus.Job.create(command=["true"], source={"sha256": "0" * 64})
    with pytest.raises(errors.InvalidArgument, match=r'expected \{"sha256"'):
        nodus.Job.create(command=["true"], source={"path": "x"})
    with pytest.raises(errors.InvalidArgument, match="only means something with a source"):
        nodus.Job.create(command=["true"], allow_large_source=True)
    assert job_names(daemon) == before


def test_a_hostile_tar_stays_inside_the_workspace(daemon: testing.Daemon,
                                                  tmp_path: Path) -> None:
    """A tar made by hand (not by our packer) with an escaping path and a link out: it is
    unpacked with the owner's rights only, and `..` never leaves the workspace."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        escape = tarfile.TarInfo("../../escaped.txt")
        escape.size = 3
        tar.addfile(escape, io.BytesIO(b"bad"))
        link = tarfile.TarInfo("shadow")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/shadow"
        tar.addfile(link)
    data = buf.getvalue()
    sha = hashlib.sha256(data).hexdigest()
    archive = tmp_path / "evil.tar"
    archive.write_bytes(data)
    client = daemon.client()
    client.transport.upload(f"/v1/sources/{sha}", archive, len(data))
    job = nodus.Job.run(command=["true"], source={"sha256": sha})
    with pytest.raises(errors.JobFailed) as info:
        job.wait(timeout=30)  # tar, run as the job's owner, refuses the '..' member
    assert info.value.reason == "StartFailed"
    assert "tar" in str(info.value)
    assert not list(daemon.data_dir.glob("**/escaped.txt"))
    assert not (daemon.data_dir.parent / "escaped.txt").exists()


def test_upload_must_match_its_hash(daemon: testing.Daemon, tmp_path: Path) -> None:
    archive = tmp_path / "a.tar"
    archive.write_bytes(b"not what the name says")
    with pytest.raises(errors.InvalidArgument, match="hashes to"):
        daemon.client().transport.upload(f"/v1/sources/{'a' * 64}", archive, 22)


def test_a_source_that_is_not_a_tar_fails_its_job_saying_why(daemon: testing.Daemon,
                                                              tmp_path: Path) -> None:
    """Found by the API fuzz: the job failed, and the daemon logged a traceback of its own
    for what was the job's input."""
    data = tmp_path / "src"
    data.write_bytes(b"not a tar at all")
    sha = hashlib.sha256(data.read_bytes()).hexdigest()
    client = daemon.client()
    client.transport.upload(f"/v1/sources/{sha}", data, data.stat().st_size)
    client.create_job({"name": "bad-src", "command": ["true"], "source": {"sha256": sha}})
    ended = client.wait_job("bad-src", timeout=30)
    assert (ended["phase"], ended["reason"]) == ("Failed", "StartFailed")
    assert "preparing the workspace failed" in ended["message"]
    assert "Traceback" not in daemon.log()
