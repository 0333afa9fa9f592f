"""Validation of what users send: names, labels, environments, secrets, and the whole
body of a job create, refused completely (one line naming the field) before anything is
written.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from noduslocal.errors import InvalidArgument, Unsupported
from noduslocal.models import CreateRequest, JobSpec, SecretRef
from noduslocal.units import parse_cpu, parse_duration, parse_size
from noduslocal.workspace import components

NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_KEY_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")
MAX_RETRIES = 100
OUTPUT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)*$")

# The keyword arguments of the reference `Job.create`, plus `retries` (the CLI's
# `--retries`, which the reference has on `super job run` only).
SUPPORTED_FIELDS = frozenset(
    {"name", "project", "command", "args", "cpu", "memory", "env", "workdir", "timeout",
     "region", "labels", "retries", "secrets", "outputs", "checkpoint", "volumes", "source",
     "allow_large_source"}
)
# Accepted only at their default meaning until the issue that builds them lands; any other
# value raises Unsupported naming the field. The value is the set of values that mean
# "not used".
NOT_YET_FIELDS: dict[str, tuple[Any, ...]] = {
    "image": (None,),
    "gpu": (None, 0),
    "disk": (None,),
    "network": (None,),
    "expected_duration": (None,),
    "interruptible": (None, False),
    "profile": (None,),
    "max_cost": (None,),
    "completions": (None, 1),
    "parallelism": (None, 1),
    "distributed": (None,),
}
JOB_CREATE_FIELDS = SUPPORTED_FIELDS | frozenset(NOT_YET_FIELDS)

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
        outputs=_outputs(body.get("outputs") or {}),
        checkpoint=_checkpoint(body.get("checkpoint")),
        volumes=_volumes(body.get("volumes") or {}),
        source=_source(body.get("source"), body.get("allow_large_source", False)),
    )
    return CreateRequest(spec=spec, name=name, project=project,
                         labels=_labels(body.get("labels") or {}), secrets=secrets)


def _outputs(value: Any) -> dict[str, str]:
    """{name: path}; a host job's outputs are files or directories of its workspace,
    named relative to it or under /workspace, as a container sees it."""
    if not isinstance(value, Mapping):
        raise InvalidArgument("outputs: expected a mapping of name to path", field="outputs")
    outputs: dict[str, str] = {}
    for name, path in value.items():
        if (not isinstance(name, str) or len(name) > 128 or not OUTPUT_NAME_RE.match(name)
                or ".." in name.split("/")):
            raise InvalidArgument(
                f"outputs: {name!r} is not an output name; use letters, digits, '_', '.', "
                "'-' and '/' between parts", field="outputs")
        if not isinstance(path, str):
            raise InvalidArgument(f"outputs: the path of {name} must be a string",
                                  field="outputs")
        if path.startswith("/") and not (path == "/workspace"
                                         or path.startswith("/workspace/")):
            raise InvalidArgument(
                f"outputs: {name} = {path!r}: a host job's outputs are collected from its "
                "workspace; use a path under /workspace or relative to it", field="outputs")
        try:
            parts = components(path)
        except InvalidArgument:
            raise InvalidArgument(f"outputs: {name} = {path!r} may not contain '..'",
                                  field="outputs") from None
        if not parts:
            raise InvalidArgument(f"outputs: {name} names the whole workspace; name a file "
                                  "or directory in it", field="outputs")
        outputs[name] = "/".join(parts)
    return outputs


def _checkpoint(value: Any) -> str | None:
    """A host job's checkpoint directory: a path under /workspace (or relative to it), made
    before the first attempt and kept, with the workspace, across every attempt."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        if "volume" in value:
            raise Unsupported("checkpoint.volume", "volumes come with the containers release")
        if set(value) != {"path"}:
            raise InvalidArgument('checkpoint: expected a path or {"path": ...}',
                                  field="checkpoint")
        value = value["path"]
    if not isinstance(value, str):
        raise InvalidArgument("checkpoint: expected a path", field="checkpoint")
    if value.startswith("/") and not (value == "/workspace" or value.startswith("/workspace/")):
        raise InvalidArgument(
            f"checkpoint: {value!r}: a host job keeps its checkpoint in its workspace; use a "
            "path under /workspace (NODUS_CHECKPOINT_DIR names it)", field="checkpoint")
    try:
        parts = components(value)
    except InvalidArgument:
        raise InvalidArgument("checkpoint: may not contain '..'", field="checkpoint") from None
    if not parts:
        raise InvalidArgument("checkpoint: name a directory inside the workspace",
                              field="checkpoint")
    return "/".join(parts)


def workspace_path(value: Any, field_name: str, what: str) -> str:
    """A path a host job sees in its workspace: under /workspace or relative to it."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field_name}: expected a path", field=field_name)
    if value.startswith("/") and not (value == "/workspace" or value.startswith("/workspace/")):
        raise InvalidArgument(
            f"{field_name}: {value!r}: a host job sees its {what} in its workspace; use a "
            "path under /workspace", field=field_name)
    try:
        parts = components(value)
    except InvalidArgument:
        raise InvalidArgument(f"{field_name}: may not contain '..'", field=field_name) from None
    if not parts:
        raise InvalidArgument(f"{field_name}: name a directory inside the workspace",
                              field=field_name)
    return "/".join(parts)


def _volumes(value: Any) -> dict[str, str]:
    """{mount path: volume name or {"name": ...}} -> {workspace-relative path: name}."""
    if not isinstance(value, Mapping):
        raise InvalidArgument("volumes: expected a mapping of mount path to volume name",
                              field="volumes")
    volumes: dict[str, str] = {}
    for path, ref in value.items():
        if isinstance(ref, Mapping):
            if set(ref) != {"name"}:
                raise InvalidArgument('volumes: each entry is a name or {"name": ...}',
                                      field="volumes")
            ref = ref["name"]
        name = validate_name(ref, "volumes")
        rel = workspace_path(path, "volumes", "volumes")
        if any(rel == other or rel.startswith(other + "/") or other.startswith(rel + "/")
               for other in volumes):
            raise InvalidArgument(f"volumes: {path!r} overlaps another mount", field="volumes")
        volumes[rel] = name
    return volumes


SHA256_RE = re.compile(r"^[0-9a-f]{64}$")


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
            or not isinstance(value["sha256"], str) or not SHA256_RE.match(value["sha256"])):
        raise InvalidArgument('source: expected {"sha256": "<64 hex digits>"}',
                              field="source")
    return value["sha256"]
