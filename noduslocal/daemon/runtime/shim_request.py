"""What a shim is asked to run (shim.py's request), for every runtime that runs one (this
box's processes, a cluster's batch jobs): the argv, the environment the job gets, its
workdir, the identity it runs as and the secret values to mask in its logs.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from noduslocal.daemon.accounts import account
from noduslocal.daemon.files.layout import DEFAULT_PATH, JobLayout
from noduslocal.daemon.runtime.launchers import RankPlan
from noduslocal.domain import metrics
from noduslocal.domain.job_paths import CONTAINER_ROOT, in_workspace
from noduslocal.domain.jobs import JobRecord

CONTAINER_PATH = Path(CONTAINER_ROOT)  # made once: a Path costs microseconds a task

def launch_request(layout: JobLayout, job: JobRecord, number: int,
                   secrets: dict[str, str] | None = None,
                   gpu_env: dict[str, str] | None = None,
                   plan: RankPlan | None = None, directory: Path | None = None,
                   rank_env: dict[str, str] | None = None,
                   world: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the shim needs; `secrets` are added to the environment, and their values
    masked in the stored log; `gpu_env` pins the job's GPUs (over the job's env); `plan`
    makes it a gang's rank (its rendezvous and launcher); `directory` is the rank's (the
    attempt's by default); `rank_env` what it alone is told (an index); `world` the mount
    namespace's fields (Namespaces.request): its paths are then a container's, else the
    host's (the workspace where it lies)."""
    directory = directory or layout.attempt_dir(job.id, number)
    workspace = layout.workspace(job.id)
    root = CONTAINER_PATH if world is not None else workspace

    def seen(path: str) -> str:  # where the job finds a checkpoint, volume path or workdir
        if path == CONTAINER_ROOT:
            return str(root)
        rel = in_workspace(path)
        return str(root / rel) if rel is not None else path

    home, shell, groups = account(job.owner_uid, job.owner, job.owner_gid)
    env = {
        "PATH": DEFAULT_PATH,
        "HOME": home,
        "USER": job.owner,
        "LOGNAME": job.owner,
        "SHELL": shell,
        "LANG": "C.UTF-8",
        "NODUS_JOB": job.name,
        "NODUS_PROJECT": job.project,
        "NODUS_ATTEMPT": str(number),
        "NODUS_WORKSPACE": str(root),
        **metrics.env(None if world is not None else workspace),
        **({"NODUS_CHECKPOINT_DIR": seen(job.spec.checkpoint)} if job.spec.checkpoint else {}),
        **{f"NODUS_VOLUME_{name.upper().replace('-', '_')}": seen(path)
           for path, name in job.spec.volumes.items()},
        **job.spec.env,
        **(gpu_env or {}),
        **(plan.env() if plan is not None else {}),
        **(rank_env or {}),
        **(secrets or {}),
    }
    request: dict[str, Any] = {
        "dir": str(directory),
        "argv": job.spec.argv if plan is None else plan.argv(job.spec.argv),
        "env": env,
        # Without a mount namespace (a cluster's node) /workspace is not the workspace.
        "cwd": seen(job.spec.workdir) if job.spec.workdir else str(root),
        "uid": None,
        "mask": sorted(set((secrets or {}).values())),
        **(world or {}),
    }
    if os.getuid() == 0:
        request.update(uid=job.owner_uid, gid=job.owner_gid, groups=groups)
    return request
