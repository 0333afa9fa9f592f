"""What the daemon asks a host job's shim for (issue 25, part 3): the namespace's mounts,
parents first, links under /workspace left to the workspace; the paths the job is told;
and, where no namespace can be made, a refusal of paths outside /workspace at the start.
Pure: no shim runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.runtime.base import AttemptRef, GpuGrant, Launch, LaunchFailed
from noduslocal.daemon.runtime.host.namespace import Namespaces
from noduslocal.daemon.runtime.host.runtime import HostRuntime
from noduslocal.daemon.runtime.shim_request import launch_request
from noduslocal.domain.jobs import JobRecord, JobSpec


def job(uid: int = 0, **spec: object) -> JobRecord:
    return JobRecord(id=7, project="p", name="j", owner_uid=uid, owner_gid=uid,
                     owner="root" if uid == 0 else "someone", phase="Running",
                     spec=JobSpec(command=["true"], **spec), labels={},  # type: ignore[arg-type]
                     created_at=0.0)


SPEC = {"checkpoint": "/ckpt", "volumes": {"/results": "results", "/workspace/in": "data",
                                           "/a/b": "deep"}}


def test_the_namespace_binds_what_lies_outside_the_workspace(tmp_path: Path) -> None:
    layout = JobLayout(tmp_path)
    world = Namespaces(True, hide_with=str(tmp_path / "hidden")).request(
        layout, job(1000, **SPEC), [])
    ws = str(layout.workspace(7))
    assert world["mounts"] == [
        [ws, "/workspace"], [str(tmp_path / "volumes" / "deep"), "/a/b"],
        [str(tmp_path / "jobs" / "7" / "checkpoint"), "/ckpt"],
        [str(tmp_path / "volumes" / "results"), "/results"]]
    assert world["no_new_privs"] is True  # its own directories over host paths
    assert Namespaces(True).request(layout, job(0, **SPEC), [])["no_new_privs"] is False
    plain = Namespaces(True).request(layout, job(1000, volumes={"/workspace/in": "d"}), [])
    assert plain["mounts"] == [[ws, "/workspace"]] and plain["no_new_privs"] is False


def test_the_job_is_told_the_namespaces_paths_or_the_hosts(tmp_path: Path) -> None:
    layout = JobLayout(tmp_path)
    record = job(0, checkpoint="/workspace/ck", volumes={"/results": "results"})
    world = Namespaces(True).request(layout, record, [])
    inside = launch_request(layout, record, 1, world=world)
    assert (inside["cwd"], inside["env"]["NODUS_WORKSPACE"]) == ("/workspace", "/workspace")
    assert inside["env"]["NODUS_CHECKPOINT_DIR"] == "/workspace/ck"
    assert inside["env"]["NODUS_VOLUME_RESULTS"] == "/results"
    assert inside["env"]["NODUS_METRICS_FILE"] == "/workspace/.nodus-metrics.jsonl"
    host = launch_request(layout, job(0, checkpoint="/workspace/ck"), 1)
    ws = str(layout.workspace(7))
    assert (host["cwd"], host["env"]["NODUS_WORKSPACE"]) == (ws, ws)
    assert host["env"]["NODUS_CHECKPOINT_DIR"] == f"{ws}/ck"
    assert "mounts" not in host


@pytest.mark.parametrize("spec", [{"volumes": {"/results": "r"}}, {"checkpoint": "/ckpt"}])
def test_without_a_namespace_a_path_outside_the_workspace_fails_the_start(
        tmp_path: Path, spec: dict[str, object]) -> None:
    runtime = HostRuntime(JobLayout(tmp_path))
    runtime.namespaces = Namespaces(False, "the daemon is not root")
    directory = tmp_path / "attempt-1"
    directory.mkdir()
    launch = Launch(AttemptRef(job(0, **spec), 1, directory), {}, GpuGrant())
    with pytest.raises(LaunchFailed, match=r"outside /workspace.*the daemon is not root"):
        asyncio.run(runtime.launch(launch))


def test_a_grant_fences_the_other_gpus_nodes() -> None:
    from noduslocal.daemon.gpus.model import Gpu

    gpus = [Gpu(i, f"u{i}", "H100", "", 0, minor=m) for i, m in ((0, 3), (1, 2))]
    grant = GpuGrant(["u0", "u1"], gpus, True, False, (3, 2, 0, 1))
    assert grant.other_minors == [0, 1]  # NVML's minor numbers, not the indexes
    # A gang rank's share: the other rank's GPU is fenced off too.
    assert (grant.part(0, 1).other_minors, grant.part(1, 1).other_minors) == ([0, 1, 2],
                                                                              [0, 1, 3])
    assert Gpu(5, "u5", "H100", "", 0).device_minor == 5  # simulated: its index
