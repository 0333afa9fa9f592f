"""The docker runtime: creates and starts an attempt's container, pumps its logs into the
attempt directory, learns its end from dockerd's events, records exit code and OOM before
removing it, and finds this daemon's containers again after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from noduslocal.models import parse_iso
from noduslocal.runtime.attempts import Alive, AttemptState, Exited, NeverStarted, Vanished
from noduslocal.runtime.container_logs import pump_logs
from noduslocal.runtime.container_spec import LABEL, job_filter
from noduslocal.runtime.docker_link import DockerLink

log = logging.getLogger(__name__)
T = TypeVar("T")
PUMP_DRAIN = 10.0  # seconds to wait for the last log lines after a container ended


class DockerUnavailable(RuntimeError):
    pass


class LaunchError(RuntimeError):
    """The container could not be created or started; the message is for the user."""


@dataclass
class Watch:
    container_id: str
    directory: Path
    mask: list[bytes]
    done: asyncio.Future[AttemptState]
    signals_sent: int = 0  # kills we asked dockerd for
    kills_seen: int = 0  # kill events dockerd reported
    ended: bool = False
    pump: threading.Thread | None = None
    closed: threading.Event = field(default_factory=threading.Event)


class ContainerRuntime:
    def __init__(self, docker_host: str | None, instance: str, image_pull: bool,
                 on_availability: Callable[[], None]) -> None:
        self.instance = instance
        self.image_pull = image_pull
        self.available = False
        self.unavailable_reason = "not connected yet"
        self._on_availability = on_availability
        self._watches: dict[str, Watch] = {}
        self._lost_link = False  # the event stream broke since the last connect
        self._tasks: set[asyncio.Task[None]] = set()
        self._pool = ThreadPoolExecutor(16, thread_name_prefix="docker")
        self._link = DockerLink(docker_host, job_filter(instance), self._on_event,
                                self._on_state)

    async def start(self) -> None:
        self._link.start()

    async def close(self) -> None:
        await self._link.close()
        for watch in self._watches.values():
            watch.closed.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def client(self) -> docker.DockerClient:
        if not self.available or self._link.client is None:
            raise DockerUnavailable(self.unavailable_reason)
        return self._link.client

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking docker-py call in the pool. A dropped connection means dockerd
        is going away: container work waits (DockerUnavailable) until the link is back."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)
        except requests.exceptions.ConnectionError as exc:
            if self.available:
                self._on_state(False, f"connection lost: {exc}")
                self._link.reconnect()
            raise DockerUnavailable(str(exc)) from None

    async def wait_available(self) -> None:
        while not self.available:
            await asyncio.sleep(0.2)

    # --- dockerd's state and events ---------------------------------------------------

    def _on_state(self, up: bool, why: str) -> None:
        if up == self.available and (up or why == self.unavailable_reason):
            return
        self.available, self.unavailable_reason = up, why
        if not up:
            self._lost_link = True
        elif self._lost_link:
            self._lost_link = False
            self._spawn(self._recheck_all())
        self._on_availability()

    def _on_event(self, event: dict[str, Any]) -> None:
        watch = self._watches.get(event.get("id", ""))
        if watch is None:
            return
        status = event.get("status") or event.get("Action")
        if status == "kill":
            watch.kills_seen += 1
        elif status == "die":
            self._spawn(self._finish(watch))

    async def _recheck_all(self) -> None:
        """After dockerd was away: a container still running (live-restore) is watched
        again; one that ended meanwhile was ended by dockerd's restart, not by the job."""
        for watch in list(self._watches.values()):
            try:
                attrs = await self.call(self._inspect, watch.container_id)
            except Exception:
                log.exception("inspecting container %s failed", watch.container_id[:12])
                continue
            if attrs is not None and attrs["State"]["Running"]:
                self._start_pump(watch)
                continue
            await self._finish(watch, Vanished("dockerd restarted under it"))

    # --- attempts -----------------------------------------------------------------------

    async def launch(self, image: str, kwargs: dict[str, Any], job_id: int, number: int,
                     directory: Path, mask: list[str]) -> tuple[str, asyncio.Future[AttemptState]]:
        """Create and start the attempt's container; returns its id and a future of its
        end. Raises LaunchError with a message for the user, DockerUnavailable. Before a
        retry, whatever earlier attempts left is removed (a first attempt's container
        left by a crash is found and settled by the reconcile, before any retry)."""
        client = self.client
        if number > 1:
            await self.call(self._remove_job_containers, client, job_id)
        try:
            container = await self.call(self._create, client, image, kwargs)
        except docker.errors.APIError as exc:
            raise LaunchError(f"creating the container failed: {_explain(exc)}") from None
        watch = self._watch(container.id, directory, mask)
        try:
            await self.call(container.start)
        except Exception as exc:
            self._watches.pop(container.id, None)
            with contextlib.suppress(Exception):
                await self.call(lambda: container.remove(force=True))
            if isinstance(exc, docker.errors.APIError):
                raise LaunchError(f"starting the container failed: {_explain(exc)}") from None
            raise
        self._start_pump(watch)
        return container.id, watch.done

    async def adopt(self, job_id: int, number: int, directory: Path, mask: list[str],
                    recorded_running: bool, stopping: bool) -> tuple[AttemptState, str | None]:
        """After a daemon restart: Alive when the attempt's container exists (its end then
        comes from `watched(id)`), else what became of the attempt. `stopping`: we had
        asked it to stop, so kills are ours. Waits for dockerd to be reachable."""
        await self.wait_available()
        client = self.client
        found = await self.call(lambda: client.api.containers(
            all=True, filters={"label": [f"{LABEL}.instance={self.instance}",
                                         f"{LABEL}.job-id={job_id}",
                                         f"{LABEL}.attempt={number}"]}))
        if not found:
            return (Vanished("its container is gone") if recorded_running
                    else NeverStarted()), None
        container_id: str = found[0]["Id"]
        watch = self._watch(container_id, directory, mask)
        if stopping:
            watch.signals_sent = 1 << 30
        # Looked at again now that its events reach the watch: a die between the listing
        # and the watch would be missed otherwise.
        attrs = await self.call(self._inspect, container_id)
        if attrs is None:
            self._watches.pop(container_id, None)
            return Vanished("its container is gone"), None
        state = attrs["State"]
        if state.get("Status") == "created":  # the daemon died between create and start
            self._watches.pop(container_id, None)
            await self.remove(container_id)
            return NeverStarted(), None
        self._start_pump(watch)  # the whole log again: the old pump died with the daemon
        if state.get("Running"):
            return Alive(0), container_id
        # Ended while we were away: its die event is in dockerd's recent history unless
        # dockerd restarted too (then the end was dockerd's, not the job's).
        seen = await self.call(self._history, client, container_id, state)
        watch.kills_seen = seen.count("kill")
        self._spawn(self._finish(
            watch, None if "die" in seen else Vanished("it ended while both noduslocal "
                                                       "and dockerd were restarting")))
        return Alive(0), container_id

    def watched(self, container_id: str) -> asyncio.Future[AttemptState]:
        return self._watches[container_id].done

    async def signal(self, container_id: str, sig: int) -> bool:
        watch = self._watches.get(container_id)
        if watch is None or watch.ended or not self.available:
            return False
        watch.signals_sent += 1
        try:
            await self.call(lambda: self.client.api.kill(container_id, int(sig)))
        except docker.errors.APIError as exc:
            log.info("kill %s of %s: %s", signal.Signals(sig).name, container_id[:12], exc)
            return False
        return True

    async def remove(self, container_id: str) -> None:
        """Remove an ended container, once its end is committed: a daemon that dies before
        that finds it again and reads the same exit."""
        try:
            await self.call(lambda: self.client.api.remove_container(container_id, force=True))
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # the next attempt's sweep or the next restart retries
            log.warning("removing container %s failed: %s", container_id[:12], exc)

    def _watch(self, container_id: str, directory: Path, mask: list[str]) -> Watch:
        done: asyncio.Future[AttemptState] = asyncio.get_running_loop().create_future()
        watch = Watch(container_id, directory, [m.encode() for m in mask if m], done)
        self._watches[container_id] = watch
        return watch

    def _start_pump(self, watch: Watch) -> None:
        watch.pump = threading.Thread(
            target=pump_logs, args=(self._link.new_client, watch.container_id,
                                    watch.directory, watch.mask, watch.closed),
            name=f"logs-{watch.container_id[:12]}", daemon=True)
        watch.pump.start()

    async def _finish(self, watch: Watch, verdict: AttemptState | None = None) -> None:
        if watch.ended:
            return
        watch.ended = True
        try:
            state = verdict or await self._read_end(watch)
        except Exception as exc:
            log.exception("reading the end of container %s failed", watch.container_id[:12])
            state = Vanished(f"its end could not be read: {exc}")
        if watch.pump is not None:
            await asyncio.to_thread(watch.pump.join, PUMP_DRAIN)
        watch.closed.set()
        self._watches.pop(watch.container_id, None)
        if not watch.done.done():
            watch.done.set_result(state)

    async def _read_end(self, watch: Watch) -> AttemptState:
        attrs = await self.call(self._inspect, watch.container_id)
        if attrs is None:
            return Vanished("its container was removed by someone else")
        state = attrs["State"]
        if watch.kills_seen > watch.signals_sent:
            return Vanished("its container was stopped from outside noduslocal: dockerd "
                            "shutting down, or a docker kill")
        code = int(state["ExitCode"])
        oom: bool | None = bool(state.get("OOMKilled"))
        if not oom and code == 137 and watch.kills_seen == 0:
            oom = None  # SIGKILLed, and not through dockerd: most likely the OOM killer
        sig = code - 128 if 128 < code < 160 else None
        return Exited(code, sig, _time(state.get("StartedAt")), _time(state.get("FinishedAt")),
                      oom_killed=oom)

    # --- blocking helpers (run in the pool) -------------------------------------------

    def _inspect(self, container_id: str) -> dict[str, Any] | None:
        try:
            return self.client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return None

    def _create(self, client: docker.DockerClient, image: str,
                kwargs: dict[str, Any]) -> Any:
        try:
            return client.containers.create(image, **kwargs)
        except docker.errors.ImageNotFound:
            self._pull(client, image)
            return client.containers.create(image, **kwargs)

    def _pull(self, client: docker.DockerClient, image: str) -> None:
        why = "pulling is turned off (image_pull = false)"
        if self.image_pull:
            try:
                client.images.pull(image)
                return
            except docker.errors.APIError as exc:
                why = f"pulling it failed: {_explain(exc)}"
        raise LaunchError(
            f"image {image!r} is not on this machine and {why}; provide it with "
            f"`docker load -i IMAGE.tar` or `docker build -t {image} DIR`")

    def _remove_job_containers(self, client: docker.DockerClient, job_id: int) -> None:
        """Whatever an earlier, lost attempt of the job left: it must not run beside the
        retry."""
        for found in client.api.containers(all=True, filters=job_filter(self.instance,
                                                                        job_id)):
            log.info("removing container %s left by job %d", found["Id"][:12], job_id)
            try:
                client.api.remove_container(found["Id"], force=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:  # e.g. dockerd is removing it already
                log.warning("removing container %s: %s", found["Id"][:12], _explain(exc))

    def _history(self, client: docker.DockerClient, container_id: str,
                 state: dict[str, Any]) -> list[str]:
        """The container's events from its start until now, from dockerd's memory."""
        since = int(_time(state.get("StartedAt")) or 0)
        stream = client.api.events(since=since, until=int(time.time()) + 1, decode=True,
                                   filters={"container": container_id})
        return [e.get("status") or e.get("Action") for e in stream]


def _time(value: str | None) -> float:
    if not value or value.startswith("0001-"):
        return 0.0
    # Docker writes nanoseconds; fromisoformat takes at most microseconds.
    head, _, rest = value.partition(".")
    frac = "".join(ch for ch in rest if ch.isdigit())[:6]
    return parse_iso(f"{head}.{frac or '0'}Z")


def _explain(exc: docker.errors.APIError) -> str:
    text = exc.explanation if isinstance(exc.explanation, str) else str(exc)
    return text.strip() or str(exc)
