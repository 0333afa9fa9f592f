"""GPUs through a real daemon and the real pynvml, served by the stand-in
libnvidia-ml.so.1 (tests/nvml_standin) that the daemon loads through its `nvml_library`
setting: inventory, pinning of the best-connected set, foreign processes, a GPU that
falls off the bus, Xids, drains, refusals that say what the box has, no driver at all, cost,
preemption and estimates on simulated GPUs. GPUs and containers:
tests/system/test_container_gpus.py."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.states import Phase, Reason
from tests.conftest import run_cli
from tests.nvml_standin.build import build_or_skip, sample_state, write_state


class Box:
    def __init__(self, daemon: testing.Daemon, state_path: Path, state: dict[str, Any]):
        self.daemon = daemon
        self.state_path = state_path
        self.state = state

    def write(self) -> None:
        write_state(self.state_path, self.state)

    def uuid(self, index: int) -> str:
        return str(self.state["gpus"][index]["uuid"])


@pytest.fixture(scope="session")
def nvml_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_or_skip(tmp_path_factory.mktemp("nvml"))


@pytest.fixture
def box(nvml_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Box]:
    state_path = tmp_path / "nvml.json"
    state = sample_state(4)
    write_state(state_path, state)
    monkeypatch.setenv("NODUS_FAKE_NVML", str(state_path))  # the daemon inherits it
    d = testing.Daemon(cpus=4, memory="8GiB",
                       config=f'nvml_library = "{nvml_lib}"\ngpu_poll = 0.2\n')
    try:
        d.start()
        with d.as_default():
            yield Box(d, state_path, state)
    finally:
        d.close()


def log_lines(job: nodus.Job) -> list[str]:
    return list(job.iter_logs())


def test_inventory_comes_from_nvml(box: Box) -> None:
    out = run_cli(box.daemon, "gpus", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["source"] == "nvml" and doc["simulated"] is False
    assert [g["uuid"] for g in doc["gpus"]] == [box.uuid(i) for i in range(4)]
    assert {g["model"] for g in doc["gpus"]} == {"H100"}
    assert doc["gpus"][0]["memory_total"] == box.state["gpus"][0]["memory_total"]
    assert doc["links"][0][1] == "NVLink" and doc["links"][0][2] != "NVLink"
    table = run_cli(box.daemon, "gpus").stdout
    assert "H100" in table and "free" in table


def test_a_job_gets_the_nvlinked_pair_and_only_it(box: Box) -> None:
    job = nodus.Job.run(command=["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER"'],
                        gpu="H100:2")
    job.wait(timeout=30)
    assert log_lines(job) == [f"{box.uuid(0)},{box.uuid(1)}|PCI_BUS_ID"]
    plain = nodus.Job.run(command=["sh", "-c", 'echo "[$CUDA_VISIBLE_DEVICES]"'])
    plain.wait(timeout=30)
    assert log_lines(plain) == ["[]"]  # no GPUs asked for, none visible
    assert job.attempts()[0]["gpus"] == [box.uuid(0), box.uuid(1)]


def test_a_foreign_process_keeps_new_work_off_its_gpu(box: Box) -> None:
    box.state["gpus"][0]["processes"] = [{"pid": os.getpid(), "used_memory": 21 * 2**30}]
    box.state["gpus"][0]["memory_used"] = 21 * 2**30
    box.write()
    testing.wait_until(lambda: "busy" in run_cli(box.daemon, "gpus").stdout, "busy GPU 0")
    out = run_cli(box.daemon, "gpus").stdout
    assert f"{os.getpid()} (root" in out
    job = nodus.Job.run(command=["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"; sleep 0.5'],
                        gpu=4)
    testing.wait_until(lambda: "GPU 0 busy: pid" in (job.status()["hold"] or ""), "the hold")
    assert job.status()["phase"] == Phase.PENDING
    single = nodus.Job.run(command=["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'], gpu=1)
    assert single.status()["phase"] == Phase.PENDING  # FIFO: behind the 4-GPU head
    box.state["gpus"][0]["processes"] = []
    box.state["gpus"][0]["memory_used"] = 0
    box.write()
    job.wait(timeout=30)
    assert log_lines(job) == [",".join(box.uuid(i) for i in range(4))]
    single.wait(timeout=30)


def test_a_gpu_that_falls_off_the_bus_is_unhealthy(box: Box) -> None:
    box.state["gpus"][3]["missing"] = True
    box.write()
    testing.wait_until(lambda: "unhealthy" in run_cli(box.daemon, "gpus").stdout,
                       "unhealthy")
    job = nodus.Job.run(command=["true"], gpu=4)
    testing.wait_until(lambda: "unhealthy" in (job.status()["hold"] or ""), "the hold")
    box.state["gpus"][3]["missing"] = False
    box.write()
    assert job.wait(timeout=30).phase == Phase.SUCCEEDED


def test_impossible_requests_are_refused_at_create(box: Box) -> None:
    out = run_cli(box.daemon, "job", "run", "--gpus", "8", "--", "true")
    assert out.returncode == 2
    assert "8 x GPU requested; this host has 4 x H100" in out.stderr
    out = run_cli(box.daemon, "job", "run", "--sku", "gpu_1x_a100", "--", "true")
    assert out.returncode == 2 and "1 x A100" in out.stderr
    with pytest.raises(errors.InvalidArgument):
        nodus.Job.create(command=["true"], gpu={"count": 1, "min_memory": "100GiB"})
    assert box.daemon.client().list_jobs(phases=None) == []


def test_no_driver_means_zero_gpus_said_plainly(tmp_path: Path) -> None:
    with testing.daemon(config=f'nvml_library = "{tmp_path}/missing.so.1"\n') as d:
        doc = d.client().gpus()
        assert doc["gpus"] == [] and "NVML unavailable" in doc["note"]
        assert "no GPUs" in run_cli(d, "gpus").stdout
        with pytest.raises(errors.InvalidArgument) as info:
            nodus.Job.create(command=["true"], gpu=1)
        assert "this host has no GPUs" in str(info.value)


def test_xid_79_under_a_running_job_moves_it_to_another_gpu(box: Box) -> None:
    client = box.daemon.client()
    created = client.create_job({
        "gpu": 1, "retries": 1,
        "command": ["sh", "-c", 'echo "$NODUS_ATTEMPT $CUDA_VISIBLE_DEVICES"; sleep 30']})
    name = created["name"]
    testing.wait_until(lambda: client.get_job(name)["phase"] == Phase.RUNNING, "running")
    first = client.attempts(name)[0]["gpus"]
    assert first == [box.uuid(0)]
    box.state["events"] = [{"gpu": 0, "type": "xid", "data": 79, "seq": 1}]
    box.write()
    testing.wait_until(lambda: len(client.attempts(name)) == 2
                       and client.attempts(name)[1]["gpus"], "the second attempt")
    attempts = client.attempts(name)
    assert attempts[0]["phase"] == "Lost" and "Xid 79" in attempts[0]["message"]
    assert attempts[1]["gpus"] and attempts[1]["gpus"] != first
    gpus = client.gpus()["gpus"]
    assert gpus[0]["healthy"] is False and "Xid 79" in gpus[0]["problem"]
    client.cancel_job(name)


def test_an_application_xid_changes_nothing(box: Box) -> None:
    box.state["events"] = [{"gpu": 1, "type": "xid", "data": 13, "seq": 1}]
    box.write()
    job = nodus.Job.run(command=["true"], gpu=4)
    assert job.wait(timeout=30).phase == Phase.SUCCEEDED
    assert all(g["healthy"] for g in box.daemon.client().gpus()["gpus"])


def test_drain_lets_work_finish_and_keeps_new_work_off(box: Box) -> None:
    client = box.daemon.client()
    running = nodus.Job.run(command=["sh", "-c", "sleep 1.5"], gpu=1)
    testing.wait_until(lambda: running.status()["phase"] == Phase.RUNNING, "running")
    assert running.attempts()[0]["gpus"] == [box.uuid(0)]
    out = run_cli(box.daemon, "gpus", "drain", "0")
    assert out.returncode == 0 and "drained" in out.stdout
    others = [nodus.Job.run(command=["sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES"'], gpu=1)
              for _ in range(3)]
    for job in others:
        job.wait(timeout=30)
        assert box.uuid(0) not in log_lines(job)[0]
    assert running.wait(timeout=30).phase == Phase.SUCCEEDED  # it finished there
    box.daemon.restart()  # a drain survives a restart
    assert "drained" in run_cli(box.daemon, "gpus").stdout
    whole = nodus.Job.run(command=["true"], gpu=4)
    testing.wait_until(lambda: "drained" in (whole.status()["hold"] or ""), "the hold")
    assert run_cli(box.daemon, "gpus", "undrain", "0").returncode == 0
    assert whole.wait(timeout=30).phase == Phase.SUCCEEDED
    assert client.gpus()["gpus"][0]["drained"] is False


def test_queue_lists_pending_jobs_in_order_with_holds_and_the_heads_eta() -> None:
    with testing.daemon(config='simulate_gpus = "2xH100"\n') as d:
        client = d.client()
        running = client.create_job({"command": ["sleep", "30"], "gpu": 2,
                                     "expected_duration": "10m"})
        testing.wait_until(lambda: client.get_job(running["name"])["phase"] == Phase.RUNNING,
                           "running")
        big = client.create_job({"command": ["true"], "gpu": 2})
        small = client.create_job({"command": ["true"], "gpu": 1, "priority": 0})
        testing.wait_until(lambda: client.queue()["pending"][0]["eta"], "an eta")
        doc = client.queue()
        assert [e["name"] for e in doc["pending"]] == [big["name"], small["name"]]
        head = doc["pending"][0]
        assert "needs 2 x GPU, 0 free" in head["hold"] and "~10 min" in head["hold"]
        out = run_cli(d, "queue")
        assert out.returncode == 0 and big["name"] in out.stdout and "2 x GPU" in out.stdout
        assert json.loads(run_cli(d, "queue", "--json").stdout)["kind"] == "Queue"
        client.cancel_job(running["name"])


def test_max_cost_stops_a_job_and_cost_shows_in_status() -> None:
    config = ('simulate_gpus = "2xH100"\ngpu_poll = 0.2\n'
              'gpu_hour_rates = { H100 = 3600.0 }\n')  # 1 per GPU-second
    with testing.daemon(config=config) as d:
        job = nodus.Job.run(command=["sleep", "60"], gpu=2, max_cost=3)
        with pytest.raises(errors.JobFailed):
            job.wait(timeout=30)
        status = job.status()
        assert status["reason"] == Reason.MAX_COST_EXCEEDED
        assert 3 < status["cost"] < 8 and "max_cost of 3" in status["message"]
        out = run_cli(d, "job", "status", job.name)
        assert "cost:" in out.stdout and "(max 3)" in out.stdout


def test_energy_from_nvml_is_charged_at_the_configured_price(
        nvml_lib: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state_path = tmp_path / "nvml.json"
    state = sample_state(1)
    write_state(state_path, state)
    monkeypatch.setenv("NODUS_FAKE_NVML", str(state_path))
    config = (f'nvml_library = "{nvml_lib}"\ngpu_poll = 0.1\n'
              "energy_price_per_kwh = 0.5\n")
    with testing.daemon(config=config) as d:
        job = nodus.Job.run(command=["sleep", "2"], gpu=1)
        testing.wait_until(lambda: job.status()["phase"] == Phase.RUNNING, "running")
        state["gpus"][0]["energy_mj"] = 2 * 3_600_000_000  # 2 kWh since the start
        write_state(state_path, state)
        testing.wait_until(lambda: job.status()["cost"] >= 0.99, "the energy to count")
        job.wait(timeout=30)
        assert job.status()["cost"] == pytest.approx(1.0)
        assert d.client().attempts(job.name)[0]["cost"] == pytest.approx(1.0)


def test_preemption_requeues_an_interruptible_job_with_its_checkpoint() -> None:
    with testing.daemon(config='simulate_gpus = "2xH100"\nkill_grace = 2\n') as d:
        client = d.client()
        spot = client.create_job({
            "gpu": 2, "interruptible": True, "checkpoint": "ckpt", "command": [
                "sh", "-c", 'echo "attempt $NODUS_ATTEMPT saw [$(cat ckpt/n 2>/dev/null)]"; '
                'echo "$NODUS_ATTEMPT" > ckpt/n; '
                'if [ "$NODUS_ATTEMPT" = 1 ]; then trap "exit 143" TERM; sleep 60 & wait; fi'
            ]})["name"]
        testing.wait_until(lambda: client.get_job(spot)["phase"] == Phase.RUNNING, "running")
        time.sleep(0.3)
        urgent = client.create_job({"gpu": 1, "command": ["sleep", "0.5"]})["name"]
        assert client.wait_job(urgent, None, timeout=30)["phase"] == Phase.SUCCEEDED
        final = client.wait_job(spot, None, timeout=30)
        assert final["phase"] == Phase.SUCCEEDED and final["retries_used"] == 0
        attempts = client.attempts(spot)
        assert attempts[0]["reason"] == Reason.PREEMPTED
        first = b"".join(client.logs(spot, attempt=1)).decode()
        assert "attempt 1 saw []" in first
        assert "saw [1]" in b"".join(client.logs(spot)).decode()


def test_suspend_and_resume_keep_the_workspace(daemon: testing.Daemon) -> None:
    job = nodus.Job.run(command=["sh", "-c", 'echo "run $NODUS_ATTEMPT" >> runs.txt; '
                                             'cat runs.txt; sleep 30'])
    testing.wait_until(lambda: job.status()["phase"] == Phase.RUNNING, "running")
    time.sleep(0.2)
    job.suspend()
    # Issue 28: suspend() returns once it has landed, not while the job still runs.
    assert job.status()["phase"] == Phase.SUSPENDED
    assert job.status()["reason"] == Reason.SUSPENDED
    out = run_cli(daemon, "job", "resume", job.name)
    assert out.returncode == 0, out.stderr
    testing.wait_until(lambda: job.status()["phase"] == Phase.RUNNING, "running again")
    shown = run_cli(daemon, "job", "status", job.name).stdout
    # The stopped attempt's exit is not shown as the running job's own.
    assert not any(line.startswith(("exit code:", "signal:")) for line in shown.splitlines()), \
        shown
    testing.wait_until(lambda: job.files.read("runs.txt") == b"run 1\nrun 2\n", "run 2")
    assert job.status()["retries_used"] == 0
    assert run_cli(daemon, "job", "suspend", job.name).returncode == 0
    testing.wait_until(lambda: job.status()["phase"] == Phase.SUSPENDED, "suspended")
    job.cancel()  # a suspended job can still be cancelled
    assert job.status()["phase"] == Phase.CANCELLED
    with pytest.raises(errors.Conflict):
        job.resume()


def test_estimate_simulates_the_queue_and_prices_the_run() -> None:
    config = 'simulate_gpus = "2xH100"\ngpu_hour_rates = { H100 = 2.0 }\n'
    with testing.daemon(config=config):
        running = nodus.Job.run(command=["sleep", "30"], gpu=2, expected_duration="10m")
        testing.wait_until(lambda: running.status()["phase"] == Phase.RUNNING, "running")
        waiting = nodus.Job.run(command=["sleep", "1"], gpu=1, expected_duration="30m")
        est = waiting.estimate()
        assert 550 < est["start_in_s"] <= 600 and est["hold"]
        assert est["cost_p50"] == pytest.approx(1 * 0.5 * 2.0)  # 1 GPU x 0.5 h x 2.0
        unknown = nodus.Job.run(command=["echo", "x"], gpu=2)
        assert unknown.estimate()["start_in_s"] is not None  # behind known ends only
        running.cancel()
        waiting.wait(timeout=30)
        unknown.wait(timeout=30)
        again = nodus.Job.run(command=["echo", "x"], gpu=2)
        again.wait(timeout=30)
        est = again.estimate()
        assert est["cost_basis"].startswith("2 earlier runs")
        assert est["start_at"] is None and est["start_basis"] == "it is Succeeded"
        blocked = nodus.Job.run(command=["sleep", "30"], gpu=2)  # no expected duration
        testing.wait_until(lambda: blocked.status()["phase"] == Phase.RUNNING, "running")
        behind = nodus.Job.run(command=["true"], gpu=1)
        est = behind.estimate()
        assert est["start_at"] is None and "without an expected duration" in est["start_basis"]
        blocked.cancel()


def test_a_gpu_lost_under_a_running_job_moves_it_and_the_hold_names_who_frees_gpus(
        box: Box) -> None:
    client = box.daemon.client()
    name = client.create_job({"gpu": 1, "retries": 1, "command": ["sleep", "30"]})["name"]
    testing.wait_until(lambda: client.get_job(name)["phase"] == Phase.RUNNING, "running")
    box.state["gpus"][0]["missing"] = True
    box.write()
    testing.wait_until(lambda: len(client.attempts(name)) == 2
                       and client.attempts(name)[1]["gpus"], "the second attempt")
    first, second = client.attempts(name)
    assert first["phase"] == "Lost" and "fell off the bus" in first["message"]
    assert second["gpus"] != [box.uuid(0)]
    client.cancel_job(name)
    holder = nodus.Job.run(command=["sleep", "30"], gpu=3, expected_duration="5m")
    testing.wait_until(lambda: holder.status()["phase"] == Phase.RUNNING, "running")
    big = nodus.Job.run(command=["true"], gpu=2)
    box.state["gpus"][0]["missing"] = False
    box.write()
    testing.wait_until(lambda: f"job {holder.name} frees what it needs in ~5 min"
                       in (big.status()["hold"] or ""), "the hold naming the holder")
    holder.cancel()
    assert big.wait(timeout=30).phase == Phase.SUCCEEDED




def test_too_many_gpus_are_refused_with_what_the_box_has() -> None:
    with testing.daemon(config='simulate_gpus = "4xH100"\n') as d:
        for count in ("7", "99"):
            out = run_cli(d, "job", "run", "--gpus", count, "--", "true")
            assert out.returncode == 2, out
            assert f"gpu: {count} x GPU requested; this host has 4 x H100" in out.stderr, \
                out.stderr
