"""Wire types shared by the daemon, the client and the CLI: the job spec as the store keeps
it, the create request once validated (validation.py), and the job, attempt and event
documents the API returns, with the API's one time format.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from noduslocal.domain.dependencies import Dependency
from noduslocal.domain.gang import Gang
from noduslocal.domain.gpu_request import GpuRequest
from noduslocal.domain.indexes import Indexed
from noduslocal.domain.job_paths import stored
from noduslocal.domain.timefmt import iso

# Bytes of a packed source the client sends and the daemon takes without allow_large_source:
# the client refuses first (naming what is big), the daemon enforces it for any client.
LARGE_SOURCE = 100 * 1024 * 1024


@dataclass(frozen=True)
class JobSpec:
    """A validated job request, as the store keeps it."""

    command: list[str]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cpu_m: int = 1000
    memory: int | None = None
    disk: int | None = None  # bytes its job directory may take, reserved at its start
    workdir: str | None = None
    timeout: float | None = None
    retries: int = 0
    secrets: list[str] = field(default_factory=list)  # env names; values never travel
    outputs: dict[str, str] = field(default_factory=dict)  # name -> workspace-relative path
    checkpoint: str | None = None  # an absolute path of the job's world (job_paths.py)
    volumes: dict[str, str] = field(default_factory=dict)  # absolute mount path -> name
    source: str | None = None  # sha256 of an uploaded tar, unpacked into the workspace
    image: str | None = None  # runs as a docker container when set, else as a host process
    gpu: GpuRequest | None = None
    priority: int = 0  # higher goes first; ordinary users up to the configured maximum
    expected_duration: float | None = None  # seconds; lets it backfill, feeds estimates
    max_cost: float | None = None  # stop it (MaxCostExceeded) once it cost more
    interruptible: bool = False  # may be preempted (and queued again) for other work
    network: str | None = None  # containers: None (docker's default bridge) or "none"
    # A `map` task's: a non-zero exit spends a retry too (not 126/127, not an OOM kill).
    retry_errors: bool = False
    ephemeral: bool = False  # the workspace is discarded when the job ends (project.job)
    profile: str | None = None  # the daemon's preset that filled what the caller left unset
    gang: Gang | None = None  # `distributed`: cpu and memory are each rank's, gpu all ranks'
    indexed: Indexed | None = None  # completions/parallelism: resources are each index's
    region: str | None = None  # a configured cluster region (Slurm); None: this box
    after: list[Dependency] = field(default_factory=list)  # waits for these to end first

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]

    @property
    def runtime(self) -> str:
        """The kind of runtime that runs the job: "slurm" in a cluster region, else "docker"
        for an image, else "process"."""
        if self.region is not None:
            return "slurm"
        return "process" if self.image is None else "docker"

    def to_wire(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "args": self.args,
            "env": self.env,
            "cpu": self.cpu_m / 1000,
            "memory": self.memory,
            "disk": self.disk,
            "workdir": self.workdir,
            "timeout": self.timeout,
            "retries": self.retries,
            "secrets": self.secrets,
            "outputs": self.outputs,
            "checkpoint": self.checkpoint,
            "volumes": self.volumes,
            "source": self.source,
            "image": self.image,
            "network": self.network,
            "gpu": None if self.gpu is None else self.gpu.to_wire(),
            "priority": self.priority,
            "expected_duration": self.expected_duration,
            "max_cost": self.max_cost,
            "interruptible": self.interruptible,
            "retry_errors": self.retry_errors,
            "ephemeral": self.ephemeral,
            "profile": self.profile,
            "distributed": None if self.gang is None else self.gang.to_wire(),
            "region": self.region,
            "after": [dep.to_wire() for dep in self.after],
            **(self.indexed.to_wire() if self.indexed else {"completions": None,
                                                            "parallelism": None}),
        }

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> JobSpec:
        return cls(
            command=list(data["command"]),
            args=list(data.get("args") or []),
            env=dict(data.get("env") or {}),
            cpu_m=round(float(data.get("cpu", 1)) * 1000),
            memory=data.get("memory"),
            disk=data.get("disk"),
            workdir=data.get("workdir"),
            timeout=data.get("timeout"),
            retries=int(data.get("retries", 0)),
            secrets=list(data.get("secrets") or []),
            outputs=dict(data.get("outputs") or {}),
            checkpoint=None if data.get("checkpoint") is None else stored(data["checkpoint"]),
            volumes={stored(path): name for path, name in (data.get("volumes") or {}).items()},
            source=data.get("source"),
            image=data.get("image"),
            network=data.get("network"),
            gpu=GpuRequest.from_stored(data.get("gpu")),
            priority=int(data.get("priority") or 0),
            expected_duration=data.get("expected_duration"),
            max_cost=data.get("max_cost"),
            interruptible=bool(data.get("interruptible")),
            retry_errors=bool(data.get("retry_errors")),
            ephemeral=bool(data.get("ephemeral")),
            profile=data.get("profile"),
            gang=Gang.from_stored(data.get("distributed")),
            indexed=Indexed.from_stored(data if data.get("completions") else None),
            region=data.get("region"),
            after=[Dependency.from_stored(dep) for dep in data.get("after") or []],
        )


@dataclass(frozen=True)
class SecretRef:
    """One entry of a job's `secrets`: the env variable it fills, and either the name of
    the caller's stored secret or (`--secret KEY=VALUE`) a value given with the job."""

    env: str
    name: str | None = None
    value: str | None = None


@dataclass(frozen=True)
class CreateRequest:
    """The body of POST /v1/jobs, validated: the spec plus name, project, labels."""

    spec: JobSpec
    name: str | None
    project: str | None
    labels: dict[str, str]
    secrets: list[SecretRef] = field(default_factory=list)


@dataclass(frozen=True)
class Owner:
    """Who submits: the caller's uid, gid and name, as the kernel told the daemon."""

    uid: int
    gid: int
    name: str
    admin: bool = False  # may use other users' volumes


@dataclass(frozen=True)
class Collected:
    """One declared output as collected after an attempt (the outputs table's row)."""

    name: str
    path: str
    kind: str  # "file" or "dir" (a tar)
    size: int
    sha256: str
    skipped: str | None = None  # why it was left out of the store
    index: int = -1  # an indexed job's index that left it; -1 for an ordinary job
    mode: int | None = None  # a file's permission bits (never set-id or sticky)


@dataclass
class JobRecord:
    """One row of the jobs table, as the daemon holds it."""

    id: int
    project: str
    name: str
    owner_uid: int
    owner_gid: int
    owner: str
    phase: str
    spec: JobSpec
    labels: dict[str, str]
    created_at: float
    reason: str | None = None
    message: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    attempts: int = 0
    retries_used: int = 0
    cost: float = 0.0  # of its ended attempts
    sweep_id: int | None = None  # a sweep's cell: the sweep, and the cell's index
    cell: int | None = None
    metrics: dict[str, float] = field(default_factory=dict)  # as of its last attempt's end
    collected_at: float | None = None  # retention removed its directory and outputs

    def collected_note(self) -> str | None:
        """Why its workspace, logs and outputs are gone, once retention removed them."""
        if self.collected_at is None:
            return None
        return (f"the workspace, logs and outputs of job {self.name!r} were removed by "
                f"retention at {iso(self.collected_at)}, past the time ended jobs keep them "
                "(keep_ended); its history stays")

    def to_wire(self, hold: str | None = None, *, redact: bool = False,
                running_cost: float = 0.0,
                live_metrics: dict[str, float] | None = None) -> dict[str, Any]:
        """The job document; with `redact` (a caller who may not control the job) the
        values of its environment are hidden, as a token often travels there, and a sweep
        cell's command and args too, which hold its parameters (a map's values)."""
        end = self.ended_at or (time.time() if self.started_at else None)
        spec = self.spec.to_wire()
        if redact:
            spec["env"] = dict.fromkeys(spec["env"], "***")
            if self.cell is not None:
                spec["command"] = ["***"] * len(spec["command"])
                spec["args"] = ["***"] * len(spec["args"])
        return {
            "kind": "Job",
            "name": self.name,
            "project": self.project,
            "owner": self.owner,
            "uid": self.owner_uid,
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "hold": hold,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at),
            "collected_at": iso(self.collected_at),
            "duration_s": None if not self.started_at or not end
            else round(end - self.started_at, 3),
            "attempts": self.attempts,
            "retries": self.spec.retries,
            "retries_used": self.retries_used,
            "cost": round(self.cost + running_cost, 6),
            "labels": self.labels,
            "cell": self.cell,
            "metrics": live_metrics or self.metrics,
            "spec": spec,
        }


@dataclass(frozen=True)
class Handle:
    """How a runtime finds one rank again, in the database and after a restart: `ref` is
    the runtime's own id (a shim's pid, a container id, a cluster's job id), `boot` the
    boot it belongs to where that matters (a pid means nothing after a reboot)."""

    runtime: str
    ref: str
    rank: int = 0
    boot: str | None = None

    def to_stored(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "ref": self.ref, "rank": self.rank,
                "boot": self.boot}

    @classmethod
    def from_stored(cls, data: dict[str, Any]) -> Handle:
        return cls(data["runtime"], str(data["ref"]), int(data.get("rank", 0)),
                   data.get("boot"))


def handles_to_json(handles: list[Handle]) -> str | None:
    return json.dumps([h.to_stored() for h in handles]) if handles else None


def handles_from_json(text: str | None) -> list[Handle]:
    return [Handle.from_stored(h) for h in json.loads(text)] if text else []


@dataclass
class AttemptRecord:
    job_id: int
    number: int
    phase: str
    created_at: float
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    reason: str | None = None
    message: str | None = None
    stop_reason: str | None = None
    gpus_json: str | None = None
    cost: float | None = None
    handles_json: str | None = None

    @property
    def gpus(self) -> list[str]:
        return json.loads(self.gpus_json) if self.gpus_json else []

    @property
    def handles(self) -> list[Handle]:
        return handles_from_json(self.handles_json)

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": "Attempt",
            "gpus": self.gpus,
            "cost": self.cost,
            "number": self.number,
            "phase": self.phase,
            "container": next((h.ref[:12] for h in self.handles if h.runtime == "docker"),
                              None),
            "created_at": iso(self.created_at),
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at),
            "exit_code": self.exit_code,
            "signal": self.signal,
            "reason": self.reason,
            "message": self.message,
        }


@dataclass
class Event:
    """One row of the append-only events log."""

    seq: int
    job_id: int
    project: str
    name: str
    at: float
    phase: str
    reason: str | None
    message: str | None
    attempt: int | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "at": iso(self.at),
            "kind": "JobPhase",
            "project": self.project,
            "job": self.name,
            "phase": self.phase,
            "reason": self.reason,
            "message": self.message,
            "attempt": self.attempt,
        }


@dataclass(frozen=True)
class Diagnosis:
    """One line of `noduslocal doctor`: OK (True), wrong (False) or not checked (None)."""

    name: str
    ok: bool | None
    detail: str

    def to_wire(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class GcReport:
    """What a retention pass removed (or, dry, would remove)."""

    dry_run: bool
    at: float
    jobs: list[dict[str, Any]] = field(default_factory=list)  # project, name, owner, bytes
    sources: int = 0  # uploads no unfinished job names, past their keep
    blobs: int = 0
    blob_bytes: int = 0

    def to_wire(self) -> dict[str, Any]:
        return {"dry_run": self.dry_run, "at": iso(self.at), "jobs": self.jobs,
                "job_bytes": sum(job["bytes"] for job in self.jobs),
                "sources": self.sources, "blobs": self.blobs, "blob_bytes": self.blob_bytes}


@dataclass
class UserUsage:
    """What one user holds on the data dir's disk, in bytes allocated (blobs: their size,
    each counted once per user however many jobs name it)."""

    uid: int
    user: str
    jobs: int = 0  # job directories (unfinished jobs, and ended ones retention keeps)
    workspaces: int = 0  # those directories (workspaces, logs, checkpoints), snapshots once
    volumes: int = 0
    blobs: int = 0  # collected outputs and uploaded sources

    @property
    def total(self) -> int:
        return self.workspaces + self.volumes + self.blobs

    def to_wire(self, quota: int | None, keep: float | None) -> dict[str, Any]:
        return {"user": self.user, "uid": self.uid, "jobs": self.jobs,
                "workspaces": self.workspaces, "volumes": self.volumes, "blobs": self.blobs,
                "total": self.total, "quota": quota, "keep_ended_s": keep}
