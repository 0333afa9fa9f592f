"""Container jobs with real docker containers: identity and confinement, the Kubernetes
meaning of command and args, logs, OOM, stops, missing images, checkpoints, volumes,
outputs, secrets and exec, starts that never wait behind execs, and the faults: the daemon
killed under a running container, dockerd restarted under one, dockerd unreachable."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.daemon.runtime.docker.execute import exec_in_container
from noduslocal.daemon.runtime.docker.spec import instance_id, job_filter
from noduslocal.domain import errors
from noduslocal.domain.states import Phase, Reason
from tests.conftest import BUSYBOX, PYTHON_IMAGE, run_cli

pytestmark = pytest.mark.usefixtures("docker_client")


def ours(client: Any, d: testing.Daemon) -> list[Any]:
    # sparse: a container removed between the listing and its inspect is no error
    return client.containers.list(all=True, sparse=True,
                                  filters=job_filter(instance_id(d.data_dir)))


def removed(client: Any, d: testing.Daemon) -> None:
    """The daemon removes a container once the attempt's end is committed."""
    testing.wait_until(lambda: ours(client, d) == [], "the containers to be removed")


def log_of(job: nodus.Job) -> str:
    return "\n".join(job.iter_logs())


def test_runs_as_the_submitter_confined_and_is_removed_after(
        daemon: testing.Daemon, docker_client: Any) -> None:
    job = nodus.Job.run(image=BUSYBOX, command=["sh", "-c", """
        echo "uid=$(id -u) gid=$(id -g) pwd=$(pwd) job=$NODUS_JOB ws=$NODUS_WORKSPACE"
        grep -E '^(CapEff|NoNewPrivs)' /proc/self/status
        cat /sys/fs/cgroup/pids/pids.max /sys/fs/cgroup/memory/memory.limit_in_bytes \
            /sys/fs/cgroup/memory/memory.memsw.limit_in_bytes 2>/dev/null
        df -k /dev/shm | tail -1
        echo to-stderr >&2
        echo made > /workspace/made.txt"""], memory="256MiB")
    job.wait(timeout=60)
    text = log_of(job)
    assert f"uid={os.getuid()} gid={os.getgid()} pwd=/workspace job={job.name} " \
           "ws=/workspace" in text
    assert "CapEff:\t0000000000000000" in text
    assert "NoNewPrivs:\t1" in text
    assert "8192" in text.split()  # pids limit
    assert str(256 * 2**20) in text.split()  # memory limit, and the same with swap
    assert text.split().count(str(256 * 2**20)) in (1, 2)
    shm_kib = [line for line in text.splitlines() if line.startswith("shm")]
    assert shm_kib and int(shm_kib[0].split()[1]) == 128 * 1024  # half the memory limit
    assert "to-stderr" in text
    stderr_only = "\n".join(job.iter_logs(stream="stderr"))
    assert stderr_only.strip() == "to-stderr"
    assert job.files.read("made.txt") == b"made\n"
    removed(docker_client, daemon)  # recorded, then removed


def test_exit_code_failure_and_labels(daemon: testing.Daemon, docker_client: Any) -> None:
    job = nodus.Job.run(image=BUSYBOX, command=["sh", "-c", "sleep 30"])
    # The container of the attempt that runs, found once the job is Running: a container
    # exists from its create on, and one whose start fails (dockerd under load) is removed
    # again, so the first container listed may be gone by the time it is read.
    running = testing.wait_until(lambda: (s := job.status())["phase"] != "Pending" and
                                 s["phase"] != "Starting" and s, "the job to start", timeout=60)
    assert running["phase"] == "Running", running
    [container] = docker_client.containers.list(all=True, filters={"label": [
        *job_filter(instance_id(daemon.data_dir))["label"], f"io.noduslocal.job={job.name}",
        f"io.noduslocal.attempt={running['attempts']}"]})
    container.reload()
    labels = container.labels
    assert labels["io.noduslocal.job"] == job.name
    assert labels["io.noduslocal.attempt"] == "1"
    assert labels["io.noduslocal.rank"] == "0"
    assert labels["io.noduslocal.owner"] == job.status()["owner"]
    attrs = container.attrs["HostConfig"]
    assert attrs["Init"] is True and attrs["CapDrop"] == ["ALL"]
    assert attrs["Privileged"] is False and "no-new-privileges" in attrs["SecurityOpt"]
    assert attrs["NanoCpus"] == 1_000_000_000
    assert attrs["AutoRemove"] is False
    job.cancel()
    with pytest.raises(errors.JobCancelled):
        job.wait(timeout=60)
    failing = nodus.Job.run(image=BUSYBOX, command=["sh", "-c", "echo bye; exit 7"])
    with pytest.raises(errors.JobFailed) as info:
        failing.wait(timeout=60)
    assert info.value.exit_code == 7 and "bye" in info.value.log_tail
    assert failing.status()["reason"] == Reason.ERROR


def test_command_and_args_have_the_kubernetes_meaning(daemon: testing.Daemon,
                                                      docker_client: Any) -> None:
    # An image whose entrypoint prints its arguments.
    image = "noduslocal-test/echo-entrypoint:1"
    build = Path(daemon.root) / "echo-image"
    build.mkdir()
    (build / "Dockerfile").write_text(
        f'FROM {BUSYBOX}\nENTRYPOINT ["/bin/echo", "entry"]\nCMD ["default-cmd"]\n')
    docker_client.images.build(path=str(build), tag=image, rm=True)
    try:
        cases = [
            ({}, "entry default-cmd"),  # image's entrypoint and CMD
            ({"args": ["a1", "a2"]}, "entry a1 a2"),  # args replace CMD only
            ({"command": ["/bin/echo", "cmd"]}, "cmd"),  # command replaces both
            ({"command": ["/bin/echo", "cmd"], "args": ["x"]}, "cmd x"),
        ]
        jobs = [(nodus.Job.run(image=image, **kwargs), want) for kwargs, want in cases]
        for job, want in jobs:
            job.wait(timeout=60)
            assert log_of(job).strip() == want
    finally:
        docker_client.images.remove(image, force=True)


def test_out_of_memory_is_oomkilled_and_not_retried(daemon: testing.Daemon) -> None:
    job = nodus.Job.create(
        image=PYTHON_IMAGE, memory="64MiB",
        command=["python3", "-c", "x = bytearray(512 * 2**20); print(len(x))"])
    client = daemon.client()  # the SDK has no `retries`; the API has
    with pytest.raises(errors.JobFailed) as info:
        job.wait(timeout=60)
    assert info.value.reason == Reason.OOM_KILLED
    status = job.status()
    assert status["attempts"] == 1
    assert "out of memory" in status["message"]
    retried = client.create_job({"image": PYTHON_IMAGE, "memory": "64MiB", "retries": 2,
                                 "command": ["python3", "-c", "bytearray(512 * 2**20)"]})
    final = client.wait_job(retried["name"], retried["project"], timeout=60)
    assert final["reason"] == Reason.OOM_KILLED and final["attempts"] == 1


def test_network_none_has_only_loopback(daemon: testing.Daemon) -> None:
    cmd = ["sh", "-c", "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"]
    isolated = nodus.Job.run(image=BUSYBOX, network="none", command=cmd)
    default = nodus.Job.run(image=BUSYBOX, command=cmd)
    isolated.wait(timeout=60)
    default.wait(timeout=60)
    assert log_of(isolated).split() == ["lo"]
    assert "eth0" in log_of(default).split()


def test_timeout_stops_the_container(daemon: testing.Daemon, docker_client: Any) -> None:
    job = nodus.Job.run(image=BUSYBOX, timeout=1,
                        command=["sh", "-c", "trap 'echo got-term; exit 0' TERM; "
                                             "while true; do sleep 0.1; done"])
    with pytest.raises(errors.JobFailed):
        job.wait(timeout=60)
    status = job.status()
    assert status["reason"] == Reason.TIMEOUT
    assert "got-term" in log_of(job)
    removed(docker_client, daemon)


def test_missing_image_fails_with_how_to_provide_it(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(image="noduslocal-test/not-there:9", command=["true"])
    with pytest.raises(errors.JobFailed):
        job.wait(timeout=120)
    status = job.status()
    assert status["reason"] == Reason.START_FAILED
    assert "noduslocal-test/not-there:9" in status["message"]
    assert "docker load" in status["message"] and "docker build" in status["message"]


def test_missing_executable_is_exit_127_and_leaves_no_container(
        daemon: testing.Daemon, docker_client: Any) -> None:
    job = nodus.Job.run(image=BUSYBOX, command=["/no/such/binary"])
    with pytest.raises(errors.JobFailed) as info:
        job.wait(timeout=60)
    assert info.value.exit_code == 127
    assert "/no/such/binary" in log_of(job)  # docker-init says what it could not run
    removed(docker_client, daemon)


def test_checkpoint_volume_outputs_and_workspace(daemon: testing.Daemon,
                                                 tmp_path: Path) -> None:
    client = daemon.client()
    client.create_volume("shared")
    job = nodus.Job.run(
        image=BUSYBOX, checkpoint="/ckpt", volumes={"/data": "shared"},
        outputs={"model": "/workspace/model.bin", "dir": "/workspace/out",
                 "secret": "/workspace/shadow"},
        command=["sh", "-c", """set -e
            echo "ckpt=$NODUS_CHECKPOINT_DIR vol=$NODUS_VOLUME_SHARED"
            echo step-1 > "$NODUS_CHECKPOINT_DIR/state"
            echo in-volume > /data/result.txt
            head -c 100000 /dev/urandom > /workspace/model.bin
            mkdir -p /workspace/out/sub && echo a > /workspace/out/sub/a.txt
            ln -s /etc/shadow /workspace/shadow"""])
    job.wait(timeout=60)
    assert "ckpt=/ckpt vol=/data" in log_of(job)
    # The checkpoint lives beside the workspace, owned by the submitter.
    ckpt = next(daemon.data_dir.glob("jobs/*/checkpoint"))
    assert (ckpt / "state").read_text() == "step-1\n"
    assert ckpt.stat().st_uid == os.getuid()
    # The volume's file is there as soon as wait() returned.
    names = [f["name"] for f in client.volume_files("shared")]
    assert "result.txt" in names
    model = job.outputs["model"].download(tmp_path / "model.bin")
    on_disk = next(daemon.data_dir.glob("jobs/*/workspace/model.bin")).read_bytes()
    assert model.read_bytes() == on_disk
    listed = {o["name"]: o for o in job.outputs.list()}
    assert listed["model"]["sha256"] == hashlib.sha256(on_disk).hexdigest()
    assert "dir" in listed
    # A symlink out of the workspace is never followed.
    assert listed["secret"]["collected"] is False
    with pytest.raises(errors.NotFound):
        job.outputs["secret"].download(tmp_path / "shadow")
    assert not (tmp_path / "shadow").exists()


def test_container_paths_are_validated(daemon: testing.Daemon) -> None:
    for kwargs, field in [
        ({"volumes": {"/proc/x": "v"}}, "volumes"),
        ({"volumes": {"/workspace": "v"}}, "volumes"),
        ({"checkpoint": "/a/../b"}, "checkpoint"),
        ({"outputs": {"m": "/etc/passwd"}}, "outputs"),
        ({"outputs": {"m": "/workspace/../x"}}, "outputs"),
        ({"network": "host"}, "network"),
    ]:
        with pytest.raises(errors.InvalidArgument) as info:
            nodus.Job.create(image=BUSYBOX, command=["true"], **kwargs)
        assert info.value.field == field, kwargs
    assert daemon.client().list_jobs() == []


def test_secret_is_masked_and_exec_runs_in_the_container(daemon: testing.Daemon,
                                                         cli: Any) -> None:
    value = "s3cr3t-" + os.urandom(6).hex()
    assert cli("secret", "set", "TOKEN", input=value).returncode == 0
    job = nodus.Job.run(image=BUSYBOX, secrets=["TOKEN"],
                        command=["sh", "-c", 'echo "token=$TOKEN"; touch /workspace/up; '
                                             "sleep 30"])
    testing.wait_until(lambda: job.status()["phase"] == Phase.RUNNING, "running")
    testing.wait_until(lambda: any(f["name"] == "up" for f in job.files.list()), "up")
    proc = job.exec("sh", "-c", 'id -u; pwd; echo "$TOKEN"; echo err >&2; exit 3')
    assert proc.returncode == 3
    assert proc.stdout.split() == [str(os.getuid()), "/workspace", "***"]
    assert proc.stderr == "err\n"
    job.cancel()
    with pytest.raises(errors.JobCancelled):
        job.wait(timeout=60)
    stored = next(daemon.data_dir.glob("jobs/*/attempt-1/output.log")).read_text()
    assert "token=***" in stored and value not in stored
    for args in (("job", "status", job.name, "--json"), ("job", "list", "-a", "--json"),
                 ("job", "logs", job.name)):
        out = cli(*args)
        assert out.returncode == 0 and value not in out.stdout, args
    events = b"".join(daemon.client().events(job=job.name, follow=False)).decode()
    assert job.name in events and value not in events


def test_an_exec_whose_container_ends_before_it_starts_is_a_conflict(
        docker_client: Any) -> None:
    """Found by tests/system/test_chaos.py: dockerd refuses to start an exec created in a container
    that ended since (a 500 "is not running", or a 404 once it dropped the exec), which
    was the daemon's Internal error."""
    container = docker_client.containers.run(BUSYBOX, ["sleep", "60"], detach=True)
    calls = 0

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        result = await asyncio.to_thread(fn, *args)
        if calls == 1:  # the exec is created: now the job's container ends under it
            container.kill()
            container.wait()
        return result

    try:
        with pytest.raises(errors.Conflict, match=r"has just ended|is not running"):
            asyncio.run(exec_in_container(call, docker_client, container.id, ["true"],
                                          f"{os.getuid()}:{os.getgid()}", None, [], 30))
    finally:
        container.remove(force=True)


def test_cli_runs_an_image_attached_with_its_exit_code(daemon: testing.Daemon,
                                                       cli: Any) -> None:
    done = cli("job", "run", "--image", BUSYBOX, "--", "sh", "-c", "echo from-cli; exit 4")
    assert done.returncode == 4 and "from-cli" in done.stdout
    listed = cli("job", "run", "--image", BUSYBOX, "--as-args", "-d", "--", "echo", "x")
    assert listed.returncode == 0
    bad = cli("job", "run", "--network", "none", "--", "true")
    assert bad.returncode == 2 and "--network needs --image" in bad.stderr


def test_daemon_killed_under_a_container_adopts_it_and_collects_outputs(
        daemon: testing.Daemon, docker_client: Any, tmp_path: Path) -> None:
    job = nodus.Job.run(image=BUSYBOX, outputs={"result": "/workspace/result.txt"},
                        command=["sh", "-c", "echo started; "
                                 "while [ ! -e /workspace/go ]; do sleep 0.1; done; "
                                 "echo done > /workspace/result.txt; echo finished; exit 5"])
    testing.wait_until(lambda: job.status()["phase"] == Phase.RUNNING, "running")
    daemon.kill()
    workspace = next(daemon.data_dir.glob("jobs/*/workspace"))
    (workspace / "go").touch()
    daemon.start()
    with pytest.raises(errors.JobFailed) as info:
        job.wait(timeout=60)
    assert info.value.exit_code == 5
    status = job.status()
    assert status["attempts"] == 1 and status["reason"] == Reason.ERROR
    text = log_of(job)
    assert text.count("started") == 1 and "finished" in text  # one run, whole log
    out = job.outputs["result"].download(tmp_path / "result.txt")
    assert out.read_text() == "done\n"
    removed(docker_client, daemon)


def test_container_that_ends_while_the_daemon_is_down_keeps_its_exit_code(
        daemon: testing.Daemon, docker_client: Any) -> None:
    job = nodus.Job.run(image=BUSYBOX, command=["sh", "-c", "sleep 1; echo bye; exit 9"])
    testing.wait_until(lambda: job.status()["phase"] == Phase.RUNNING, "running")
    daemon.kill()
    testing.wait_until(lambda: all(c.status == "exited" for c in ours(docker_client, daemon)),
                       "the container to exit")
    daemon.start()
    with pytest.raises(errors.JobFailed) as info:
        job.wait(timeout=60)
    assert info.value.exit_code == 9 and job.status()["attempts"] == 1
    assert "bye" in log_of(job)


def restart_dockerd() -> None:
    """Stop dockerd with SIGTERM (as systemd would) and start it again."""
    pid = int(Path("/var/run/docker.pid").read_text())
    os.kill(pid, 15)
    testing.wait_until(lambda: testing.process_gone(pid), "dockerd to stop", timeout=60)
    log = open("/var/log/noduslocal-test-dockerd.log", "ab")  # noqa: SIM115
    subprocess.Popen([shutil.which("dockerd") or "/usr/sbin/dockerd"], stdout=log,
                     stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    testing.wait_until(lambda: subprocess.run(["docker", "info"], capture_output=True)
                       .returncode == 0, "dockerd to answer", timeout=60)


@pytest.mark.skipif(os.getuid() != 0, reason="restarting dockerd needs root")
def test_dockerd_restart_is_a_lost_attempt_retried_with_its_checkpoint(
        daemon: testing.Daemon) -> None:
    if not Path("/var/run/docker.pid").exists():
        pytest.fail("dockerd's pid file is missing: cannot restart it")
    client = daemon.client()
    created = client.create_job({
        "image": BUSYBOX, "retries": 1, "checkpoint": "/ckpt",
        "command": ["sh", "-c", 'echo "attempt $NODUS_ATTEMPT saw: $(cat /ckpt/step 2>&1)"; '
                    'if [ "$NODUS_ATTEMPT" = 1 ]; then echo one > /ckpt/step; '
                    "touch /workspace/ready; sleep 300; fi"]})
    name = created["name"]
    testing.wait_until(lambda: any(daemon.data_dir.glob("jobs/*/workspace/ready")), "ready")
    restart_dockerd()
    final = client.wait_job(name, None, timeout=120)
    assert final["phase"] == Phase.SUCCEEDED, (final["message"], client.attempts(name))
    attempts = client.attempts(name)
    phases = [a["phase"] for a in attempts]
    # A launch that meets dockerd still going down is queued again without a retry spent.
    assert phases[0] == "Lost" and phases[-1] == "Exited", phases
    assert set(phases[1:-1]) <= {"NotStarted"}, phases
    assert "dockerd" in (attempts[0]["message"] or "")
    log = b"".join(client.logs(name, None)).decode()
    assert re.search(r"attempt [2-9] saw: one", log), log


def test_dockerd_unreachable_holds_container_jobs_not_host_jobs() -> None:
    with testing.daemon(config='docker_host = "unix:///tmp/nl-no-dockerd.sock"\n') as d:
        client = d.client()
        waiting = client.create_job({"image": BUSYBOX, "command": ["true"]})
        host = client.create_job({"command": ["true"]})
        assert client.wait_job(host["name"], None, timeout=30)["phase"] == Phase.SUCCEEDED
        status = client.get_job(waiting["name"])
        assert status["phase"] == Phase.PENDING
        assert "dockerd unreachable" in (status["hold"] or "")
        out = run_cli(d, "job", "status", waiting["name"])
        assert "dockerd unreachable" in out.stdout


def test_map_from_a_container_job_runs_in_its_image_from_its_workspace(
        daemon: testing.Daemon) -> None:
    client = daemon.client()
    client.create_job({"name": "prep", "image": BUSYBOX, "command": [
        "sh", "-c", "echo ready > /workspace/state"]})
    assert client.wait_job("prep", timeout=60)["phase"] == "Succeeded"
    done = run_cli(daemon, "map", "--from", "prep", "--name", "boxed", "--", "sh", "-c",
                   'echo "$0 $(cat /workspace/state)"', ":::", "a", "b")
    assert done.returncode == 0, done.stderr
    assert client.wait_sweep("boxed", timeout=90)["phase"] == "Succeeded"
    for index, value in enumerate("ab"):
        job = client.get_job(f"boxed-{index}")
        assert job["spec"]["image"] == BUSYBOX
        assert run_cli(daemon, "job", "logs", f"boxed-{index}").stdout == f"{value} ready\n"


def test_container_starts_never_wait_behind_execs(docker_client: object) -> None:
    """One user's 32 `sleep 120` execs in their own container made another user's
    container job take 116 s to start: execs and launches shared one 32-thread pool."""
    import threading
    import uuid

    from tests.conftest import BUSYBOX

    d = testing.Daemon(cpus=2, memory="4GiB", config="user_max_execs = 32\n")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "box", "image": BUSYBOX, "cpu": "100m",
                           "command": ["sleep", "300"]})
        testing.wait_until(lambda: client.get_job("box")["phase"] == "Running", "box runs",
                           timeout=60)
        mark = uuid.uuid4().hex
        holding = [threading.Thread(target=client.exec_job, args=("box", None, [
            "sh", "-c", f"touch /workspace/held-{mark}-$$; "
                        f"while [ ! -e /workspace/gate-{mark} ]; do sleep 0.2; done"]))
            for _ in range(32)]
        for thread in holding:
            thread.start()
        workspace = next((d.data_dir / "jobs").glob("*/workspace"))
        try:
            testing.wait_until(lambda: len(list(workspace.glob(f"held-{mark}-*"))) == 32,
                               "32 execs running", timeout=120)
            client.create_job({"name": "next", "image": BUSYBOX, "cpu": "100m",
                               "command": ["echo", "started"]})
            assert client.wait_job("next", timeout=60)["phase"] == "Succeeded"
            assert all(thread.is_alive() for thread in holding)  # held all along
        finally:
            (workspace / f"gate-{mark}").touch()
            for thread in holding:
                thread.join(60)
        client.cancel_job("box")
    finally:
        d.close()
