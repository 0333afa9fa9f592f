"""Host jobs see the container's world (issue 25, part 3, and part 4's GPU devices), with each
shim and the box's real mounts: /workspace is the job's workspace in a mount namespace of its
own, a volume or a checkpoint sits at the path it asked for, the host's file system is left
as it was, `job exec` enters the same namespace, and a job opens only its own GPU nodes.
Needs root."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.daemon.runtime import compiled_shim
from noduslocal.daemon.runtime.attempt_dir import read_exit
from noduslocal.daemon.runtime.host.namespace import Namespaces
from noduslocal.daemon.runtime.host.spawner import Spawner
from noduslocal.testing import wait_until
from tests.conftest import run_cli

DEADLINE = 60
HOST_WORKSPACE = Path("/workspace")
FOUR_GPUS = 'simulate_gpus = "4xH100"\n'
NOBODY = 65534

pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                reason="mount namespaces need root")


def shim_config(which: str) -> str:
    return f'host_shim = "{"python" if which == "python" else "auto"}"\n'


@pytest.fixture(params=["python", "compiled"])
def daemon(request: pytest.FixtureRequest) -> Iterator[testing.Daemon]:
    with testing.daemon(cpus=2, memory="8GiB", config=shim_config(request.param)) as d:
        yield d


def log_of(d: testing.Daemon, name: str) -> str:
    return b"".join(d.client().logs(name)).decode(errors="replace")


def host_workspace_untouched() -> None:
    """The daemon's mount point on the host: empty, root's, 0755, whatever jobs wrote."""
    info = HOST_WORKSPACE.lstat()
    assert stat.S_ISDIR(info.st_mode) and info.st_uid == 0, info
    assert stat.S_IMODE(info.st_mode) == 0o755, oct(info.st_mode)
    assert not any(HOST_WORKSPACE.iterdir()), list(HOST_WORKSPACE.iterdir())


def test_a_job_writes_its_own_workspace_not_the_hosts(daemon: testing.Daemon,
                                                      tmp_path: Path) -> None:
    run = run_cli(daemon, "job", "run", "--name", "out", "--", "sh", "-c",
                  'echo hi > /workspace/out.txt; pwd; echo "$NODUS_WORKSPACE"; '
                  'echo "$NODUS_METRICS_FILE"', timeout=DEADLINE)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == ["/workspace", "/workspace",
                                       "/workspace/.nodus-metrics.jsonl"]
    listed = json.loads(run_cli(daemon, "ls", "out", "--json").stdout)
    assert [e["name"] for e in listed] == ["out.txt"]
    got = run_cli(daemon, "download", "out", "/workspace/out.txt", str(tmp_path / "o.txt"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "o.txt").read_text() == "hi\n"
    host_workspace_untouched()


def test_the_references_volume_mounts_work_as_a_host_job(daemon: testing.Daemon) -> None:
    # reference/super-jobs-and-sweeps.md, "SDK mirrors": the mount point is no host path.
    missing = [Path("/results"), Path("/srv/nl-ns-test")]
    assert not any(p.exists() for p in missing), "the test needs these absent on the host"
    c = daemon.client()
    c.create_volume("results")
    c.create_volume("deep")
    job = nodus.Client().project().job(
        'sh -c \'echo weights > /results/model.pt && echo "$NODUS_VOLUME_RESULTS" && '
        'echo deep > /srv/nl-ns-test/a/b/f && ls /srv >/dev/null && '
        '{ touch /results/../x 2>/dev/null && echo wrote / || echo read-only /; }\'',
        volume_mounts=[{"name": "results", "mount_path": "/results"},
                       {"name": "deep", "mount_path": "/srv/nl-ns-test/a/b"}])
    done = job.wait()
    # What the namespace made room for / in is no place to write, even for root.
    assert (done.exit_code, done.output.splitlines()) == (0, ["/results", "read-only /"]), done
    files = c.volume_files("results")
    assert [(f["name"], f["size"]) for f in files] == [("model.pt", 8)]
    assert [f["name"] for f in c.volume_files("deep")] == ["f"]
    assert not any(p.exists() for p in missing)
    assert not Path("/x").exists()
    host_workspace_untouched()


@pytest.mark.parametrize("through", ["a directory", "a link to /etc"])
def test_a_mount_path_through_another_users_files_is_refused(
        daemon: testing.Daemon, tmp_path: Path, through: str) -> None:
    """A missing mount path is made as root: through a directory or link another user owns
    (in /tmp, say), which may be swapped meanwhile for a link into /etc, the shim refuses
    it, and nothing is made there or on the host (found by review)."""
    theirs = Path(f"/tmp/nl-ns-theirs-{os.getpid()}")
    if through == "a directory":
        theirs.mkdir()
    else:
        theirs.symlink_to("/etc")
    os.lchown(theirs, NOBODY, NOBODY)
    try:
        c = daemon.client()
        c.create_volume("v")
        c.create_job({"name": "through", "command": ["true"],
                      "volumes": {f"{theirs}/nl-new/deeper": "v"}})
        job = c.wait_job("through", timeout=DEADLINE)
        assert (job["phase"], job["exit_code"]) == ("Failed", 126), job
        assert f"passes through {theirs}, which is not root's" in log_of(daemon, "through")
        assert not Path("/etc/nl-new").exists()
        if through == "a directory":
            assert not any(theirs.iterdir())
    finally:
        if theirs.is_symlink():
            theirs.unlink()
        else:
            with contextlib.suppress(OSError):
                theirs.rmdir()


CHECKPOINTED = ('if [ -e /ckpt/nl-ns/step ]; then echo "resumed at $(cat /ckpt/nl-ns/step) '
                'in $NODUS_CHECKPOINT_DIR"; exit 0; fi; echo 41 > /ckpt/nl-ns/step; '
                'echo started; sleep 60')


def test_an_absolute_checkpoint_survives_a_retry(daemon: testing.Daemon) -> None:
    assert not Path("/ckpt").exists(), "the test needs /ckpt absent on the host"
    c = daemon.client()
    c.create_job({"name": "ck", "retries": 1, "checkpoint": "/ckpt/nl-ns",
                  "command": ["sh", "-c", CHECKPOINTED]})
    wait_until(lambda: "started" in log_of(daemon, "ck"), "the first attempt", timeout=DEADLINE)
    pid = json.loads(next(daemon.data_dir.glob("jobs/*/attempt-1/pid.json")).read_text())
    os.kill(pid["shim_pid"], 9)  # a lost box: the retry runs with the same checkpoint
    job = c.wait_job("ck", timeout=DEADLINE)
    assert (job["phase"], job["attempts"]) == ("Succeeded", 2), job
    assert "resumed at 41 in /ckpt/nl-ns" in log_of(daemon, "ck")
    assert not Path("/ckpt").exists()
    # Kept beside the workspace, as a container's checkpoint outside /workspace is.
    assert (next(daemon.data_dir.glob("jobs/*/checkpoint")) / "step").read_text() == "41\n"


def test_exec_enters_the_jobs_namespace(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_volume("shared")
    c.create_job({"name": "long", "volumes": {"/shared": "shared"}, "command": [
        "sh", "-c", "echo mine > /workspace/marker; echo ready; sleep 60"]})
    wait_until(lambda: "ready" in log_of(daemon, "long"), "the job", timeout=DEADLINE)
    done = c.exec_job("long", None, ["sh", "-c", "pwd; cat /workspace/marker; ls -d /shared"])
    assert (done["returncode"], done["stdout"].splitlines()) == (
        0, ["/workspace", "mine", "/shared"]), done
    c.cancel_job("long")
    assert c.wait_job("long", timeout=DEADLINE)["phase"] == "Cancelled"


def test_doctor_says_how_host_jobs_are_contained(daemon: testing.Daemon) -> None:
    lines = {c["name"]: c for c in json.loads(run_cli(daemon, "doctor", "--json").stdout)}
    assert lines["host job namespaces"]["ok"] is True, lines["host job namespaces"]
    assert "/workspace" in lines["host job namespaces"]["detail"]
    fence = lines["host job GPU devices"]
    assert fence["ok"] is True and "devices cgroup" in fence["detail"], fence


@pytest.mark.parametrize("state", ["a file", "not empty", "another owner's"])
def test_a_host_workspace_the_daemon_may_not_claim_turns_namespaces_off(
        tmp_path: Path, state: str) -> None:
    root = tmp_path / "workspace"
    if state == "a file":
        root.write_text("")
    else:
        root.mkdir()
        if state == "not empty":
            (root / "theirs").write_text("")
        else:
            os.chown(root, NOBODY, NOBODY)
    found = Namespaces.prepare(tmp_path, root)
    assert not found.enabled
    assert "not an empty root-owned directory" in found.why
    assert "without a mount namespace" in found.describe()
    fresh = Namespaces.prepare(tmp_path, tmp_path / "fresh")
    assert fresh.enabled and stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o755


# --- GPU device nodes ----------------------------------------------------------------------


@pytest.fixture
def gpu_nodes() -> Iterator[list[str]]:
    """/dev/nvidia0..3 as the driver would make them (c 195:N); only those made here are
    removed after."""
    made = []
    try:
        for minor in range(4):
            node = f"/dev/nvidia{minor}"
            if not os.path.exists(node):
                os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(195, minor))
                os.chmod(node, 0o666)
                made.append(node)
        yield [f"/dev/nvidia{minor}" for minor in range(4)]
    finally:
        for node in made:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(node)


OPEN_ALL = """
import errno, json, os
mine = {g["index"] for g in json.loads(os.environ["NODUS_GPUS"])}
for n in range(4):
    try:
        os.close(os.open(f"/dev/nvidia{n}", os.O_RDWR))
        what = "opened"
    except OSError as exc:
        what = errno.errorcode[exc.errno]
    print(n, "mine" if n in mine else "other", what)
"""


@pytest.mark.parametrize("which", ["python", "compiled"])
def test_a_host_job_opens_only_its_own_gpu_nodes(which: str, gpu_nodes: list[str]) -> None:
    del gpu_nodes
    with testing.daemon(cpus=2, memory="8GiB", config=FOUR_GPUS + shim_config(which)) as d:
        c = d.client()
        c.create_job({"name": "one", "gpu": 1, "command": [sys.executable, "-c", OPEN_ALL]})
        c.create_job({"name": "none", "command": [sys.executable, "-c", OPEN_ALL]})
        for name in ("one", "none"):
            assert c.wait_job(name, timeout=DEADLINE)["phase"] == "Succeeded", log_of(d, name)
        rows = [line.split() for line in log_of(d, "one").splitlines()]
        # Its own node: the driver's answer (none here); the others: the devices cgroup's.
        assert [r[2] for r in rows if r[1] == "mine"] in (["ENXIO"], ["ENODEV"]), rows
        assert [r[2] for r in rows if r[1] == "other"] == ["EPERM"] * 3, rows
        rows = [line.split() for line in log_of(d, "none").splitlines()]
        assert [r[2] for r in rows] == ["EPERM"] * 4, rows


@pytest.mark.parametrize("which", ["python", "compiled"])
def test_a_namespace_hides_other_gpu_nodes_where_no_devices_cgroup_can(
        which: str, gpu_nodes: list[str], tmp_path: Path) -> None:
    """cgroup v2's way (no BPF program of ours): the node of a GPU not granted is covered
    by an empty mode-0000 file in the job's namespace, which a non-root job cannot open."""
    del gpu_nodes
    binary = None if which == "python" else compiled_shim.find(tmp_path / "shim-data")
    if which == "compiled" and binary is None:
        pytest.skip("no C compiler for the compiled shim")
    hidden = tmp_path / "hidden-device"
    hidden.touch(mode=0)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    directory = tmp_path / "attempt"
    directory.mkdir()
    probe = "cat /dev/nvidia0; cat /dev/nvidia1; true"
    request = {"dir": str(directory), "argv": ["/bin/sh", "-c", probe],
               "env": {"PATH": "/usr/bin:/bin"}, "cwd": "/workspace", "uid": NOBODY,
               "gid": NOBODY, "groups": [NOBODY],
               "mounts": [[str(workspace), "/workspace"]], "hide": ["/dev/nvidia1"],
               "hide_with": str(hidden), "no_new_privs": False}
    os.chmod(tmp_path, 0o755)

    async def go() -> None:
        spawner = Spawner(binary)
        await spawner.start()
        try:
            shim_pid = await spawner.launch(request)
            await asyncio.wait_for(spawner.watch(directory, shim_pid), DEADLINE)
        finally:
            await spawner.close()

    asyncio.run(go())
    out = (directory / "output.log").read_text()
    assert read_exit(directory) is not None
    assert out.splitlines() == [
        "cat: /dev/nvidia0: No such device or address",  # ENXIO: the driver's (none here)
        "cat: /dev/nvidia1: Permission denied"], out  # EACCES: hidden
    assert stat.S_ISCHR(os.stat("/dev/nvidia1").st_mode)  # the host's node is as it was


def test_outputs_and_harvest_read_what_jobs_wrote_to_workspace(daemon: testing.Daemon,
                                                              tmp_path: Path) -> None:
    run = run_cli(daemon, "job", "run", "--name", "outs", "--output",
                  "model=/workspace/out/model.pt", "--", "sh", "-c",
                  "mkdir -p /workspace/out && echo w > /workspace/out/model.pt",
                  timeout=DEADLINE)
    assert run.returncode == 0, run.stderr
    got = run_cli(daemon, "job", "download-output", "outs", "model", str(tmp_path / "m.pt"))
    assert got.returncode == 0, got.stderr
    assert (tmp_path / "m.pt").read_text() == "w\n"
    made = run_cli(daemon, "map", "--no-code", "--no-canary", "--name", "h", "--", "sh", "-c",
                   'echo "r$0" > /workspace/result-$0.json', ":::", "0", "1")
    assert made.returncode == 0, made.stderr
    assert run_cli(daemon, "sweep", "wait", "h", timeout=DEADLINE).returncode == 0
    harvested = run_cli(daemon, "sweep", "harvest", "h", "*.json", str(tmp_path / "h"))
    assert harvested.returncode == 0, harvested.stderr
    assert (tmp_path / "h/task-1/result-1.json").read_text() == "r1\n"
    host_workspace_untouched()


def test_an_adopted_job_keeps_its_namespace(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "kept", "command": [
        "sh", "-c", "echo ready; sleep 60; echo late > /workspace/late"]})
    wait_until(lambda: "ready" in log_of(daemon, "kept"), "the job", timeout=DEADLINE)
    daemon.restart()  # kill -9, then start: the job ran on under its shim, in its namespace
    c = daemon.client()
    assert c.get_job("kept")["phase"] == "Running"
    done = c.exec_job("kept", None, ["sh", "-c", "echo again > /workspace/again; pwd"])
    assert (done["returncode"], done["stdout"]) == (0, "/workspace\n"), done
    listed = json.loads(run_cli(daemon, "ls", "kept", "--json").stdout)
    assert [e["name"] for e in listed] == ["again"]
    c.cancel_job("kept")
    assert c.wait_job("kept", timeout=DEADLINE)["phase"] == "Cancelled"
    host_workspace_untouched()


def holders(namespace: str) -> set[int]:
    """The processes with a descriptor open on the mount namespace `mnt:[N]`."""
    found = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == namespace:
                        found.add(int(proc.name))
    return found


def test_the_spawners_reaper_holds_a_jobs_namespace_until_it_exits(tmp_path: Path) -> None:
    """The compiled spawner's reaper holds each job's namespace from before its exec and
    drops it once the job exits, so the job's exit does not unmount the namespace itself
    (that waited for an RCU grace period before its shim heard of the end). Nothing holds
    it after."""
    release = tmp_path / "release"
    with testing.daemon(cpus=2, memory="8GiB", config=shim_config("compiled")) as d:
        c = d.client()
        c.create_job({"name": "held", "command": [
            "sh", "-c", f"readlink /proc/self/ns/mnt; until [ -e {release} ]; do sleep 0.05; "
            "done"]})
        wait_until(lambda: "mnt:[" in log_of(d, "held"), "the job", timeout=DEADLINE)
        namespace = log_of(d, "held").strip()
        assert namespace != os.readlink("/proc/self/ns/mnt")  # its own
        held_by = holders(namespace)
        assert held_by, "nothing holds the job's namespace"
        for pid in held_by:  # the reaper: a process of the compiled shim, not the job's
            exe = os.readlink(f"/proc/{pid}/exe")
            assert compiled_shim.binary_name() in exe, exe
        release.touch()
        assert c.wait_job("held", timeout=DEADLINE)["phase"] == "Succeeded"
        wait_until(lambda: not holders(namespace), "the namespace to be dropped",
                   timeout=DEADLINE)
