"""Volumes for host jobs: created and owned by a user, mounted into a job's workspace, its
files visible as soon as `wait` returns, read back verified, and removed only when no
unfinished job uses them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from tests.daemon.conftest import job_names

Cli = Callable[..., subprocess.CompletedProcess[str]]


def test_the_super_workflow(own_cli: Cli, tmp_path: Path) -> None:
    cli = own_cli  # its own daemon: `volume ls` lists every volume there is
    assert cli("volume", "create", "results").returncode == 0
    run = cli("job", "run", "--volume", "results:/workspace/results", "--", "sh", "-c",
              'echo weights > results/model.pt && echo "$NODUS_VOLUME_RESULTS"')
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip().endswith("/workspace/results")
    files = json.loads(cli("volume", "files", "results", "--json").stdout)
    assert [(f["name"], f["size"]) for f in files] == [("model.pt", 8)]
    got = cli("volume", "download", "results", "model.pt", str(tmp_path))
    assert got.returncode == 0 and (tmp_path / "model.pt").read_text() == "weights\n"
    listed = json.loads(cli("volume", "ls", "--json").stdout)
    assert [(v["name"], v["owner"]) for v in listed] == [("results", "root")]


def test_volumes_outlive_jobs_and_are_shared_between_them(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_volume("data")
    nodus.Job.run(command=["sh", "-c", "echo 1 > d/x"], volumes={"d": "data"}).wait(30)
    second = nodus.Job.run(command=["sh", "-c", "cat in/x"],
                           volumes={"/workspace/in": {"name": "data"}})
    second.wait(timeout=30)
    assert list(second.iter_logs()) == ["1"]


def test_rm_refused_while_an_unfinished_job_uses_it(daemon: testing.Daemon) -> None:
    c = daemon.client()
    before = [v["name"] for v in c.list_volumes()]
    c.create_volume("busy")
    job = nodus.Job.run(command=["sleep", "60"], volumes={"/workspace/v": "busy"})
    with pytest.raises(errors.Conflict, match="used by unfinished jobs"):
        c.delete_volume("busy")
    job.cancel()
    testing.wait_until(lambda: job.status().phase == "Cancelled", "the cancel")
    c.delete_volume("busy")
    assert [v["name"] for v in c.list_volumes()] == before
    assert not (daemon.data_dir / "volumes" / "busy").exists()


@pytest.mark.parametrize(("volumes", "kind", "message"), [
    # A host job's volume may sit anywhere a container's may (issue 25: its own mount
    # namespace): "/data" was refused "under /workspace"; what no mount may cover is.
    ({"/proc/x": "v"}, errors.InvalidArgument, "may not be covered"),
    ({"/workspace/x": "nope"}, errors.InvalidArgument, "there is no volume 'nope'"),
    ({"/workspace/x": "Bad_Name"}, errors.InvalidArgument, "not a valid name"),
    ({"/workspace/a": "v", "/workspace/a/b": "v"}, errors.InvalidArgument, "overlaps"),
])
def test_bad_volumes_are_refused(daemon: testing.Daemon, volumes: dict[str, object],
                                 kind: type[Exception], message: str) -> None:
    if "v" not in [v["name"] for v in daemon.client().list_volumes()]:  # one per module
        daemon.client().create_volume("v")
    before = job_names(daemon)
    with pytest.raises(kind, match=message):
        nodus.Job.create(command=["true"], volumes=volumes)  # type: ignore[arg-type]
    assert job_names(daemon) == before


def test_create_twice_is_409(daemon: testing.Daemon) -> None:
    daemon.client().create_volume("once")
    with pytest.raises(errors.AlreadyExists):
        daemon.client().create_volume("once")
