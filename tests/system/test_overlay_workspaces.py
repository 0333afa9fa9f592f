"""Issue 25 part 1: a source is unpacked once per (owner, content) into a snapshot that every
task of that owner shares, each task's workspace an overlay on it (real mounts, a real
daemon): what a task writes stays its own, ls and download see it after the end, a
container sees the merged /workspace, a daemon killed -9 leaves no mount once its sweep
ends, sweep gc and retention free the snapshot, and overlay_workspaces = false copies."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.files.overlay import overlay_mounts, unmount
from noduslocal.domain.jobs import JobRecord, JobSpec
from tests.conftest import BUSYBOX, run_cli


@pytest.fixture
def code(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    (root / "pkg").mkdir(parents=True)
    (root / "train.py").write_text("print('v1')\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    return root


def snapshots(d: testing.Daemon) -> list[Path]:
    return sorted(p for p in (d.data_dir / "snapshots").iterdir()
                  if not p.name.startswith("."))


def logs(job: nodus.Job) -> list[str]:
    return list(job.iter_logs())


def no_mounts(d: testing.Daemon) -> None:
    """Each ended attempt's mount goes once its processes are gone (a moment after the end
    is committed)."""
    testing.wait_until(lambda: overlay_mounts(d.data_dir) == [], "no overlay mounted")


def doctor(d: testing.Daemon) -> dict[str, Any]:
    found = d.client().transport.request("GET", "/v1/doctor", timeout=60)
    return next(c for c in found["checks"] if c["name"] == "workspaces")


def test_tasks_share_one_snapshot_and_keep_their_writes(
        daemon: testing.Daemon, code: Path) -> None:
    """Two tasks of one source read the same files (one snapshot: the code's inode is the
    snapshot's own); the first rewrites a code file and removes another, the second still
    reads both as they were, and ls/download of the first after its end show its view."""
    first = nodus.Job.run(command=["sh", "-c", "stat -c %i train.py; echo v2 > train.py; "
                                   "rm pkg/util.py; echo out > out.txt"], source=code)
    first.wait(timeout=30)
    second = nodus.Job.run(command=["sh", "-c", "stat -c %i train.py; cat train.py; "
                                    "cat pkg/util.py"], source=code)
    second.wait(timeout=30)
    assert first.status()["phase"] == second.status()["phase"] == "Succeeded"
    [snapshot] = snapshots(daemon)
    inode = str((snapshot / "train.py").stat().st_ino)
    assert logs(first) == [inode]
    assert logs(second) == [inode, "print('v1')", "X = 1"]
    assert (snapshot / "train.py").read_text() == "print('v1')\n"  # never written through
    client = daemon.client()
    assert {e["name"] for e in client.list_files(first.name)} == {"train.py", "pkg",
                                                                  "out.txt"}
    assert client.list_files(first.name, path="pkg") == []  # the removal is its view's
    got = client.download_file(first.name, None, "train.py", daemon.root / "got.py")
    assert got.read_text() == "v2\n"
    got = client.download_file(second.name, None, "pkg/util.py", daemon.root / "util.py")
    assert got.read_text() == "X = 1\n"
    no_mounts(daemon)  # ended, read, nothing left mounted
    assert doctor(daemon)["ok"] is True


def test_a_busy_workspace_is_detached_at_the_end(daemon: testing.Daemon, code: Path) -> None:
    """A process cd'ed into a task's workspace (a user's shell) when it ends: the daemon
    detaches the mount, says so, and goes on; the task's view still reads back."""
    job = nodus.Job.run(command=["sh", "-c", "touch started; sleep 2"], source=code)
    started = testing.wait_until(lambda: list(daemon.data_dir.glob("jobs/*/workspace/started")),
                                 "the task to start")
    workspace = started[0].parent
    shell = subprocess.Popen(["sleep", "60"], cwd=workspace)
    try:
        job.wait(timeout=30)
        assert job.status()["phase"] == "Succeeded"
        testing.wait_until(lambda: "was busy" in daemon.log(), "the detach to be said")
        no_mounts(daemon)
        names = {e["name"] for e in daemon.client().list_files(job.name)}
        assert names == {"train.py", "pkg", "started"}
    finally:
        shell.kill()
        shell.wait()


def test_a_container_sees_the_merged_workspace(
        daemon: testing.Daemon, code: Path, docker_client: Any) -> None:
    job = nodus.Job.run(image=BUSYBOX, command=["sh", "-c", "cat /workspace/train.py; "
                                                "echo c > /workspace/made.txt"],
                        source=code)
    job.wait(timeout=60)
    assert logs(job) == ["print('v1')"], job.status()
    assert len(snapshots(daemon)) == 1
    names = {e["name"] for e in daemon.client().list_files(job.name)}
    assert names == {"train.py", "pkg", "made.txt"}
    no_mounts(daemon)


def test_200_tasks_with_code_across_three_kill_9s(tmp_path: Path, code: Path) -> None:
    """The issue's check at its size: a 200-task sweep with code, the daemon killed -9 three
    times while tasks run in their workspaces' mounts; every task runs once, no mount is
    left once it ends, doctor finds none stale, and sweep gc frees the one snapshot."""
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chmod(tmp_path, 0o755)
    with testing.daemon(cpus=4, memory="8GiB") as d:
        made = run_cli(d, "map", "--name", "big", "--no-canary", "--no-wait",
                       "--max-parallel", "4", "--", "sh", "-c",
                       f"read v < train.py && echo $$ >> {runs}/{{}} && sleep 0.02",
                       ":::", *map(str, range(200)), cwd=code)
        assert made.returncode == 0, made.stderr
        for seen in (20, 80, 140):
            testing.wait_until(lambda seen=seen: len(list(runs.iterdir())) >= seen,
                               f"{seen} tasks to run", timeout=120)
            assert overlay_mounts(d.data_dir)  # the running (and next) tasks' workspaces
            d.kill()
            d.start()
        waited = run_cli(d, "sweep", "wait", "big", timeout=180)
        failed = [(j["name"], j["phase"], j["reason"], j["message"], j["attempts"])
                  for j in d.client().list_jobs(all=True) if j["phase"] != "Succeeded"]
        assert waited.returncode == 0, (waited.stdout, failed, d.log()[-4000:])
        ran = {int(p.name): p.read_text().split() for p in runs.iterdir()}
        assert sorted(ran) == list(range(200))
        assert [task for task, pids in ran.items() if len(pids) != 1] == []
        assert d.client().get_sweep("big")["counts"] == {"Succeeded": 200}
        no_mounts(d)
        assert doctor(d)["ok"] is True
        assert len(snapshots(d)) == 1
        assert d.client().gc_sweep("big")
        assert snapshots(d) == []


def test_retention_frees_the_snapshot_with_its_last_job(code: Path) -> None:
    """Two jobs of one source: the snapshot stays while either keeps its directory, and
    goes with the last; a restart counts its users from the job directories."""
    config = 'keep_ended = "1s"\ngc_every = "7d"\n[keep_ended_users]\nroot = "forever"\n'
    with testing.daemon(cpus=2, memory="8GiB", config=config) as d:
        first = nodus.Job.run(command=["true"], source=code)
        first.wait(timeout=30)
        second = nodus.Job.run(command=["true"], source=code)
        second.wait(timeout=30)
        assert len(snapshots(d)) == 1
        d.restart()
        d.client().remove_job(first.name)
        gc = d.client().transport.request("POST", "/v1/admin/gc",
                                          query={"dry_run": "false"})
        assert gc is not None
        assert len(snapshots(d)) == 1  # the second job still uses it
        d.client().remove_job(second.name)
        d.client().transport.request("POST", "/v1/admin/gc", query={"dry_run": "false"})
        assert snapshots(d) == []


def test_without_overlays_the_source_is_copied(code: Path) -> None:
    with testing.daemon(cpus=2, memory="8GiB", config="overlay_workspaces = false\n") as d:
        job = nodus.Job.run(command=["sh", "-c", "cat train.py; echo v2 > train.py"],
                            source=code)
        job.wait(timeout=30)
        assert logs(job) == ["print('v1')"]
        assert not (d.data_dir / "snapshots").exists() or snapshots(d) == []
        [workspace] = d.data_dir.glob("jobs/*/workspace")
        assert (workspace / "train.py").read_text() == "v2\n"  # a copy of its own
        assert not os.path.ismount(workspace)
        check = doctor(d)
        assert check["ok"] is None and "overlay_workspaces = false" in check["detail"]
        assert "overlayfs is not used (overlay_workspaces = false)" in d.log()


def test_a_retry_mounts_its_workspace_again(daemon: testing.Daemon, code: Path) -> None:
    """The first attempt's writes are there for the retry (as a checkpoint is), over the
    same snapshot, and the retry's end unmounts it."""
    made = run_cli(daemon, "map", "--name", "retried", "--no-canary", "--retries", "1",
                   "--", "sh", "-c", "if [ -e mark ]; then cat mark train.py; "
                   "else echo one > mark; exit 3; fi", ":::", "a", cwd=code)
    assert made.returncode == 0, made.stderr
    assert run_cli(daemon, "sweep", "wait", "retried").returncode == 0
    cell = nodus.Job.from_name("retried-0")
    assert cell.status()["phase"] == "Succeeded"
    assert cell.status()["attempts"] == 2
    assert logs(cell) == ["one", "print('v1')"]
    assert len(snapshots(daemon)) == 1
    no_mounts(daemon)


def test_map_from_a_finished_overlay_job(daemon: testing.Daemon, code: Path) -> None:
    """`map --from JOB` packs what the job's task saw (its view: a rewritten code file, a
    removed one gone, its own files) and its tasks share one snapshot of that."""
    setup = nodus.Job.run(command=["sh", "-c", "echo v2 > train.py; rm pkg/util.py; "
                                   "echo data > made.txt"], source=code)
    setup.wait(timeout=30)
    made = run_cli(daemon, "map", "--from", setup.name, "--name", "forked", "--", "sh", "-c",
                   "cat train.py made.txt; test ! -e pkg/util.py", ":::", "a", "b")
    assert made.returncode == 0, made.stderr
    assert run_cli(daemon, "sweep", "wait", "forked").returncode == 0
    for cell in ("forked-0", "forked-1"):
        assert logs(nodus.Job.from_name(cell)) == ["v2", "data"]
    assert len(snapshots(daemon)) == 2  # the code's, and the packed workspace's
    no_mounts(daemon)


def test_disk_use_never_counts_a_workspace_through_its_mount(tmp_path: Path) -> None:
    """A job directory's size (du, quotas) is its own files: a mounted workspace's
    snapshot is not counted once per task."""
    from noduslocal.daemon.disk.watch import allocated
    from noduslocal.daemon.files.overlay import _mount, unmount

    for part in ("lower", "job/upper", "job/work", "job/workspace"):
        (tmp_path / part).mkdir(parents=True)
    (tmp_path / "lower" / "big").write_bytes(os.urandom(1 << 20))
    _mount("overlay", tmp_path / "job/workspace", "overlay", 0,
           f"lowerdir={tmp_path / 'lower'},upperdir={tmp_path / 'job/upper'},"
           f"workdir={tmp_path / 'job/work'}")
    try:
        assert (tmp_path / "job/workspace/big").exists()
        assert allocated(tmp_path / "job", 10_000)[0] < 1 << 20
    finally:
        unmount(tmp_path / "job/workspace")


def test_a_users_disk_use_counts_their_snapshot_once(
        daemon: testing.Daemon, tmp_path: Path) -> None:
    """A snapshot is its owner's: `du` and the quota count it once among their job
    directories, however many tasks share it (it counted nowhere: a user could fill the
    disk with distinct sources under any quota)."""
    code = tmp_path / "heavy"
    code.mkdir()
    (code / "weights.bin").write_bytes(os.urandom(3 << 20))
    for _ in range(3):
        nodus.Job.run(command=["true"], source=code).wait(timeout=30)
    [snapshot] = snapshots(daemon)
    use = json.loads(run_cli(daemon, "du", "--json").stdout)["users"]
    [mine] = [u for u in use if u["uid"] == 0]
    assert 3 << 20 <= mine["workspaces"] < 4 << 20, mine  # once, not three times
    assert snapshot.name.startswith("0-")


def test_doctor_names_a_stale_mount_and_a_restart_removes_it(tmp_path: Path) -> None:
    """An overlay under the jobs' directory that no attempt or reader holds (one a crash
    left, or an admin's by hand): doctor says so and names it; the next start unmounts it."""
    with testing.daemon(cpus=2, memory="4GiB") as d:
        parts = {name: tmp_path / name for name in ("lower", "upper", "work")}
        for path in parts.values():
            path.mkdir()
        point = d.data_dir / "jobs" / "4242" / "workspace"
        point.mkdir(parents=True)
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={parts['lower']},upperdir={parts['upper']},"
                        f"workdir={parts['work']}", str(point)], check=True)
        try:
            found = doctor(d)
            assert found["ok"] is False and str(point) in found["detail"], found
            d.stop()
            d.start()
            assert overlay_mounts(d.data_dir) == []
            assert doctor(d)["ok"] is True
        finally:
            if point in overlay_mounts(d.data_dir):
                subprocess.run(["umount", str(point)], check=False)


def test_a_cancelled_sweep_leaves_no_mount_made_ahead(
        daemon: testing.Daemon, code: Path) -> None:
    """A sweep's next cell is mounted before its start; cancelled before it started, its
    mount goes with it."""
    made = run_cli(daemon, "map", "--name", "halted", "--no-canary", "--no-wait",
                   "--max-parallel", "1", "--", "sh", "-c", "sleep 60", ":::", "a", "b", "c",
                   cwd=code)
    assert made.returncode == 0, made.stderr
    try:
        testing.wait_until(lambda: len(overlay_mounts(daemon.data_dir)) == 2,
                           "the running cell's mount and the next one's, made ahead")
    except AssertionError as exc:  # once in CI, under load: say what there was instead
        cells = {j["name"]: j["phase"] for j in daemon.client().list_jobs(all=True)}
        raise AssertionError(f"{exc}; mounted: {overlay_mounts(daemon.data_dir)}; cells: "
                             f"{cells}; the daemon's log ends:\n{daemon.log()[-3000:]}") from None
    assert run_cli(daemon, "sweep", "cancel", "halted").returncode == 0
    run_cli(daemon, "sweep", "wait", "halted")
    no_mounts(daemon)
    assert doctor(daemon)["ok"] is True


def test_a_cell_made_ahead_with_code_takes_its_mount_at_its_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cell with code made ahead (its overlay attached and mounted on the prepare-ahead
    thread) starts without doing any of it again on the loop (c35a5ca): its attempt takes
    the mount made ahead, sees the code there, and its end unmounts it. One whose mount
    made ahead was dropped (its sweep suspended) mounts again at its start."""
    layout = JobLayout(tmp_path / "data")
    layout.create_root()
    if layout.overlays.unavailable is not None:
        pytest.fail(f"overlayfs cannot be mounted here: {layout.overlays.unavailable}")
    packed = tmp_path / "code.tar"
    with tarfile.open(packed, "w") as tar:
        source = tmp_path / "train.py"
        source.write_text("print('v1')\n")
        tar.add(source, "train.py")
    sha = hashlib.sha256(packed.read_bytes()).hexdigest()
    layout.blobs.path(sha).parent.mkdir(parents=True)
    shutil.copy(packed, layout.blobs.path(sha))

    def cell(job_id: int) -> JobRecord:
        return JobRecord(id=job_id, project="p", name=f"c{job_id}", owner_uid=0,
                         owner_gid=0, owner="root", phase="Pending", labels={},
                         created_at=1.0, spec=JobSpec(command=["true"], source=sha))

    ahead, dropped = cell(7), cell(8)
    try:
        for record in (ahead, dropped):
            layout.prepare_ahead(record)
            assert layout.overlays.is_ahead(record.id)
        layout.drop_ahead(dropped.id)
        assert not layout.overlays.holds(dropped.id)
        with monkeypatch.context() as patched:
            def redone(*_: object) -> None:
                raise AssertionError("done again at the start")
            patched.setattr(layout, "write_record", redone)
            patched.setattr(layout, "_fill", redone)
            assert layout.prepare(ahead, 1) == layout.attempt_dir(7, 1)
        assert layout.prepare(dropped, 1) == layout.attempt_dir(8, 1)
        for record in (ahead, dropped):
            assert layout.overlays.holds(record.id)
            assert not layout.overlays.is_ahead(record.id)
            assert (layout.workspace(record.id) / "train.py").read_text() == "print('v1')\n"
            layout.end_attempt(record.id, 1)
        assert overlay_mounts(layout.jobs_dir) == []
    finally:  # a failure leaves no mount in the host's table (and in pytest's clean-up)
        for point in overlay_mounts(layout.jobs_dir):
            unmount(point)
