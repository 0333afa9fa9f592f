"""GPUs and containers through a real daemon and real docker, on a box without the NVIDIA
container runtime: a container asking for a real GPU fails cleanly, simulated GPUs reach a
container as its environment only, and `doctor` says what to install. GPUs of host jobs are
in tests/daemon/test_gpus.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.domain.states import Reason
from tests.conftest import BUSYBOX, run_cli
from tests.daemon.test_gpus import Box, box, log_lines, nvml_lib  # noqa: F401


@pytest.mark.usefixtures("docker_client")
def test_container_gpu_without_the_nvidia_runtime_fails_cleanly(
        box: Box, docker_client: Any) -> None:  # noqa: F811
    from noduslocal.daemon.runtime.docker.spec import instance_id, job_filter

    job = nodus.Job.run(image=BUSYBOX, command=["true"], gpu=1)
    with pytest.raises(errors.JobFailed):
        job.wait(timeout=60)
    status = job.status()
    assert status["reason"] == Reason.START_FAILED
    assert "could not select device driver" in status["message"]
    assert docker_client.containers.list(
        all=True, sparse=True, filters=job_filter(instance_id(box.daemon.data_dir))) == []


def test_simulated_gpus_reach_a_container_as_environment(docker_client: Any) -> None:
    with testing.daemon(config='simulate_gpus = "2xL4"\n'):
        job = nodus.Job.run(image=BUSYBOX, gpu="L4", command=[
            "sh", "-c", 'echo "$CUDA_VISIBLE_DEVICES|$NODUS_GPUS"'])
        job.wait(timeout=60)
        line = log_lines(job)[0]
        assert line.startswith("GPU-") and '"model": "L4"' in line


def test_doctor_sees_nvml_and_a_missing_nvidia_runtime(box: Box, docker_client: Any,  # noqa: F811
                                                       lab_groups: None) -> None:
    """Real GPUs (through pynvml) and a dockerd without the NVIDIA runtime: GPU containers
    would fail, and doctor says what to install."""
    del docker_client
    result = run_cli(box.daemon, "doctor", "--json")
    found = {c["name"]: c for c in json.loads(result.stdout)}
    assert found["gpus"]["ok"] is True
    assert found["gpus"]["detail"].startswith("NVML, driver ") and "4 GPU(s)" in \
        found["gpus"]["detail"]
    assert found["nvidia runtime"]["ok"] is False
    assert "nvidia-container-toolkit" in found["nvidia runtime"]["detail"]
    assert result.returncode == 1


def test_simulated_gpus_give_a_container_no_real_gpu(tmp_path: Path) -> None:
    """In --simulate-gpus mode a job's NVIDIA_VISIBLE_DEVICES=all reached its container."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        if os.environ.get("CI"):
            pytest.fail("docker is not running: scripts/test.sh starts it")
        pytest.skip("docker is not running")
    from tests.conftest import BUSYBOX

    d = testing.Daemon(cpus=2, memory="4GiB", config='simulate_gpus = "2xH100"\n')
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "g", "image": BUSYBOX, "gpu": 1,
                           "env": {"NVIDIA_VISIBLE_DEVICES": "all"},
                           "command": ["sh", "-c", "echo $NVIDIA_VISIBLE_DEVICES"]})
        assert client.wait_job("g", timeout=60)["phase"] == "Succeeded"
        assert b"".join(client.logs("g")).decode().strip() == "void"
    finally:
        d.close()
