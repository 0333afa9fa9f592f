"""Wire types shared by the daemon, the client and the CLI: the job spec as it is validated
at create, the job, attempt and event documents the API returns, and the parsers for
durations, sizes and CPU counts. Everything that crosses the socket is shaped here.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from noduslocal.errors import InvalidArgument, Unsupported

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")
MAX_RETRIES = 100
MAX_DURATION = 10 * 365 * 86400.0

# The keyword arguments of the reference `Job.create`, plus `retries` (the CLI's
# `--retries`, which the reference has on `super job run` only).
SUPPORTED_FIELDS = frozenset(
    {"name", "project", "command", "args", "cpu", "memory", "env", "workdir", "timeout",
     "region", "labels", "retries", "secrets"}
)
# Accepted only at their default meaning until the issue that builds them lands; any other
# value raises Unsupported naming the field. The value is the set of values that mean
# "not used".
NOT_YET_FIELDS: dict[str, tuple[Any, ...]] = {
    "image": (None,),
    "source": (None,),
    "gpu": (None, 0),
    "disk": (None,),
    "volumes": (None, {}),
    "network": (None,),
    "checkpoint": (None,),
    "expected_duration": (None,),
    "interruptible": (None, False),
    "profile": (None,),
    "max_cost": (None,),
    "completions": (None, 1),
    "parallelism": (None, 1),
    "distributed": (None,),
    "outputs": (None, {}),
    "allow_large_source": (None, False),
}
JOB_CREATE_FIELDS = SUPPORTED_FIELDS | frozenset(NOT_YET_FIELDS)

_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?", re.IGNORECASE)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_SIZE_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_duration(value: Any, field_name: str) -> float:
    """Seconds from 90, "90", "90s", "15m", "2h", "1h30m" or "1d"."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{field_name}: expected a duration like 90, 90s, 15m, 2h",
                              field=field_name)
    if isinstance(value, int | float):
        try:
            seconds = float(value)
        except OverflowError:
            seconds = math.inf
    elif isinstance(value, str) and value.strip():
        text = value.strip().replace(" ", "")
        pos, seconds = 0, 0.0
        for match in _DURATION_RE.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
            pos = match.end()
        if pos != len(text) or pos == 0:
            raise InvalidArgument(
                f"{field_name}: {value!r} is not a duration; use 90, 90s, 15m, 2h or 1h30m",
                field=field_name,
            )
    else:
        raise InvalidArgument(f"{field_name}: expected a duration like 90, 90s, 15m, 2h",
                              field=field_name)
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_DURATION:
        raise InvalidArgument(f"{field_name}: must be a positive duration of at most 10 years",
                              field=field_name)
    return seconds


def parse_size(value: Any, field_name: str) -> int:
    """Bytes from 1048576, "512M", "512MiB", "4G" or "4GiB" (binary units, as docker)."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{field_name}: expected a size like 512M or 4GiB",
                              field=field_name)
    if isinstance(value, int):
        size = value
    elif isinstance(value, float) and value.is_integer():
        size = int(value)
    elif isinstance(value, str) and (match := _SIZE_RE.match(value)):
        number, unit, binary, byte = match.groups()
        if binary and not unit:
            raise InvalidArgument(f"{field_name}: {value!r} is not a size", field=field_name)
        size = int(float(number) * 1024 ** _SIZE_POWERS[unit.lower()])
        del byte
    else:
        raise InvalidArgument(
            f"{field_name}: {value!r} is not a size; use bytes or 512M, 4G, 4GiB",
            field=field_name,
        )
    if size <= 0:
        raise InvalidArgument(f"{field_name}: must be a positive size", field=field_name)
    return size


def parse_cpu(value: Any, field_name: str = "cpu") -> int:
    """Millicores from 2, 0.5, "2" or "500m"."""
    if isinstance(value, bool):
        raise InvalidArgument(f"{field_name}: expected a CPU count like 2, 0.5 or 500m",
                              field=field_name)
    millis: float
    plain = isinstance(value, str) and re.fullmatch(r"\s*\d+(\.\d+)?\s*", value)
    if isinstance(value, int | float) or plain:
        millis = float(value) * 1000
    elif isinstance(value, str) and re.fullmatch(r"\s*\d+m\s*", value):
        millis = float(value.strip()[:-1])
    else:
        raise InvalidArgument(f"{field_name}: {value!r} is not a CPU count; use 2, 0.5 or 500m",
                              field=field_name)
    if not math.isfinite(millis) or millis < 1:
        raise InvalidArgument(f"{field_name}: must be at least 1m (0.001 CPU)", field=field_name)
    return round(millis)


def validate_name(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{field_name}: expected a non-empty string", field=field_name)
    if len(value) > 63 or not NAME_RE.match(value):
        raise InvalidArgument(
            f"{field_name}: {value!r} is not a valid name; use at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit",
            field=field_name,
        )
    return value


def _string_list(value: Any, field_name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidArgument(f"{field_name}: expected a list of strings", field=field_name)
    if any("\0" in item for item in value):
        raise InvalidArgument(f"{field_name}: strings may not contain NUL", field=field_name)
    return list(value)


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidArgument("env: expected a mapping of NAME to string", field="env")
    env: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            raise InvalidArgument(
                f"env: {key!r} is not a valid variable name; use letters, digits and '_', "
                "not starting with a digit",
                field="env",
            )
        if not isinstance(val, str) or "\0" in val:
            raise InvalidArgument(f"env: the value of {key} must be a string", field="env")
        env[key] = val
    return env


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidArgument("labels: expected a mapping of key to string", field="labels")
    labels: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or len(key) > 63 or not LABEL_KEY_RE.match(key):
            raise InvalidArgument(
                f"labels: {key!r} is not a valid key; use at most 63 letters, digits, "
                "'-', '_', '.' and '/'",
                field="labels",
            )
        if not isinstance(val, str) or len(val) > 63 or "\n" in val:
            raise InvalidArgument(
                f"labels: the value of {key} must be a string of at most 63 characters",
                field="labels",
            )
        labels[key] = val
    return labels


@dataclass(frozen=True)
class JobSpec:
    """A validated job request, as the store keeps it."""

    command: list[str]
    args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    cpu_m: int = 1000
    memory: int | None = None
    workdir: str | None = None
    timeout: float | None = None
    retries: int = 0
    secrets: list[str] = field(default_factory=list)  # env names; values never travel

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]

    def to_wire(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "args": self.args,
            "env": self.env,
            "cpu": self.cpu_m / 1000,
            "memory": self.memory,
            "workdir": self.workdir,
            "timeout": self.timeout,
            "retries": self.retries,
            "secrets": self.secrets,
        }

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> JobSpec:
        return cls(
            command=list(data["command"]),
            args=list(data.get("args") or []),
            env=dict(data.get("env") or {}),
            cpu_m=round(float(data.get("cpu", 1)) * 1000),
            memory=data.get("memory"),
            workdir=data.get("workdir"),
            timeout=data.get("timeout"),
            retries=int(data.get("retries", 0)),
            secrets=list(data.get("secrets") or []),
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


def validate_secret_value(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise InvalidArgument(f"{field_name}: a secret's value is a non-empty string",
                              field=field_name)
    return value


def _secret_refs(value: Any, env: Mapping[str, str]) -> list[SecretRef]:
    """["NAME", {"name": "NAME", "env": "VAR"}, {"env": "VAR", "value": "..."}]."""
    if not isinstance(value, list):
        raise InvalidArgument("secrets: expected a list of secret names", field="secrets")
    refs: list[SecretRef] = []
    for item in value:
        if isinstance(item, str):
            item = {"name": item}
        if not isinstance(item, Mapping) or set(item) - {"name", "env", "value"} or (
                ("name" in item) == ("value" in item)):
            raise InvalidArgument(
                "secrets: each entry is a name, {\"name\": N, \"env\": VAR} or "
                "{\"env\": VAR, \"value\": V}", field="secrets")
        target = item.get("env", item.get("name"))
        if not isinstance(target, str) or not ENV_KEY_RE.match(target):
            raise InvalidArgument(f"secrets: {target!r} is not a valid variable name",
                                  field="secrets")
        if "name" in item and (not isinstance(item["name"], str)
                               or not ENV_KEY_RE.match(item["name"])):
            raise InvalidArgument(f"secrets: {item['name']!r} is not a secret name",
                                  field="secrets")
        if target in env or any(r.env == target for r in refs):
            raise InvalidArgument(f"secrets: {target} is set twice (env or secrets)",
                                  field="secrets")
        refs.append(SecretRef(target, item.get("name"), None if "value" not in item
                              else validate_secret_value(item["value"], "secrets")))
    return refs


def parse_create(body: Any, *, regions: tuple[str, ...]) -> CreateRequest:
    """Validate a create body completely before anything is written."""
    if not isinstance(body, Mapping):
        raise InvalidArgument("body: expected a JSON object", field="body")
    unknown = sorted(set(body) - JOB_CREATE_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"{unknown[0]}: unknown field; allowed: {', '.join(sorted(JOB_CREATE_FIELDS))}",
            field=unknown[0],
        )
    for key, neutral in NOT_YET_FIELDS.items():
        if key in body and not any(body[key] == n and type(body[key]) is type(n)
                                   for n in neutral):
            raise Unsupported(key)
    name = None if body.get("name") is None else validate_name(body["name"], "name")
    project = None if body.get("project") is None else validate_name(body["project"], "project")
    region = body.get("region")
    if region is not None and region not in regions:
        raise InvalidArgument(
            f"region: {region!r} is not a region of this host; valid: {', '.join(regions)}",
            field="region",
        )
    command = _string_list(body.get("command") or [], "command")
    if not command or not command[0]:
        raise InvalidArgument(
            "command: required for a job without an image, e.g. [\"python\", \"train.py\"]",
            field="command",
        )
    args = _string_list(body.get("args") or [], "args")
    workdir = body.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")):
        raise InvalidArgument("workdir: expected an absolute path", field="workdir")
    retries = body.get("retries", 0) or 0
    if isinstance(retries, bool) or not isinstance(retries, int) or not (
        0 <= retries <= MAX_RETRIES
    ):
        raise InvalidArgument(f"retries: expected an integer from 0 to {MAX_RETRIES}",
                              field="retries")
    env = _env(body.get("env") or {})
    secrets = _secret_refs(body.get("secrets") or [], env)
    spec = JobSpec(
        command=command,
        args=args,
        env=env,
        cpu_m=1000 if body.get("cpu") is None else parse_cpu(body["cpu"]),
        memory=None if body.get("memory") is None else parse_size(body["memory"], "memory"),
        workdir=workdir,
        timeout=None if body.get("timeout") is None else parse_duration(body["timeout"],
                                                                           "timeout"),
        retries=retries,
        secrets=[ref.env for ref in secrets],
    )
    return CreateRequest(spec=spec, name=name, project=project,
                         labels=_labels(body.get("labels") or {}), secrets=secrets)


def iso(ts: float | None) -> str | None:
    """RFC 3339 UTC with milliseconds, the API's one time format."""
    if ts is None:
        return None
    seconds = int(ts)
    # time.strftime over gmtime: a third of datetime's cost, and this runs for every
    # timestamp of every job document the API sends.
    return (time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
            + f".{int((ts - seconds) * 1000):03d}Z")


def parse_iso(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()


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

    def to_wire(self, hold: str | None = None, *, redact: bool = False) -> dict[str, Any]:
        """The job document; with `redact` (a caller who may not control the job) the
        values of its environment are hidden, as a token often travels there."""
        end = self.ended_at or (time.time() if self.started_at else None)
        spec = self.spec.to_wire()
        if redact:
            spec["env"] = dict.fromkeys(spec["env"], "***")
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
            "duration_s": None if not self.started_at or not end
            else round(end - self.started_at, 3),
            "attempts": self.attempts,
            "retries": self.spec.retries,
            "retries_used": self.retries_used,
            "labels": self.labels,
            "spec": spec,
        }


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
    shim_pid: int | None = None
    boot_id: str | None = None

    def to_wire(self) -> dict[str, Any]:
        return {
            "kind": "Attempt",
            "number": self.number,
            "phase": self.phase,
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
