"""A finished job's workspace packed as a source (`map --from JOB`): made by tar running as
the job's owner, never as root, so it holds only what the owner may read; its volumes'
mount points and its metrics file are left out, every task writes its own.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from noduslocal.daemon.accounts import account
from noduslocal.daemon.files.blobs import BlobStore, HashingWriter
from noduslocal.daemon.files.layout import DEFAULT_PATH, failure_cause
from noduslocal.domain import errors
from noduslocal.domain.job_paths import in_workspace
from noduslocal.domain.jobs import JobRecord
from noduslocal.domain.metrics import METRICS_FILE

TIMEOUT = 600.0  # seconds to pack a workspace


def _excluded(job: JobRecord) -> list[str]:
    paths = [METRICS_FILE]
    for path in job.spec.volumes:
        if rel := in_workspace(path):
            paths.append(rel)
    return [f"--exclude=./{rel.strip('/')}" for rel in paths]


def pack(workspace: Path, job: JobRecord, blobs: BlobStore, limit: int) -> tuple[str, int]:
    """(sha256, size) of the workspace's tar, kept in the blob store."""
    argv = ["tar", "-C", str(workspace), "--sparse", "--one-file-system", *_excluded(job),
            "-cf", "-", "."]
    kwargs: dict[str, Any] = {}
    if os.getuid() == 0 and job.owner_uid != 0:
        _, _, groups = account(job.owner_uid, job.owner, job.owner_gid)
        kwargs = {"user": job.owner_uid, "group": job.owner_gid, "extra_groups": groups}
    fd, tmp = blobs.new()
    writer = HashingWriter(fd)
    kept = False
    try:
        with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, cwd="/",
                              env={"PATH": DEFAULT_PATH, "LANG": "C.UTF-8"},
                              **kwargs) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            while chunk := proc.stdout.read(1 << 20):
                if writer.size + len(chunk) > limit:
                    proc.kill()
                    raise errors.PayloadTooLarge(
                        f"from: job {job.name!r}'s workspace is more than "
                        f"{limit // 2**20} MiB packed; pass allow_large_source for a larger "
                        "one", field="from")
                writer.write(chunk)
            error = proc.stderr.read().decode(errors="replace").strip()
            code = proc.wait(TIMEOUT)
        if code != 0:
            raise errors.Conflict(f"from: job {job.name!r}'s workspace could not be copied: "
                                  f"{failure_cause(error, code)}", field="from")
        size, sha = blobs.keep(tmp, writer)
        kept = True
        return sha, size
    finally:
        if not kept:
            os.close(fd)
            tmp.unlink(missing_ok=True)
