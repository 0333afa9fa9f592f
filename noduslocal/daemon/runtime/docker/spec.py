"""What one container attempt is created with: identity, limits, mounts, environment and
the labels that let a restarted daemon find it again. Pure: builds docker-py keyword
arguments from a job, the layout and the settings.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from docker.types import DeviceRequest, LogConfig, Mount

from noduslocal.daemon.accounts import account
from noduslocal.daemon.config.settings import Settings
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.runtime.launchers import RankPlan
from noduslocal.domain import metrics
from noduslocal.domain.job_paths import CONTAINER_ROOT
from noduslocal.domain.jobs import JobRecord

LABEL = "io.noduslocal"
DEFAULT_SHM = 8 * 2**30


def instance_id(data_dir: Path) -> str:
    """Names the daemon (by its data dir) on its containers: daemons that share a dockerd
    (a system one, a user's, the tests') never adopt or remove each other's."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]


def labels(instance: str, job: JobRecord, number: int, rank: int = 0) -> dict[str, str]:
    return {
        f"{LABEL}.instance": instance,
        f"{LABEL}.job-id": str(job.id),
        f"{LABEL}.job": job.name,
        f"{LABEL}.project": job.project,
        f"{LABEL}.attempt": str(number),
        f"{LABEL}.rank": str(rank),
        f"{LABEL}.owner": job.owner,
        f"{LABEL}.owner-uid": str(job.owner_uid),
    }


def job_filter(instance: str, job_id: int | None = None) -> dict[str, Any]:
    wanted = [f"{LABEL}.instance={instance}"]
    if job_id is not None:
        wanted.append(f"{LABEL}.job-id={job_id}")
    return {"label": wanted}


def container_name(instance: str, job: JobRecord, number: int, rank: int = 0) -> str:
    """Unique by job id (project and name may both contain '-'); labels say the rest. On a
    gang's network, other ranks reach a rank by this name."""
    suffix = f"-r{rank}" if rank else ""
    return f"nodus-{job.id}-{number}{suffix}-{instance[:8]}"


def network_name(instance: str, job: JobRecord, number: int) -> str:
    """A gang attempt's own network: its ranks reach each other there and nobody else."""
    return f"nodus-gang-{job.id}-{number}-{instance[:8]}"


def shm_size(settings: Settings, memory: int | None) -> int:
    if settings.shm_size is not None:
        return settings.shm_size
    return memory // 2 if memory else DEFAULT_SHM


def environment(job: JobRecord, number: int, secrets: dict[str, str],
                gpu_env: dict[str, str]) -> dict[str, str]:
    """The image's own environment stays (PATH and the like) unless the job sets it. HOME
    is the workspace: the owner's host home does not exist in the image, and docker's
    default for a uid without a passwd entry (/) is not writable by the job."""
    spec = job.spec
    return {
        "HOME": CONTAINER_ROOT,
        "USER": job.owner,
        "LOGNAME": job.owner,
        "NODUS_JOB": job.name,
        "NODUS_PROJECT": job.project,
        "NODUS_ATTEMPT": str(number),
        "NODUS_WORKSPACE": CONTAINER_ROOT,
        **metrics.env(None),
        **({"NODUS_CHECKPOINT_DIR": spec.checkpoint} if spec.checkpoint else {}),
        **{f"NODUS_VOLUME_{name.upper().replace('-', '_')}": path
           for path, name in spec.volumes.items()},
        **spec.env,
        **gpu_env,
        **secrets,
    }


def mounts(layout: JobLayout, job: JobRecord) -> list[Mount]:
    """Bind mounts only (a missing source fails the create instead of docker making a
    root-owned directory), sorted so a mount inside /workspace lands on top of it."""
    found = [Mount(CONTAINER_ROOT, str(layout.workspace(job.id)), type="bind")]
    checkpoint = layout.checkpoint_dir(job)
    if checkpoint is not None and checkpoint.parent == layout.job_dir(job.id):
        assert job.spec.checkpoint is not None
        found.append(Mount(job.spec.checkpoint, str(checkpoint), type="bind"))
    for path, name in job.spec.volumes.items():
        found.append(Mount(path, str(layout.volume_dir(name)), type="bind"))
    return sorted(found, key=lambda m: m["Target"].count("/"))


def create_kwargs(settings: Settings, layout: JobLayout, instance: str, job: JobRecord,
                  number: int, secrets: dict[str, str], gpu_env: dict[str, str] | None = None,
                  device_ids: list[str] | None = None,
                  plan: RankPlan | None = None,
                  rank_env: dict[str, str] | None = None, rank: int = 0) -> dict[str, Any]:
    """Keyword arguments of `containers.create`, everything but the image. `device_ids`:
    the real GPUs (UUIDs) docker gives the container; simulated ones are env only. `plan`:
    a gang's rank, on the gang's network, sharing rank 0's IPC namespace (NCCL's shared
    memory transport needs it)."""
    spec = job.spec
    _, _, groups = account(job.owner_uid, job.owner, job.owner_gid)
    env = environment(job, number, secrets, gpu_env or {})
    if plan is not None or rank_env:
        env = {**env, **(plan.env() if plan else {}), **(rank_env or {}), **secrets}
    kwargs: dict[str, Any] = {
        "name": container_name(instance, job, number, rank),
        "labels": labels(instance, job, number, rank),
        "environment": env,
        "working_dir": spec.workdir or CONTAINER_ROOT,
        "user": f"{job.owner_uid}:{job.owner_gid}",
        "group_add": [str(g) for g in groups if g != job.owner_gid],
        "init": True,
        "privileged": False,
        "security_opt": ["no-new-privileges"],
        "cap_drop": ["ALL"],
        "pids_limit": settings.pids_limit,
        "nano_cpus": spec.cpu_m * 1_000_000,
        "shm_size": shm_size(settings, spec.memory),
        "mounts": mounts(layout, job),
        # Bounded on dockerd's disk; the daemon copies the log into the attempt directory.
        "log_config": LogConfig(type="json-file", config={"max-size": "64m", "max-file": "4"}),
        "detach": True,
        "stdin_open": False,
        "tty": False,
    }
    if plan is not None and spec.command and plan.gang.launcher != "Plain":
        kwargs["entrypoint"] = plan.argv(spec.argv)  # the launcher runs the job's command
        kwargs["command"] = []
    elif spec.command:  # Kubernetes meaning: command replaces the entrypoint, args the CMD
        kwargs["entrypoint"] = spec.command
        kwargs["command"] = spec.args
    elif spec.args:
        kwargs["command"] = spec.args
    if spec.memory:
        kwargs["mem_limit"] = spec.memory
        kwargs["memswap_limit"] = spec.memory  # no swap: the limit is the limit
    if plan is not None:
        kwargs["network"] = network_name(instance, job, number)
        kwargs["ipc_mode"] = ("shareable" if rank == 0
                              else f"container:{container_name(instance, job, number)}")
    elif spec.network == "none":
        kwargs["network_mode"] = "none"
    if device_ids:
        kwargs["device_requests"] = [DeviceRequest(device_ids=device_ids,
                                                   capabilities=[["gpu"]])]
    return kwargs
