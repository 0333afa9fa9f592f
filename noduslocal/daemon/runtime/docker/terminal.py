"""`job exec -it` for container jobs: `docker exec` with a TTY and stdin, as the job's
owner in its workdir, its raw stream relayed (a TTY's output is not multiplexed), the
window's size passed to dockerd, killed through its host pid when the client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import Any

import docker
import docker.errors

from noduslocal.daemon.runtime.docker.execute import kill_in_container
from noduslocal.domain import errors

READ = 64 * 1024


def _create(client: docker.DockerClient, container_id: str, command: list[str], user: str,
            workdir: str | None) -> str:
    try:
        created = client.api.exec_create(container_id, command, stdin=True, tty=True,
                                         user=user, workdir=workdir,
                                         environment={"TERM": "xterm"})
    except docker.errors.NotFound:
        raise errors.Conflict("the job's container has just ended") from None
    except docker.errors.APIError as exc:
        raise errors.Conflict(f"docker exec failed: {exc.explanation or exc}") from None
    return str(created["Id"])


def _attach(client: docker.DockerClient, exec_id: str) -> socket.socket:
    try:
        raw = client.api.exec_start(exec_id, tty=True, socket=True)
    except docker.errors.APIError as exc:
        raise errors.Conflict(f"docker exec failed: {exc.explanation or exc}") from None
    sock: socket.socket = getattr(raw, "_sock", raw)  # docker-py's SocketIO wraps it
    sock.setblocking(False)
    return sock


class DockerTerminal:
    def __init__(self, call: Any, client: docker.DockerClient, container_id: str,
                 exec_id: str, sock: socket.socket) -> None:
        self.call = call  # runs a blocking docker-py call in the runtime's pool
        self.client = client
        self.container_id = container_id
        self.exec_id = exec_id
        self.sock = sock
        self._loop = asyncio.get_running_loop()

    @classmethod
    async def start(cls, call: Any, client: docker.DockerClient, container_id: str,
                    command: list[str], user: str, workdir: str | None, rows: int,
                    cols: int) -> DockerTerminal:
        exec_id = await call(_create, client, container_id, command, user, workdir,
                             exec_=True)
        sock = await call(_attach, client, exec_id, exec_=True)
        terminal = cls(call, client, container_id, exec_id, sock)
        await terminal.resize(rows, cols)
        return terminal

    async def read(self) -> bytes:
        try:
            return await self._loop.sock_recv(self.sock, READ)
        except OSError:
            return b""

    async def write(self, data: bytes) -> None:
        with contextlib.suppress(OSError):
            await self._loop.sock_sendall(self.sock, data)

    async def resize(self, rows: int, cols: int) -> None:
        with contextlib.suppress(docker.errors.APIError):
            await self.call(self.client.api.exec_resize, self.exec_id, rows, cols,
                            exec_=True)

    async def wait(self) -> int:
        for _ in range(100):  # the stream ends a moment before dockerd records the code
            info = await self.call(self.client.api.exec_inspect, self.exec_id, exec_=True)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(0.05)
        return -1

    async def close(self) -> None:
        with contextlib.suppress(docker.errors.APIError):
            info = await self.call(self.client.api.exec_inspect, self.exec_id, exec_=True)
            if info.get("Running") and info.get("Pid"):
                kill_in_container(int(info["Pid"]), self.container_id)
        with contextlib.suppress(OSError):
            self.sock.close()
