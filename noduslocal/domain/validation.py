"""Validation of what users send: names, labels, environments, secrets, and the whole
body of a job create, refused completely (one line naming the field) before anything is
written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from noduslocal.domain import job_paths
from noduslocal.domain.container_fields import container_image, container_network
from noduslocal.domain.dependencies import parse_after
from noduslocal.domain.errors import InvalidArgument, Unsupported
from noduslocal.domain.gang import parse_gang
from noduslocal.domain.gpu_request import GpuRequest, parse_gpu
from noduslocal.domain.indexes import check_index_outputs, parse_indexed
from noduslocal.domain.jobs import CreateRequest, JobSpec, SecretRef
from noduslocal.domain.profiles import with_profile
from noduslocal.domain.units import fmt_bytes, parse_cpu, parse_duration, parse_size

# Anchored with \Z, never $ (which also matches before a final newline), so that even a
# `.match` of these elsewhere takes nothing after the name; we use `.fullmatch` ourselves.
NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
ENV_KEY_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
LABEL_KEY_RE = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?\Z")
MAX_RETRIES = 100
MAX_ARG_STRLEN = 131072  # bytes of one argument or variable, NUL included (Linux)
MAX_EXEC_BYTES = 1 << 20  # arguments and environment together; the kernel takes 2 MiB
SQL_INT_MAX = 2**63 - 1  # SQLite's integers are 64-bit: a query given a larger one fails

# The keyword arguments of the reference `Job.create`, plus `retries` (the CLI's
# `--retries`, which the reference has on `super job run` only).
SUPPORTED_FIELDS = frozenset(
    {"name", "project", "command", "args", "cpu", "memory", "env", "workdir", "timeout",
     "region", "labels", "retries", "secrets", "outputs", "checkpoint", "volumes", "source",
     "allow_large_source", "image", "network", "gpu", "expected_duration", "priority", "max_cost",
     "interruptible", "ephemeral", "profile", "disk", "distributed", "completions",
     "parallelism", "after"}
)
JOB_CREATE_FIELDS = SUPPORTED_FIELDS

def validate_name(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{field_name}: expected a non-empty string", field=field_name)
    if len(value) > 63 or not NAME_RE.fullmatch(value):
        raise InvalidArgument(
            f"{field_name}: {value!r} is not a valid name; use at most 63 lowercase letters, "
            "digits and '-', starting and ending with a letter or digit",
            field=field_name,
        )
    return value


def exec_size(text: str, field_name: str) -> int:
    """Bytes `text` takes in a process's arguments or environment; refused when it is not
    valid Unicode or longer than the kernel takes in one string (MAX_ARG_STRLEN)."""
    try:
        size = len(text.encode()) + 1
    except UnicodeEncodeError:
        raise InvalidArgument(f"{field_name}: not valid Unicode (a lone surrogate)",
                              field=field_name) from None
    if size > MAX_ARG_STRLEN:
        raise InvalidArgument(f"{field_name}: a string of {size - 1} bytes; a process takes "
                              f"at most {MAX_ARG_STRLEN - 1} in one argument or variable",
                              field=field_name)
    return size


def check_exec(command: list[str], args: list[str], env: Mapping[str, str],
               field_name: str | None = None) -> None:
    """Refuse what no process could be started with: a string over MAX_ARG_STRLEN, or all of
    them over MAX_EXEC_BYTES. `field_name` names the field to blame (a sweep's map or
    grid), else args and env."""
    total = sum(exec_size(item, field_name or "args") for item in [*command, *args]) + sum(
        exec_size(f"{k}={v}", field_name or "env") for k, v in env.items())
    if total > MAX_EXEC_BYTES:
        field_name = field_name or "args"
        raise InvalidArgument(f"{field_name}: command, args and env take {total} bytes "
                              f"together; a job's may take at most {MAX_EXEC_BYTES} (put data "
                              "in a file)", field=field_name)


def _string_list(value: Any, field_name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise InvalidArgument(f"{field_name}: expected a list of strings", field=field_name)
    if any("\0" in item for item in value):
        raise InvalidArgument(f"{field_name}: strings may not contain NUL", field=field_name)
    for item in value:
        exec_size(item, field_name)
    return list(value)


def _env(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidArgument("env: expected a mapping of NAME to string", field="env")
    env: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not ENV_KEY_RE.fullmatch(key):
            raise InvalidArgument(
                f"env: {key!r} is not a valid variable name; use letters, digits and '_', "
                "not starting with a digit",
                field="env",
            )
        if not isinstance(val, str) or "\0" in val:
            raise InvalidArgument(f"env: the value of {key} must be a string", field="env")
        exec_size(f"{key}={val}", "env")
        env[key] = val
    return env


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidArgument("labels: expected a mapping of key to string", field="labels")
    labels: dict[str, str] = {}
    for key, val in value.items():
        if not isinstance(key, str) or len(key) > 63 or not LABEL_KEY_RE.fullmatch(key):
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


def validate_secret_value(value: Any, field_name: str) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise InvalidArgument(f"{field_name}: a secret's value is a non-empty string",
                              field=field_name)
    exec_size(value, field_name)  # it becomes a job's environment variable
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
        if not isinstance(target, str) or not ENV_KEY_RE.fullmatch(target):
            raise InvalidArgument(f"secrets: {target!r} is not a valid variable name",
                                  field="secrets")
        if "name" in item and (not isinstance(item["name"], str)
                               or not ENV_KEY_RE.fullmatch(item["name"])):
            raise InvalidArgument(f"secrets: {item['name']!r} is not a secret name",
                                  field="secrets")
        if target in env or any(r.env == target for r in refs):
            raise InvalidArgument(f"secrets: {target} is set twice (env or secrets)",
                                  field="secrets")
        refs.append(SecretRef(target, item.get("name"), None if "value" not in item
                              else validate_secret_value(item["value"], "secrets")))
    return refs


def parse_create(body: Any, *, regions: tuple[str, ...],
                 profiles: Mapping[str, Mapping[str, Any]] | None = None) -> CreateRequest:
    """Validate a create body completely before anything is written; `profiles` are the
    daemon's presets, by name."""
    if not isinstance(body, Mapping):
        raise InvalidArgument("body: expected a JSON object", field="body")
    body, profile = with_profile(body, profiles or {})
    unknown = sorted(set(body) - JOB_CREATE_FIELDS)
    if unknown:
        raise InvalidArgument(
            f"{unknown[0]}: unknown field; allowed: {', '.join(sorted(JOB_CREATE_FIELDS))}",
            field=unknown[0],
        )
    name = None if body.get("name") is None else validate_name(body["name"], "name")
    project = None if body.get("project") is None else validate_name(body["project"], "project")
    region = body.get("region")
    if region is not None and region not in regions:
        raise InvalidArgument(
            f"region: {region!r} is not a region of this host; valid: {', '.join(regions)}",
            field="region",
        )
    if region is not None and region != regions[0]:
        check_cluster_fields(body, region)
    else:
        region = None  # this box
    image = image_reference(container_image(body.get("image")))
    command = _string_list(_given(body, "command", []), "command")
    if (command and not command[0]) or (not command and image is None):
        raise InvalidArgument(
            "command: required for a job without an image, e.g. [\"python\", \"train.py\"]",
            field="command",
        )
    args = _string_list(_given(body, "args", []), "args")
    container = image is not None
    checkpoint, checkpoint_volume = job_paths.checkpoint(body.get("checkpoint"))
    volumes = {path: validate_name(ref, "volumes") for path, ref in
               job_paths.volumes(_given(body, "volumes", {})).items()}
    if checkpoint is not None and checkpoint_volume is not None:
        if any(job_paths.overlaps(checkpoint, path) for path in volumes):
            raise InvalidArgument("checkpoint: its path overlaps a volume's", field="checkpoint")
        volumes[checkpoint] = validate_name(checkpoint_volume, "checkpoint.volume")
    elif checkpoint is not None and any(job_paths.overlaps(checkpoint, p) for p in volumes):
        raise InvalidArgument("checkpoint: its path overlaps a volume's; keep it in a volume "
                              'with {"path": P, "volume": NAME}', field="checkpoint")
    workdir = body.get("workdir")
    if workdir is not None and (not isinstance(workdir, str) or not workdir.startswith("/")
                                or ".." in workdir.split("/") or "\0" in workdir):
        raise InvalidArgument("workdir: expected an absolute path without '..'",
                              field="workdir")
    retries = _given(body, "retries", 0)
    if isinstance(retries, bool) or not isinstance(retries, int) or not (
        0 <= retries <= MAX_RETRIES
    ):
        raise InvalidArgument(f"retries: expected an integer from 0 to {MAX_RETRIES}",
                              field="retries")
    env = _env(_given(body, "env", {}))
    check_exec(command, args, env)
    secrets = _secret_refs(_given(body, "secrets", []), env)
    gpu = parse_gpu(body.get("gpu"))
    gang = None
    if (parsed := parse_gang(body.get("distributed"), gpu, bool(command))) is not None:
        gang, gpu = parsed
    indexed = parse_indexed(body.get("completions"), body.get("parallelism"), gang is not None)
    outputs = job_paths.outputs(_given(body, "outputs", {}))
    if indexed is not None:
        check_index_outputs(outputs)
        if gpu is not None:  # the queue reserves what `parallelism` indexes hold at once
            gpu = GpuRequest(gpu.count * indexed.parallelism, gpu.model, gpu.min_memory)
    spec = JobSpec(
        command=command,
        args=args,
        env=env,
        cpu_m=1000 if body.get("cpu") is None else parse_cpu(body["cpu"]),
        memory=None if body.get("memory") is None else _memory(body["memory"]),
        disk=None if body.get("disk") is None else _disk(body["disk"]),
        workdir=workdir,
        timeout=None if body.get("timeout") is None else parse_duration(body["timeout"],
                                                                           "timeout"),
        retries=retries,
        secrets=[ref.env for ref in secrets],
        outputs=outputs,
        checkpoint=checkpoint,
        volumes=volumes,
        source=_source(body.get("source"), body.get("allow_large_source", False)),
        image=image,
        network=container_network(body.get("network"), container),
        gpu=gpu,
        priority=_priority(body.get("priority", 0)),
        max_cost=parse_max_cost(body.get("max_cost")),
        interruptible=_flag(body.get("interruptible"), "interruptible"),
        ephemeral=_flag(body.get("ephemeral"), "ephemeral"),
        expected_duration=None if body.get("expected_duration") is None else parse_duration(
            body["expected_duration"], "expected_duration"),
        profile=profile,
        gang=gang,
        indexed=indexed,
        region=region,
        after=parse_after(body.get("after")),
    )
    return CreateRequest(spec=spec, name=name, project=project,
                         labels=_labels(_given(body, "labels", {})), secrets=secrets)


# What a job in a cluster region (a Slurm runtime: regions other than this box's) may not
# ask for yet, and why: the runtime protocol speaks for all of it on this box only.
CLUSTER_REFUSED = {
    "image": "no container runtime of a Slurm cluster is supported; run the command on the "
             "nodes (drop image) or use this box's region",
    "volumes": "volumes live on this box; use paths in the workspace (its outputs come back)",
    "checkpoint": "a checkpoint path is kept on this box; write it in the workspace",
    "disk": "a job directory's size is reserved on this box only",
    "max_cost": "a job's cost is metered from this box's GPUs; a cluster's time is Slurm's "
                "to account",
}


def check_cluster_fields(body: Mapping[str, Any], region: str) -> None:
    """Refuse, naming the field and the region, what a cluster region cannot run."""
    for key, why in CLUSTER_REFUSED.items():
        if body.get(key) not in (None, {}, []):
            raise Unsupported(key, message=f"{key}: not in region {region!r} (a Slurm "
                                           f"cluster): {why}")
    distributed = body.get("distributed")
    if isinstance(distributed, Mapping) and distributed.get("transport") not in (None, "auto"):
        # The transports are one host's NCCL settings; across nodes NCCL picks the fabric.
        raise Unsupported("distributed.transport", message=f"distributed.transport: not in "
                          f"region {region!r} (a Slurm cluster): NCCL picks the nodes' "
                          f"fabric there; leave it auto")
    gpu = parse_gpu(body.get("gpu"))
    if gpu is not None and gpu.min_memory is not None:
        raise Unsupported("gpu", message=f"gpu: a GPU's memory cannot be asked for in region "
                          f"{region!r} (a Slurm cluster): name a GPU model, whose gres type "
                          f"the region's gpu_types maps")


def _given(body: Mapping[str, Any], key: str, absent: Any) -> Any:
    """BODY's KEY, or ABSENT when it is left out or null. Only those: an empty string or a
    false is a value of the wrong type, refused by the field's own check, never taken for
    an empty list or a zero."""
    value = body.get(key)
    return absent if value is None else value


# Docker's reference grammar (github.com/distribution/reference), ASCII only:
# [domain[:port]/]path-component[/path-component]...[:tag][@algorithm:hex].
_ALNUM = r"[a-z0-9]+"
_PATH_COMPONENT = rf"{_ALNUM}(?:(?:[._]|__|-+){_ALNUM})*"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = (rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:]+\])"
           r"(?::[0-9]+)?")
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
IMAGE_REFERENCE_RE = re.compile(
    rf"(?P<name>(?:{_DOMAIN}/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    rf"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@{_DIGEST})?", re.ASCII)
MAX_IMAGE_NAME = 255  # characters of the name without tag and digest, as docker's


def image_reference(image: str | None) -> str | None:
    """IMAGE when docker would take it as a reference; "NaN" or "Python:3" would only end
    the job StartFailed later."""
    if image is None:
        return None
    match = IMAGE_REFERENCE_RE.fullmatch(image)
    if match is None or len(match.group("name")) > MAX_IMAGE_NAME:
        raise InvalidArgument(
            f"image: {image[:80]!r} is not a docker image reference; use lowercase "
            "[registry/]name[:tag][@sha256:digest], e.g. \"python:3.11\" or "
            "\"ghcr.io/org/train:v2\"", field="image")
    return image


MAX_PRIORITY = 1000


def _flag(value: Any, field_name: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidArgument(f"{field_name}: expected true or false", field=field_name)
    return value


MIN_MEMORY = 6 * 2**20  # docker's least; a process cannot start with less


def _memory(value: Any) -> int:
    size = parse_size(value, "memory")
    if size < MIN_MEMORY:
        raise InvalidArgument(f"memory: {fmt_bytes(size)} is too little to start a process; "
                              "give at least 6MiB, e.g. 512MiB or 4GiB", field="memory")
    return size


def _disk(value: Any) -> int:
    size = parse_size(value, "disk")
    if size < 2**20:
        raise InvalidArgument("disk: at least 1MiB (a bare number is bytes; write 50G)",
                              field="disk")
    return size


def parse_max_cost(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e12:
        raise InvalidArgument("max_cost: expected a positive number (the config's currency)",
                              field="max_cost")
    return float(value)


def _priority(value: Any) -> int:
    """-1000 to 1000; how high an ordinary user may go is the daemon's setting."""
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_PRIORITY:
        raise InvalidArgument(f"priority: expected an integer from -{MAX_PRIORITY} to "
                              f"{MAX_PRIORITY}", field="priority")
    return value


SHA256_RE = re.compile(r"[0-9a-f]{64}\Z")


def _source(value: Any, allow_large: Any) -> str | None:
    """{"sha256": ...} of a source the caller uploaded (the SDK and CLI pack and upload a
    path first); returns the sha256."""
    if not isinstance(allow_large, bool):
        raise InvalidArgument("allow_large_source: expected true or false",
                              field="allow_large_source")
    if value is None:
        if allow_large:
            raise InvalidArgument("allow_large_source: only means something with a source",
                                  field="allow_large_source")
        return None
    if isinstance(value, str):
        raise InvalidArgument("source: upload it first and pass {\"sha256\": ...} (the SDK "
                              "and `job run --upload` do that for you)", field="source")
    if (not isinstance(value, Mapping) or set(value) != {"sha256"}
            or not isinstance(value["sha256"], str) or not SHA256_RE.fullmatch(value["sha256"])):
        raise InvalidArgument('source: expected {"sha256": "<64 hex digits>"}',
                              field="source")
    return value["sha256"]
