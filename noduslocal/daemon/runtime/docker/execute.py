"""`job exec` for container jobs: docker exec as the job's owner in its workdir (the
container's environment, secrets included, is already there), output capped and masked,
killed through its host pid when it outlives its timeout.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import docker
import docker.errors

from noduslocal.daemon.runtime.base import OUTPUT_LIMIT, ExecResult
from noduslocal.daemon.runtime.shim import Masker
from noduslocal.domain import errors


def _start(client: docker.DockerClient, container_id: str, command: list[str], user: str,
           workdir: str | None) -> str:
    try:
        created = client.api.exec_create(container_id, command, stdout=True, stderr=True,
                                         user=user, workdir=workdir)
    except docker.errors.NotFound:
        raise errors.Conflict("the job's container has just ended") from None
    except docker.errors.APIError as exc:
        raise errors.Conflict(f"docker exec failed: {exc.explanation or exc}") from None
    return str(created["Id"])


def _collect(client: docker.DockerClient, exec_id: str, keep: int) -> tuple[bytes, bytes, bool]:
    # The container may end between the exec's create and its start: dockerd then says
    # "is not running", or has dropped the exec. As at the create: the job's end.
    try:
        stream = client.api.exec_start(exec_id, stream=True, demux=True)
    except docker.errors.NotFound:
        raise errors.Conflict("the job's container has just ended") from None
    except docker.errors.APIError as exc:
        raise errors.Conflict(f"docker exec failed: {exc.explanation or exc}") from None
    out, err, more = bytearray(), bytearray(), False
    for stdout, stderr in stream:
        for buffer, chunk in ((out, stdout), (err, stderr)):
            if chunk:
                room = keep - len(buffer)
                buffer += chunk[:max(room, 0)]
                more = more or len(chunk) > room
    return bytes(out), bytes(err), more


async def exec_in_container(call: Any, client: docker.DockerClient, container_id: str,
                            command: list[str], user: str, workdir: str | None,
                            mask: list[str], timeout: float) -> ExecResult:
    """`call` runs a blocking function in the container runtime's thread pool."""
    exec_id = await call(_start, client, container_id, command, user, workdir, exec_=True)
    masks = [m.encode() for m in mask if m]
    keep = OUTPUT_LIMIT + max((len(m) for m in masks), default=0)
    try:
        out, err, more = await asyncio.wait_for(
            call(_collect, client, exec_id, keep, exec_=True), timeout)
    except TimeoutError:
        info = await call(client.api.exec_inspect, exec_id)
        if info.get("Running") and info.get("Pid"):
            kill_in_container(int(info["Pid"]), container_id)
        raise errors.WaitTimeout(f"the command did not end within {timeout:g}s; "
                                 "it was killed") from None
    info = await call(client.api.exec_inspect, exec_id)
    code = info.get("ExitCode")
    return ExecResult(
        code if isinstance(code, int) else -1,
        Masker(masks).feed(out, final=True)[:OUTPUT_LIMIT].decode("utf-8", "replace"),
        Masker(masks).feed(err, final=True)[:OUTPUT_LIMIT].decode("utf-8", "replace"),
        more or len(out) > OUTPUT_LIMIT or len(err) > OUTPUT_LIMIT)


def kill_in_container(pid: int, container_id: str) -> None:
    """SIGKILL the exec's process, through a pidfd so a pid reused meanwhile is never hit,
    and only while its cgroup names the container."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        with open(f"/proc/{pid}/cgroup") as file:
            if container_id not in file.read():
                return
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)
