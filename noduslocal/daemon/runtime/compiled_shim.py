"""The compiled shim (shim.c): found beside the package, where scripts/test.sh and
install.sh build it, else built once into the data dir when a C compiler is there; run as
`--serve` it is the spawner, and requests reach it framed as encode_request() makes them.
Without it the Python spawner forks the Python shim, which speaks the same protocol.

    python -m noduslocal.daemon.runtime.compiled_shim        builds it beside the package
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

from noduslocal.daemon.runtime.shim import MAX_LOG

log = logging.getLogger(__name__)
SOURCE = Path(__file__).with_name("shim.c")
PACKAGE_BIN = Path(__file__).with_name("bin")
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror"]


def binary_name() -> str:
    """Named after its source's hash: a binary from another version is never run."""
    return f"nodus-shim-{hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]}"


def _trusted(path: Path) -> bool:
    """Ours to run as root: a regular executable owned by us (or root) that nobody else
    may change, in a directory nobody else may change."""
    try:
        for item in (path, path.parent):
            info = item.lstat()
            if info.st_uid not in (0, os.geteuid()) or info.st_mode & (stat.S_IWGRP |
                                                                      stat.S_IWOTH):
                return False
        return stat.S_ISREG(path.lstat().st_mode) and os.access(path, os.X_OK)
    except OSError:
        return False


def build(directory: Path) -> Path | None:
    """Compile the shim into `directory`; None (and why, logged) when it cannot be."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler: host jobs use the Python shim (about 2 ms more CPU "
                    "each); install gcc for the compiled one")
        return None
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    target = directory / binary_name()
    tmp = directory / f".{target.name}.{os.getpid()}"
    # Static where libc.a is there (libc6-dev): no dynamic loading at each job's start.
    for flags in (["-static"], []):
        done = subprocess.run([compiler, *CFLAGS, *flags, "-o", str(tmp), str(SOURCE)],
                              capture_output=True, text=True)
        if done.returncode == 0:
            break
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        log.warning("building the compiled shim failed, host jobs use the Python shim: %s",
                    (done.stderr.strip().splitlines() or ["?"])[-1])
        return None
    os.chmod(tmp, 0o755)
    os.replace(tmp, target)
    return target


def find(data_dir: Path) -> Path | None:
    """The compiled shim to use, built into the data dir if none is found."""
    for directory in (PACKAGE_BIN, data_dir / "bin"):
        if _trusted(candidate := directory / binary_name()):
            return candidate
    built = build(data_dir / "bin")
    return built if built is not None and _trusted(built) else None


def encode_request(req: dict[str, Any], req_id: int) -> bytes:
    """A request as the compiled spawner reads it: a 4-byte length, then NUL-terminated
    fields, lists preceded by their length. It goes through a pipe, never argv: secrets
    would be visible to every user in /proc/PID/cmdline."""
    fields: list[str] = ["NODUS3", str(req_id), req["dir"], req["cwd"]]
    uid = req.get("uid")
    fields += ["" if uid is None else str(uid), str(req.get("gid") or 0)]
    groups = [str(g) for g in (req.get("groups") or [req.get("gid") or 0])]
    env = [f"{k}={v}" for k, v in req["env"].items()]
    mask = [m for m in req.get("mask", ()) if m]
    for items in (groups, list(req["argv"]), env, mask):
        fields += [str(len(items)), *items]
    cgroups = list(req.get("cgroups") or ())
    fields += [req["boot_id"], str(req.get("max_log", MAX_LOG)), str(len(cgroups)), *cgroups]
    # The mount namespace (none without mounts): source and target of each, in order.
    mounts = [part for pair in req.get("mounts") or () for part in pair]
    hide = list(req.get("hide") or ())
    fields += [str(len(mounts)), *mounts, str(len(hide)), *hide, req.get("hide_with") or "",
               "1" if req.get("no_new_privs") else "0", str(req.get("hold") or 0),
               req.get("mark") or ""]
    body = "\0".join(fields).encode() + b"\0"  # one join: a generator cost 70 calls a task
    return len(body).to_bytes(4, "little") + body


if __name__ == "__main__":
    made = build(PACKAGE_BIN)
    if made is None:
        sys.exit("noduslocal: the compiled shim could not be built (see above)")
    print(made)
