"""What a host-process attempt is started with (the shim's launch request): argv,
environment, workdir, the owner's identity and the secret values to mask.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from noduslocal.daemon.accounts import account
from noduslocal.daemon.files.layout import DEFAULT_PATH, JobLayout
from noduslocal.daemon.runtime.launchers import RankPlan
from noduslocal.domain import metrics
from noduslocal.domain.jobs import JobRecord


def launch_request(layout: JobLayout, job: JobRecord, number: int,
                   secrets: dict[str, str] | None = None,
                   gpu_env: dict[str, str] | None = None,
                   plan: RankPlan | None = None, directory: Path | None = None,
                   rank_env: dict[str, str] | None = None) -> dict[str, Any]:
    """What the shim needs; `secrets` are added to the environment, and their values
    masked in the stored log; `gpu_env` pins the job's GPUs (over the job's env); `plan`
    makes it a gang's rank (its rendezvous and launcher); `directory` is the rank's (the
    attempt's by default); `rank_env` what it alone is told (an index)."""
    directory = directory or layout.attempt_dir(job.id, number)
    workspace = layout.workspace(job.id)
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
        "NODUS_WORKSPACE": str(workspace),
        **metrics.env(workspace),
        **({"NODUS_CHECKPOINT_DIR": str(workspace / job.spec.checkpoint)}
           if job.spec.checkpoint else {}),
        **{f"NODUS_VOLUME_{name.upper().replace('-', '_')}": str(workspace / rel)
           for rel, name in job.spec.volumes.items()},
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
        "cwd": job.spec.workdir or str(workspace),
        "uid": None,
        "mask": sorted(set((secrets or {}).values())),
    }
    if os.getuid() == 0:
        request.update(uid=job.owner_uid, gid=job.owner_gid, groups=groups)
    return request
