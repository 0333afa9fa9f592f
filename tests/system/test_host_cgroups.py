"""Host jobs' limits are limits (issue 25, part 4), with the box's real cgroups and each
shim: memory is enforced (Failed/OOMKilled with a container's message), a fork bomb stops at
host_pids_max, cpu is a CFS quota, and every process of a job, even a `setsid` one, is gone
after its end, its timeout and `job kill`, its cgroup removed with it. Needs root."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.daemon.config.settings import SYSTEM_DATA_DIR
from noduslocal.daemon.runtime.host.cgroups import Cgroups, parent_name
from noduslocal.domain.states import Reason
from noduslocal.testing import wait_until
from tests.conftest import run_cli

DEADLINE = 60
PIDS_MAX = 48

# beside: its own daemon and cgroup parent, no docker (scripts/test.sh's third process).
pytestmark = [pytest.mark.beside,
              pytest.mark.skipif(os.geteuid() != 0 and not os.environ.get("CI"),
                                 reason="cgroups need root")]


@pytest.fixture(params=["python", "compiled"])
def daemon(request: pytest.FixtureRequest) -> Iterator[testing.Daemon]:
    """A daemon of the test's own with each shim, and a small host_pids_max."""
    shim = "python" if request.param == "python" else "auto"
    config = f'host_shim = "{shim}"\nhost_pids_max = {PIDS_MAX}\n'
    with testing.daemon(cpus=2, memory="8GiB", config=config) as d:
        yield d


def cgroups_of(d: testing.Daemon) -> Cgroups:
    found = Cgroups.detect(parent_name(d.data_dir, SYSTEM_DATA_DIR))
    if not found.enabled:
        pytest.fail(f"this box's cgroups are not usable: {found.why}")
    return found


def job_cgroups(d: testing.Daemon) -> list[Path]:
    """The rank cgroups under the daemon's parent (each test runs one job at a time)."""
    return [p for parent in cgroups_of(d).parents for p in parent.glob("job-*")]


def marked(marker: str) -> list[int]:
    """The pids of processes whose argv has `marker`."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if marker.encode() in argv:
                found.append(int(entry.name))
    return found


def log_of(d: testing.Daemon, name: str) -> str:
    return b"".join(d.client().logs(name)).decode(errors="replace")


def test_memory_over_its_limit_is_oomkilled_as_in_a_container(
        daemon: testing.Daemon) -> None:
    done = run_cli(daemon, "job", "run", "--name", "hog", "--memory", "64MiB", "--",
                   sys.executable, "-c", "bytearray(400 << 20)", timeout=DEADLINE)
    assert done.returncode != 0, done
    job = daemon.client().wait_job("hog", timeout=DEADLINE)
    assert (job["phase"], job["reason"]) == ("Failed", Reason.OOM_KILLED), job
    # The message a container's OOM kill gets (tests/system/test_containers.py).
    assert job["message"] == "killed by the kernel: out of memory (limit 64 MiB)", job
    # Under the limit the same job runs to its end: only the one over it was touched.
    fine = run_cli(daemon, "job", "run", "--name", "fits", "--memory", "256MiB", "--",
                   sys.executable, "-c", "bytearray(100 << 20)", timeout=DEADLINE)
    assert fine.returncode == 0, fine
    assert daemon.client().get_job("fits")["phase"] == "Succeeded"


FORK_BOMB = f"""
import os, sys, time
# Never a fork bomb without its limit: its cgroup's pids.max must be {PIDS_MAX} first.
limits = []
for line in open("/proc/self/cgroup"):
    _, controllers, path = line.strip().split(":", 2)
    for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
        if ("pids" in controllers.split(",") or controllers == "") and os.path.exists(
                root + path + "/pids.max"):
            limits.append(open(root + path + "/pids.max").read().strip())
if "{PIDS_MAX}" not in limits:
    print("no pids limit:", limits)
    sys.exit(3)
made = 0
for _ in range(300):  # bounded: past the limit fork fails
    try:
        pid = os.fork()
    except BlockingIOError:
        continue
    if pid == 0:
        try:
            os.execvp("sleep", ["sleep", "3004"])
        finally:
            os._exit(127)  # a child never forks on
    made += 1
print("forked", made, flush=True)
"""


def test_a_fork_bomb_stops_at_host_pids_max(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "bomb", "command": [sys.executable, "-c", FORK_BOMB]})
    job = c.wait_job("bomb", timeout=DEADLINE)
    out = log_of(daemon, "bomb")
    assert job["phase"] == "Succeeded", (job, out)
    made = int(out.split("forked")[1].split()[0])
    assert 0 < made < PIDS_MAX, out
    wait_until(lambda: not marked("3004"), "the bomb's sleeps to be killed", timeout=10)


SETSID = "setsid sh -c 'sleep {marker}' & sleep 0.3; echo started; {rest}"


@pytest.mark.parametrize("end", ["exit", "timeout", "kill"])
def test_a_setsid_child_dies_with_its_job(daemon: testing.Daemon, end: str) -> None:
    c = daemon.client()
    marker = {"exit": "3001", "timeout": "3002", "kill": "3003"}[end]
    rest = "exit 0" if end == "exit" else "sleep 100"
    spec: dict[str, object] = {"name": end, "command": [
        "/bin/sh", "-c", SETSID.format(marker=marker, rest=rest)]}
    if end == "timeout":
        spec["timeout"] = 2
    c.create_job(spec)
    if end == "kill":
        wait_until(lambda: "started" in log_of(daemon, end), "the setsid child to start",
                   timeout=DEADLINE)
        assert marked(marker)
        c.cancel_job(end)
    job = c.wait_job(end, timeout=DEADLINE)
    want = {"exit": "Succeeded", "timeout": "Failed", "kill": "Cancelled"}[end]
    assert job["phase"] == want, job
    assert "started" in log_of(daemon, end)
    wait_until(lambda: not marked(marker), "the setsid child to be killed", timeout=10)
    # Its cgroup went with it (removed once the end was committed).
    wait_until(lambda: not job_cgroups(daemon), "the job's cgroup to be removed", timeout=10)


def test_cpu_becomes_a_cfs_quota(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "quota", "cpu": 0.5, "command": ["sleep", "60"]})
    wait_until(lambda: c.get_job("quota")["phase"] == "Running", "the job to run",
               timeout=DEADLINE)
    cgroups = cgroups_of(daemon)
    paths = wait_until(lambda: job_cgroups(daemon), "the job's cgroup", timeout=10)
    # The job's child enters its cgroups before it execs, a moment after the launch.
    wait_until(lambda: cgroups.procs(paths[0].name), "the job in its cgroup", timeout=10)
    if cgroups.version == 2:
        assert (paths[0] / "cpu.max").read_text().split() == ["50000", "100000"]
    else:
        cpu = next(p for p in paths if p.parent.parent.name.startswith("cpu"))
        assert (cpu / "cpu.cfs_quota_us").read_text().strip() == "50000"
        assert (cpu / "cpu.cfs_period_us").read_text().strip() == "100000"
        pids = next(p for p in paths if p.parent.parent.name == "pids")
        assert (pids / "pids.max").read_text().strip() == str(PIDS_MAX)
    c.cancel_job("quota")
    assert c.wait_job("quota", timeout=DEADLINE)["phase"] == "Cancelled"


def test_doctor_names_the_cgroups(daemon: testing.Daemon) -> None:
    result = run_cli(daemon, "doctor", "--json")
    line = {c["name"]: c for c in json.loads(result.stdout)}["host job limits"]
    assert line["ok"] is True and "cgroup v" in line["detail"], line


def test_a_lost_attempts_setsid_child_dies_before_its_retry(daemon: testing.Daemon) -> None:
    c = daemon.client()
    c.create_job({"name": "lost", "retries": 1, "command": [
        "/bin/sh", "-c", SETSID.format(marker="3005", rest="sleep 100")]})
    wait_until(lambda: "started" in log_of(daemon, "lost"), "the setsid child to start",
               timeout=DEADLINE)
    first = wait_until(lambda: marked("3005"), "the setsid child", timeout=10)
    pid = json.loads(next(daemon.data_dir.glob("jobs/*/attempt-1/pid.json")).read_text())
    os.kill(pid["shim_pid"], 9)  # the shim gone: the attempt is lost, and retried
    wait_until(lambda: [a["phase"] for a in c.attempts("lost")] == ["Lost", "Running"],
               "the retry to run", timeout=DEADLINE)
    # Neither its process group nor its session held the setsid child: its cgroup did.
    wait_until(lambda: not set(first) & set(marked("3005")), "attempt 1's setsid child to die",
               timeout=10)
    c.cancel_job("lost")
    assert c.wait_job("lost", timeout=DEADLINE)["phase"] == "Cancelled"


def test_an_exec_runs_in_its_rank_s_cgroups(daemon: testing.Daemon) -> None:
    """Issue 28: what `job exec` (and `-it`) runs counts against the job's limits and dies
    with it: it enters the rank's cgroups before anything of the job's runs."""
    c = daemon.client()
    c.create_job({"name": "beside-cg", "cpu": 0.5, "command": ["sleep", "60"]})
    wait_until(lambda: c.get_job("beside-cg")["phase"] == "Running", "the job to run",
               timeout=DEADLINE)
    paths = wait_until(lambda: job_cgroups(daemon), "the job's cgroup", timeout=10)
    done = c.exec_job("beside-cg", None, ["cat", "/proc/self/cgroup"])
    assert done["returncode"] == 0, done
    assert paths[0].name in done["stdout"], (paths[0].name, done["stdout"])
    c.cancel_job("beside-cg")
    assert c.wait_job("beside-cg", timeout=DEADLINE)["phase"] == "Cancelled"


def test_a_rank_an_exec_entered_is_not_pooled_for_the_next(daemon: testing.Daemon) -> None:
    """v1's cpu and pids cgroups of an ended rank are renamed into a pool for the next
    rank, but not those of a rank an exec was sent into: the exec enters by path while the
    rank may be ending, and one that entered right after the release's emptiness check
    would have run on in the next rank's cgroups, another user's perhaps."""
    found = cgroups_of(daemon)
    if found.version != 1:
        pytest.skip("only v1's cpu and pids cgroups are pooled")
    c = daemon.client()

    def idle() -> int:
        return sum(1 for parent in found.parents for _ in parent.glob("idle-*"))

    c.create_job({"name": "pooled", "cpu": 0.5, "command": ["true"]})
    assert c.wait_job("pooled", timeout=DEADLINE)["phase"] == "Succeeded"
    wait_until(lambda: not job_cgroups(daemon), "the ended rank's release", timeout=10)
    pooled = idle()
    assert pooled >= 2, "an ended rank's cpu and pids cgroups are kept"
    c.create_job({"name": "entered", "cpu": 0.5, "command": ["sleep", "60"]})
    wait_until(lambda: c.get_job("entered")["phase"] == "Running", "the job to run",
               timeout=DEADLINE)
    assert idle() == pooled - 2  # it took them
    assert c.exec_job("entered", None, ["true"])["returncode"] == 0
    c.cancel_job("entered")
    assert c.wait_job("entered", timeout=DEADLINE)["phase"] == "Cancelled"
    wait_until(lambda: not job_cgroups(daemon), "the ended rank's release", timeout=10)
    assert idle() == pooled - 2  # before: pooled again, as if no exec had entered
