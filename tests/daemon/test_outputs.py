"""Outputs of host-process jobs: collected after each attempt into a store named by
sha256, listed, downloaded verified (a file, or a directory from its tar), never read
through a link out of the job's workspace, and collected on threads of their own so the
API's reads never wait behind them."""

from __future__ import annotations

import hashlib
import json
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.daemon.conftest import job_names

Cli = Callable[..., subprocess.CompletedProcess[str]]

MAKE = ("mkdir -p adapter/deep && printf 'W' > model.pt && printf 'cfg' > adapter/config.json"
        " && printf 'deep' > adapter/deep/x.bin && ln -s /etc/shadow adapter/leak"
        " && ln -s /etc/shadow shadow")
OUTPUTS = {"model": "/workspace/model.pt", "adapter/all": "adapter", "leak": "shadow",
           "missing": "nothing/here.txt"}


def make() -> nodus.Job:
    job = nodus.Job.run(name="maker", command=["sh", "-c", MAKE], outputs=OUTPUTS)
    job.wait(timeout=30)
    return job


@pytest.fixture(scope="module")
def maker(shared_daemon: testing.Daemon) -> nodus.Job:
    """One job whose outputs the module's tests read (none of them changes them)."""
    with shared_daemon.as_default():
        return make()


@pytest.fixture
def made(daemon: testing.Daemon, maker: nodus.Job) -> nodus.Job:
    return maker


def test_collected_and_listed(made: nodus.Job) -> None:
    listed = {o.name: o for o in made.outputs.list()}
    assert set(listed) == set(OUTPUTS)
    model = listed["model"]
    assert (model.collected, model.kind, model.size, model.attempt) == (True, "file", 1, 1)
    assert model.sha256 == hashlib.sha256(b"W").hexdigest()
    assert (listed["adapter/all"].collected, listed["adapter/all"].kind) == (True, "dir")
    assert listed["leak"].collected is False  # a link is never followed, so not collected
    assert listed["missing"].collected is False


@pytest.mark.filterwarnings("ignore:left out of the download")
def test_file_and_directory_downloads(made: nodus.Job, tmp_path: Path) -> None:
    assert made.outputs["model"].download(tmp_path / "m.pt").read_bytes() == b"W"
    tree = made.outputs["adapter/all"].download(tmp_path / "adapter")
    assert (tree / "config.json").read_text() == "cfg"
    assert (tree / "deep" / "x.bin").read_text() == "deep"
    assert not (tree / "leak").exists()  # a link to an absolute path is left out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter", "m.pt"]


def test_a_link_inside_a_directory_output_is_kept_as_a_link(
        own_daemon: testing.Daemon) -> None:
    daemon = own_daemon  # its own: every blob of the store is looked at
    make()
    blobs = list((daemon.data_dir / "blobs").glob("*/*"))
    tars = [b for b in blobs if tarfile.is_tarfile(b)]
    assert len(tars) == 1
    with tarfile.open(tars[0]) as tar:
        leak = tar.getmember("leak")
        assert leak.issym() and leak.linkname == "/etc/shadow"
    shadow = Path("/etc/shadow").read_bytes()
    assert all(shadow not in b.read_bytes() for b in blobs)


@pytest.mark.filterwarnings("ignore:left out of the download")
def test_prefix_download(made: nodus.Job, tmp_path: Path) -> None:
    made.outputs.download(tmp_path, prefix="adapter/")
    assert (tmp_path / "all" / "config.json").read_text() == "cfg"
    assert not (tmp_path / "model.pt").exists()


def test_not_collected_is_404(made: nodus.Job, tmp_path: Path) -> None:
    with pytest.raises(errors.NotFound, match="was not collected"):
        made.outputs["missing"].download(tmp_path / "x")
    with pytest.raises(errors.NotFound, match="declares no output"):
        made.outputs["undeclared"].download(tmp_path / "x")
    assert list(tmp_path.iterdir()) == []


def test_tampered_store_raises_and_leaves_nothing(own_daemon: testing.Daemon,
                                                  tmp_path: Path) -> None:
    daemon = own_daemon  # its own: the blob it damages is every job's that wrote "W"
    made = make()
    blob = daemon.data_dir / "blobs" / hashlib.sha256(b"W").hexdigest()[:2] / \
        hashlib.sha256(b"W").hexdigest()
    blob.write_bytes(b"X")
    with pytest.raises(errors.ChecksumMismatch):
        made.outputs["model"].download(tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_job_still_has_its_outputs(daemon: testing.Daemon, tmp_path: Path) -> None:
    job = nodus.Job.run(command=["sh", "-c", "echo partial > log.txt; exit 3"],
                        outputs={"log": "log.txt"})
    with pytest.raises(errors.JobFailed):
        job.wait(timeout=30)
    assert job.outputs["log"].download(tmp_path).read_text() == "partial\n"


@pytest.mark.parametrize(("outputs", "message"), [
    ({"x": "../etc/passwd"}, "may not contain '..'"),
    ({"x": "/etc/passwd"}, "collected from the job.s workspace"),
    ({"../x": "a"}, "not an output name"),
    ({"x": "/workspace"}, "whole workspace"),
    ({"x": 3}, "must be a string"),
])
def test_bad_outputs_are_400(daemon: testing.Daemon, outputs: dict[str, object],
                             message: str) -> None:
    before = job_names(daemon)
    with pytest.raises(errors.InvalidArgument, match=message):
        nodus.Job.create(command=["true"], outputs=outputs)  # type: ignore[arg-type]
    assert job_names(daemon) == before


def test_cli(cli: Cli, tmp_path: Path) -> None:
    run = cli("job", "run", "--name", "c", "--output", "result=out.txt", "--", "sh", "-c",
              "echo 42 > out.txt")
    assert run.returncode == 0, run.stderr
    listed = json.loads(cli("job", "outputs", "c", "--json").stdout)
    assert [(o["name"], o["collected"], o["size"]) for o in listed] == [("result", True, 3)]
    got = cli("job", "download-output", "c", "result", str(tmp_path / "r.txt"))
    assert got.returncode == 0 and (tmp_path / "r.txt").read_text() == "42\n"
    assert "result" in cli("job", "outputs", "c").stdout


def test_deep_and_empty_directory_outputs(daemon: testing.Daemon, tmp_path: Path) -> None:
    job = nodus.Job.run(command=["sh", "-c",
                                 "mkdir empty; d=deep; for i in $(seq 1100); do d=$d/x; done;"
                                 " mkdir -p $d && echo ok > deep/top.txt"],
                        outputs={"empty": "empty", "deep": "deep"})
    assert job.wait(timeout=60).phase == "Succeeded"  # a deep tree never fails the job
    assert list((job.outputs["empty"].download(tmp_path / "e")).iterdir()) == []
    deep = job.outputs["deep"].download(tmp_path / "d")
    assert (deep / "top.txt").read_text() == "ok\n"


def test_api_reads_never_wait_behind_output_collection(own_daemon: testing.Daemon) -> None:
    """Seven jobs with 1.5 GB sparse outputs made another user's file listing take 28 s:
    collection shared the default thread pool (six threads here) with the API's reads.
    Here seven 1 GiB outputs are hashed two at a time on threads of their own, and reads
    keep being answered meanwhile (with the shared pool, a handful would be)."""
    daemon = own_daemon  # its own: it counts every job's exit record
    client = daemon.client()
    client.create_job({"name": "other", "command": ["sh", "-c", "echo hi > f"], "cpu": "100m"})
    assert client.wait_job("other", timeout=30)["phase"] == "Succeeded"
    big = [f"big-{i}" for i in range(7)]
    for name in big:
        client.create_job({"name": name, "command": ["truncate", "-s", "1G", "out"],
                           "cpu": "100m", "outputs": {"out": "out"}})
    exits = daemon.data_dir / "jobs"
    testing.wait_until(lambda: len(list(exits.glob("*/attempt-1/exit.json"))) == 8,
                       "every job's process has exited")
    answered = 0
    while sum(client.get_job(name)["phase"] == "Running" for name in big) >= 3:
        assert client.list_files("other")
        answered += 1
    assert answered >= 20, answered
    for name in big:
        assert client.wait_job(name, timeout=120)["phase"] == "Succeeded"


def test_a_downloaded_output_file_keeps_its_mode(daemon: testing.Daemon, tmp_path: Path,
                                                 ) -> None:
    """Issue 28: an output download was 0600 where the file was 0644 (a workspace download
    kept its mode); set-id bits are never given back."""
    with daemon.as_default():
        job = nodus.Job.create(
            command=["sh", "-c", "printf x > tool.sh && chmod 4755 tool.sh && "
                                 "printf y > notes.txt && chmod 0640 notes.txt"],
            outputs={"tool": "tool.sh", "notes": "notes.txt"})
        job.wait(timeout=60)
        tool = job.outputs["tool"].download(tmp_path / "tool.sh")
        notes = job.outputs["notes"].download(tmp_path / "notes.txt")
    assert oct(tool.stat().st_mode & 0o7777) == oct(0o755)
    assert oct(notes.stat().st_mode & 0o7777) == oct(0o640)
