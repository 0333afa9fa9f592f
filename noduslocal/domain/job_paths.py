"""Paths a job names for its outputs, checkpoint and volumes, validated the same for both
runtimes: a checkpoint and volumes are absolute paths of the job's world (a container's, or
a host job's mount namespace), relative ones under /workspace, which is the workspace.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from noduslocal.domain.errors import InvalidArgument

CONTAINER_ROOT = "/workspace"  # the same paths work for jobs that see it mounted there
PATH_MAX = 4095  # bytes of a path, and of one name in it (Linux)
NAME_MAX = 255
OUTPUT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*(/[A-Za-z0-9_.-]+)*$")
# Paths a mount may not cover: the kernel's, and those docker manages in a container.
RESERVED = ("/proc", "/sys", "/dev", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf")


def components(path: str) -> list[str]:
    """The workspace-relative parts of PATH ('', '.', 'a/b', '/workspace/a/b')."""
    if path == CONTAINER_ROOT or path.startswith(CONTAINER_ROOT + "/"):
        path = path[len(CONTAINER_ROOT):]
    if len(path.encode(errors="replace")) > PATH_MAX:
        raise InvalidArgument(f"path: longer than {PATH_MAX} bytes", field="path")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if any(len(part.encode(errors="replace")) > NAME_MAX for part in parts):
        raise InvalidArgument(f"path: a name longer than {NAME_MAX} bytes",
                                     field="path")
    if ".." in parts:
        raise InvalidArgument(f"path: {path!r} may not contain '..'", field="path")
    if any("\0" in part for part in parts):
        raise InvalidArgument("path: may not contain NUL", field="path")
    return parts


def _relative(value: str, field_name: str) -> str:
    try:
        parts = components(value)
    except InvalidArgument:
        raise InvalidArgument(f"{field_name}: may not contain '..'", field=field_name) from None
    if not parts:
        raise InvalidArgument(f"{field_name}: name a directory inside the workspace",
                              field=field_name)
    return "/".join(parts)


def container_path(value: Any, field_name: str) -> str:
    """An absolute, normalised path in the job's world; relative means under /workspace."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{field_name}: expected a path", field=field_name)
    if not value.startswith("/"):
        return f"{CONTAINER_ROOT}/{_relative(value, field_name)}"
    parts = [part for part in value.split("/") if part not in ("", ".")]
    if ".." in parts or any("\0" in part for part in parts):
        raise InvalidArgument(f"{field_name}: {value!r} may not contain '..' or NUL",
                              field=field_name)
    path = "/" + "/".join(parts)
    if path in ("/", CONTAINER_ROOT):
        raise InvalidArgument(f"{field_name}: {value!r} would cover the "
                              f"{'whole file system' if path == '/' else 'workspace'}; name a "
                              "directory of its own", field=field_name)
    if any(path == r or path.startswith(r + "/") for r in RESERVED):
        raise InvalidArgument(f"{field_name}: {value!r} may not be covered (not under "
                              f"{', '.join(RESERVED)}); pick another path", field=field_name)
    return path


def stored(path: str) -> str:
    """A checkpoint or volume path as a spec keeps it: a host job's of an older daemon was
    workspace-relative, and means the same under /workspace."""
    return path if path.startswith("/") else f"{CONTAINER_ROOT}/{path}"


def in_workspace(path: str) -> str | None:
    """The workspace-relative part of a container path under /workspace, else None."""
    if path.startswith(CONTAINER_ROOT + "/"):
        return path[len(CONTAINER_ROOT) + 1:]
    return None


def outputs(value: Any) -> dict[str, str]:
    """{name: path}; outputs are files or directories of the job's workspace (for either
    runtime), named relative to it or under /workspace."""
    if not isinstance(value, Mapping):
        raise InvalidArgument("outputs: expected a mapping of name to path", field="outputs")
    result: dict[str, str] = {}
    for name, path in value.items():
        if (not isinstance(name, str) or len(name) > 128 or not OUTPUT_NAME_RE.fullmatch(name)
                or ".." in name.split("/")):
            raise InvalidArgument(
                f"outputs: {name!r} is not an output name; use letters, digits, '_', '.', "
                "'-' and '/' between parts", field="outputs")
        if not isinstance(path, str):
            raise InvalidArgument(f"outputs: the path of {name} must be a string",
                                  field="outputs")
        if path.startswith("/") and not (path == CONTAINER_ROOT
                                         or path.startswith(CONTAINER_ROOT + "/")):
            raise InvalidArgument(
                f"outputs: {name} = {path!r}: outputs are collected from the job's "
                "workspace; use a path under /workspace or relative to it", field="outputs")
        try:
            parts = components(path)
        except InvalidArgument:
            raise InvalidArgument(f"outputs: {name} = {path!r} may not contain '..'",
                                  field="outputs") from None
        if not parts:
            raise InvalidArgument(f"outputs: {name} names the whole workspace; name a "
                                  "file or directory in it", field="outputs")
        result[name] = "/".join(parts)
    return result


def checkpoint(value: Any) -> tuple[str | None, Any]:
    """(path, volume as given): "/ckpt", or {"path": "/ckpt"} or {"path": ..., "volume":
    NAME} to keep it in a volume. Kept across every attempt of the job."""
    if value is None:
        return None, None
    volume = None
    if isinstance(value, Mapping):
        if "path" not in value or set(value) - {"path", "volume"}:
            raise InvalidArgument('checkpoint: expected a path or {"path": P, "volume": V}',
                                  field="checkpoint")
        volume = value.get("volume")
        value = value["path"]
    return container_path(value, "checkpoint"), volume


def volumes(value: Any) -> dict[str, Any]:
    """{mount path: volume name or {"name": ...}} -> {path: name as given}; the paths as
    for `checkpoint`."""
    if not isinstance(value, Mapping):
        raise InvalidArgument("volumes: expected a mapping of mount path to volume name",
                              field="volumes")
    result: dict[str, str] = {}
    for path, ref in value.items():
        if isinstance(ref, Mapping):
            if set(ref) != {"name"}:
                raise InvalidArgument('volumes: each entry is a name or {"name": ...}',
                                      field="volumes")
            ref = ref["name"]
        key = container_path(path, "volumes")
        if any(overlaps(key, other) for other in result):
            raise InvalidArgument(f"volumes: {path!r} overlaps another mount", field="volumes")
        result[key] = ref
    return result


def overlaps(a: str, b: str) -> bool:
    return a == b or a.startswith(b.rstrip("/") + "/") or b.startswith(a.rstrip("/") + "/")
