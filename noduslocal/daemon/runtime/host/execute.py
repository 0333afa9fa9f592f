"""`job exec` for host-process jobs: a command run to completion beside a running job, with
the job's environment (secrets masked in what comes back), in its mount namespace and
workdir, as its owner; each one recorded while it runs, so that the next daemon kills it if
this one dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from noduslocal.daemon.runtime import shim
from noduslocal.daemon.runtime.attempt_dir import read_pid
from noduslocal.daemon.runtime.base import ExecResult
from noduslocal.daemon.runtime.exec_output import supervise
from noduslocal.domain import errors

log = logging.getLogger(__name__)
RECORD = "exec-{token}.json"  # in the runtime's records directory while the exec runs
TOKEN_ENV = "NODUS_EXEC_ID"  # in the exec's environment, and so in all it starts


async def run_in_job(launch: dict[str, Any], command: list[str], timeout: float,
                     records: Path) -> ExecResult:
    """`launch` is the job's launch request (shim_request.launch_request): env, cwd, identity;
    `records`: where the exec is named while it runs (kill_orphaned_execs)."""
    argv, cwd, kwargs = exec_argv(launch, command)
    # Recorded before it is spawned: a daemon killed at any moment after the fork leaves
    # a record that names the exec's processes by the token in their environment.
    token = uuid.uuid4().hex
    record = _record(records, token)
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, env={**launch["env"], TOKEN_ENV: token}, cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, start_new_session=True, **kwargs)
    except OSError as exc:
        _forget(record)
        code = 127 if isinstance(exc, FileNotFoundError) else 126
        return ExecResult(code, "", f"noduslocal: cannot execute {command[0]!r}: "
                                    f"{exc.strerror}\n", False)
    try:
        return await supervise(proc, launch.get("mask", ()), timeout)
    finally:
        # Kept while the exec may still run (a cancelled call): should this daemon die,
        # the next one kills it.
        if proc.returncode is not None:
            _forget(record)


def exec_argv(launch: dict[str, Any], command: list[str]
              ) -> tuple[list[str], str | None, dict[str, Any]]:
    """How to run COMMAND beside the job whose launch request is LAUNCH: the argv, the cwd
    and subprocess's identity arguments."""
    as_owner = launch.get("uid") is not None and launch["uid"] != os.getuid()
    if launch.get("mounts") or launch.get("cgroups") or as_owner:
        # By the Python shim, as root: into the rank's cgroups, then the job's mount
        # namespace and its root (a chroot the shim made) where it has one; it drops to
        # the owner before it runs anything found in there, enters the workdir and searches
        # PATH with the owner's rights.
        return ([sys.executable, "-I", "-S", shim.__file__, "--exec-in",
                 json.dumps(_entry(launch, command))], None, {})
    return list(command), launch["cwd"], {}


def open_record(records: Path) -> tuple[str, Path | None]:
    """A new exec's token and its record (see run_in_job), before it is spawned."""
    token = uuid.uuid4().hex
    return token, _record(records, token)


def forget_record(record: Path | None) -> None:
    _forget(record)


def has_own_namespace(directory: Path) -> bool:
    """Whether the rank's job (pid.json's) runs in a mount namespace other than ours."""
    pid = read_pid(directory)
    try:
        return pid is not None and (os.readlink(f"/proc/{pid['pid']}/ns/mnt")
                                    != os.readlink("/proc/self/ns/mnt"))
    except OSError:
        return False  # gone: _enter says so


def _entry(launch: dict[str, Any], command: list[str]) -> dict[str, Any]:
    """What shim.exec_in needs: the rank's job (its main process, named by pid.json while
    it is the process that started then), the owner, the workdir and the command."""
    pid = read_pid(Path(launch["dir"]))
    if pid is None or shim.start_ticks(pid["pid"]) != pid.get("start_ticks"):
        raise errors.Conflict("the job's process has ended; nothing to exec beside")
    if not launch.get("mounts"):  # no namespace of its own to enter: the host's paths
        pid = {"pid": None, "start_ticks": None}
    return {"pid": pid["pid"], "start_ticks": pid["start_ticks"], "uid": launch.get("uid"),
            "gid": launch.get("gid"), "groups": launch.get("groups"),
            "no_new_privs": bool(launch.get("no_new_privs")), "cwd": launch["cwd"],
            "argv": command, "cgroups": launch.get("cgroups") or []}


@cache
def _daemon() -> tuple[int, int | None]:
    """This process and when it started: told apart from a later one with its pid."""
    return os.getpid(), shim.start_ticks(os.getpid())


def _record(directory: Path, token: str) -> Path | None:
    """Name the exec and this daemon: if the daemon died (kill -9) while it ran, nothing
    else would stop it past its timeout, and its caller died with the daemon. None when
    it could not be written: this daemon still supervises the exec."""
    pid, ticks = _daemon()
    path = directory / RECORD.format(token=token)
    try:
        shim.write_json_atomic(str(directory), path.name, {
            "token": token, "boot_id": shim.boot_id(), "daemon_pid": pid,
            "daemon_ticks": ticks})
    except OSError:
        log.warning("recording an exec in %s failed", directory, exc_info=True)
        return None
    return path


def _forget(record: Path | None) -> None:
    if record is not None:
        record.unlink(missing_ok=True)


def kill_orphaned_execs(directory: Path) -> int:
    """SIGKILL every process of the execs recorded in `directory` whose daemon is gone,
    whether or not their job still runs: each carries its exec's token in its environment
    (one that cleared its environment is not found); returns how many processes. Execs of
    a live daemon, and those recorded before a reboot, are left alone (or gone)."""
    tokens: set[bytes] = set()
    done: list[Path] = []
    for path in directory.glob(RECORD.format(token="*")):
        try:
            rec = json.loads(path.read_bytes())
            token, boot = str(rec["token"]), rec.get("boot_id")
            alive = shim.start_ticks(int(rec["daemon_pid"])) == rec.get("daemon_ticks")
        except (OSError, ValueError, KeyError, TypeError):
            # Renamed in whole, so only a power loss tears one: its exec is gone.
            token, boot, alive = "", None, False
        if alive:
            continue  # its daemon lives (this one): it ends the exec itself
        if token and boot == shim.boot_id():
            tokens.add(f"{TOKEN_ENV}={token}".encode())
        done.append(path)
    killed: set[int] = set()
    # Only after a crash with execs running: a look at every process, again while the
    # last look found new ones (one may have forked before it was killed).
    for _ in range(10 if tokens else 0):
        found = set(_carrying(tokens))
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if found <= killed:
            break
        killed |= found
    for path in done:
        path.unlink(missing_ok=True)
    return len(killed)


def _carrying(tokens: set[bytes]) -> list[int]:
    """Live processes with one of `tokens` in their environment."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes().split(b"\0")
            state = Path(entry.path, "stat").read_bytes().rpartition(b")")[2].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile, or a kernel thread
        if state not in (b"Z", b"X") and tokens.intersection(environ):
            found.append(int(entry.name))
    return found
