"""The docker engine link: creates and starts an attempt's container, pumps its logs into the
attempt directory, learns its end from dockerd's events, and finds this daemon's
containers again after a restart of the daemon or of dockerd.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions

from noduslocal.daemon import local_addresses
from noduslocal.daemon.runtime.base import Alive, AttemptState, NeverStarted, Vanished
from noduslocal.daemon.runtime.docker.end import ended_while_away, exit_state, parse_time
from noduslocal.daemon.runtime.docker.link import DockerLink
from noduslocal.daemon.runtime.docker.logs import LogPump
from noduslocal.daemon.runtime.docker.spec import LABEL, job_filter
from noduslocal.daemon.runtime.shim import MAX_LOG
from noduslocal.domain.container_fields import registry_of

log = logging.getLogger(__name__)
T = TypeVar("T")
PUMP_DRAIN = 10.0  # seconds without a byte of an ended container's log: dockerd is stuck
# A dropped connection, or dockerd too busy to answer: either way, come back later.
TRANSIENT = (requests.exceptions.ConnectionError, requests.exceptions.Timeout)
REGISTRY_SETTING = "local_registries"


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
    settled: bool = False  # started, or found: a recheck may judge it
    ended: bool = False
    pump: LogPump | None = None


class DockerEngine:
    def __init__(self, docker_host: str | None, instance: str, image_pull: bool,
                 on_availability: Callable[[], None],
                 local_registries: tuple[str, ...] = ()) -> None:
        """`local_registries`: registries on this host's addresses that images may be
        pulled from (the admin's local_registries)."""
        self.instance = instance
        self.image_pull = image_pull
        self.local_registries = local_registries
        self.available = False
        self.unavailable_reason = "not connected yet"
        self._on_availability = on_availability
        self._watches: dict[str, Watch] = {}
        self._lost_link = False  # the event stream broke since the last connect
        self._tasks: set[asyncio.Task[None]] = set()
        self._pool = ThreadPoolExecutor(16, thread_name_prefix="docker")
        # Creates (with their pulls) and execs may take long: each has its own threads, so
        # neither holds up launches, kills and ends, and execs (up to 24 h each, capped per
        # user by the lifecycle) never hold up another user's create.
        self.slow_pool = ThreadPoolExecutor(32, thread_name_prefix="docker-slow")
        self.exec_pool = ThreadPoolExecutor(32, thread_name_prefix="docker-exec")
        self._link = DockerLink(docker_host, job_filter(instance), self._on_event,
                                self._on_state)
        self.log_cap: Callable[[], int] = lambda: MAX_LOG  # each log's, for pumps started next

    async def start(self) -> None:
        self._link.start()

    async def close(self) -> None:
        await self._link.close()
        for watch in self._watches.values():
            if watch.pump is not None:
                watch.pump.stop()
        for pool in (self._pool, self.slow_pool, self.exec_pool):
            pool.shutdown(wait=False, cancel_futures=True)

    @property
    def client(self) -> docker.DockerClient:
        if not self.available or self._link.client is None:
            raise DockerUnavailable(self.unavailable_reason)
        return self._link.client

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def call(self, fn: Callable[..., T], *args: Any, slow: bool = False,
                   exec_: bool = False) -> T:
        """Run a blocking docker-py call in a pool (`slow`: creates, `exec_`: execs). A
        dropped connection means dockerd is going away: container work waits
        (DockerUnavailable) until the link is back."""
        pool = self.exec_pool if exec_ else self.slow_pool if slow else self._pool
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        except TRANSIENT as exc:
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
        """After dockerd was away: a container still running is watched again (its log
        read again); one that ended meanwhile is judged as after a daemon restart."""
        for watch in list(self._watches.values()):
            if not watch.settled or watch.ended:
                continue  # being launched or adopted right now: that path decides
            try:
                attrs = await self.call(self._inspect, watch.container_id)
                if attrs is not None:
                    self._start_pump(watch)  # its pump's stream broke with the link
                if attrs is not None and attrs["State"]["Running"]:
                    continue
                verdict: AttemptState | None = Vanished("its container is gone")
                if attrs is not None:
                    kills, verdict = await self.call(ended_while_away, self.client,
                                                     watch.container_id, attrs)
                    watch.kills_seen = max(watch.kills_seen, kills)
            except DockerUnavailable:
                return  # away again; the next connect rechecks
            self._spawn(self._finish(watch, verdict))

    # --- attempts -----------------------------------------------------------------------

    async def launch(self, image: str, kwargs: dict[str, Any], job_id: int, number: int,
                     directory: Path, mask: list[str], rank: int = 0,
                     ) -> tuple[str, asyncio.Future[AttemptState]]:
        """Create and start the attempt's container; returns its id and a future of its
        end. Raises LaunchError with a message for the user, DockerUnavailable. Before a
        retry, whatever earlier attempts left is removed (a first attempt's container
        left by a crash is found and settled by the reconcile, before any retry)."""
        client = self.client
        if number > 1 and rank == 0:  # a gang's later ranks: rank 0 cleared the way
            await self.clear_job(job_id)
        try:
            container_id = await self.call(self._create, client, image, kwargs, slow=True)
        except docker.errors.APIError as exc:
            raise LaunchError(f"creating the container failed: {_explain(exc)}") from None
        watch = self._watch(container_id, directory, mask)
        try:
            await self.call(client.api.start, container_id)
        except Exception as exc:
            # A start that dockerd did make but could not confirm is removed here, or by
            # the next attempt's sweep when dockerd is away.
            self._watches.pop(container_id, None)
            await self.remove(container_id)
            if isinstance(exc, docker.errors.APIError):
                raise LaunchError(f"starting the container failed: {_explain(exc)}") from None
            raise
        watch.settled = True
        self._start_pump(watch)
        return container_id, watch.done

    async def adopt(self, job_id: int, number: int, directory: Path, mask: list[str],
                    recorded_running: bool, stopping: bool, rank: int = 0,
                    ) -> tuple[AttemptState, str | None, float,
                               asyncio.Future[AttemptState] | None]:
        """After a daemon restart: (Alive, id, started, its end) when the attempt's
        container exists, else what became of the attempt. `stopping`: we had asked it to
        stop, so kills are ours."""
        await self.wait_available()
        client = self.client
        found = await self.call(lambda: client.api.containers(
            all=True, filters={"label": [f"{LABEL}.instance={self.instance}",
                                         f"{LABEL}.job-id={job_id}",
                                         f"{LABEL}.attempt={number}",
                                         f"{LABEL}.rank={rank}"]}))
        if not found:
            return (Vanished("its container is gone") if recorded_running
                    else NeverStarted()), None, 0.0, None
        container_id: str = found[0]["Id"]
        watch = self._watch(container_id, directory, mask)
        if stopping:
            watch.signals_sent = 1 << 30
        # Looked at again now that its events reach the watch: a die between the listing
        # and the watch would be missed otherwise.
        attrs = await self.call(self._inspect, container_id)
        if attrs is None:
            self._watches.pop(container_id, None)
            return Vanished("its container is gone"), None, 0.0, None
        state = attrs["State"]
        if state.get("Status") == "created":  # the daemon died between create and start
            self._watches.pop(container_id, None)
            await self.remove(container_id)
            return NeverStarted(), None, 0.0, None
        started = parse_time(state.get("StartedAt"))
        watch.settled = True
        self._start_pump(watch)  # the whole log again: the old pump died with the daemon
        if not state.get("Running"):
            kills, verdict = await self.call(ended_while_away, client, container_id, attrs)
            watch.kills_seen = max(watch.kills_seen, kills)
            self._spawn(self._finish(watch, verdict))
        return Alive(0), container_id, started, watch.done

    async def clear_job(self, job_id: int) -> None:
        """Remove every container of the job, whatever its state."""
        await self.call(self._remove_job_containers, self.client, job_id)

    async def signal(self, container_id: str, sig: int) -> bool:
        """False when the signal could not be delivered (ended, or dockerd away)."""
        watch = self._watches.get(container_id)
        if watch is None or watch.ended or not self.available:
            return False
        watch.signals_sent += 1
        try:
            await self.call(lambda: self.client.api.kill(container_id, int(sig)))
        except (docker.errors.APIError, DockerUnavailable) as exc:
            watch.signals_sent -= 1
            log.info("kill %s of %s: %s", signal.Signals(sig).name, container_id[:12], exc)
            return False
        return True

    async def remove(self, container_id: str) -> None:
        """Remove an ended container (and its anonymous volumes), once its end is
        committed: a daemon that dies before that finds it again and reads the same end."""
        try:
            await self.call(lambda: self.client.api.remove_container(
                container_id, force=True, v=True))
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # the sweep on the next connect tries again
            log.warning("removing container %s failed: %s", container_id[:12], exc)

    def _watch(self, container_id: str, directory: Path, mask: list[str]) -> Watch:
        done: asyncio.Future[AttemptState] = asyncio.get_running_loop().create_future()
        watch = Watch(container_id, directory, [m.encode() for m in mask if m], done)
        self._watches[container_id] = watch
        return watch

    def _start_pump(self, watch: Watch) -> None:
        """(Re)start copying the log; a pump still running from before stops."""
        if watch.pump is not None:
            watch.pump.stop(discard=True)
        watch.pump = LogPump(self._link.new_client, watch.container_id, watch.directory,
                             watch.mask, self.log_cap())
        watch.pump.start()

    async def _finish(self, watch: Watch, verdict: AttemptState | None = None) -> None:
        if watch.ended:
            return
        watch.ended = True
        state = verdict
        while state is None:
            try:
                attrs = await self.call(self._inspect, watch.container_id)
                state = (Vanished("its container was removed by someone else")
                         if attrs is None
                         else exit_state(attrs, watch.kills_seen, watch.signals_sent))
            except DockerUnavailable:
                await self.wait_available()  # the end is still there to read
            except Exception as exc:
                log.exception("reading the end of container %s failed",
                              watch.container_id[:12])
                state = Vanished(f"its end could not be read: {exc}")
        if watch.pump is not None:
            if not await watch.pump.drained(PUMP_DRAIN):
                log.warning("the log of container %s stopped coming before its end; "
                            "keeping what was copied", watch.container_id[:12])
            watch.pump.stop()
        self._watches.pop(watch.container_id, None)
        if not watch.done.done():
            watch.done.set_result(state)

    # --- blocking helpers (run in the pool) -------------------------------------------

    def _inspect(self, container_id: str) -> dict[str, Any] | None:
        try:
            return self.client.api.inspect_container(container_id)
        except docker.errors.NotFound:
            return None

    def _create(self, client: docker.DockerClient, image: str, kwargs: dict[str, Any]) -> str:
        try:
            return str(client.containers.create(image, **kwargs).id)
        except docker.errors.ImageNotFound:
            self._pull(client, image)
            return str(client.containers.create(image, **kwargs).id)

    def _pull(self, client: docker.DockerClient, image: str) -> None:
        why = "pulling is turned off (image_pull = false)"
        if self.image_pull:
            self._check_registry(image)
            try:
                # Without credentials: the daemon's own (root's) must not serve users.
                client.images.pull(image, auth_config={})
                return
            except docker.errors.APIError as exc:
                # What the registry answered is for the admin: a user could point dockerd
                # at a service of this host's and read its answers here.
                log.warning("pulling image %s failed: %s", image, _explain(exc))
                why = ("pulling it failed: the registry has no such image, or wants a login"
                       if exc.status_code == 404 else
                       "pulling it failed (dockerd's answer is in the daemon's log)")
        raise LaunchError(
            f"image {image!r} is not on this machine and {why}; provide it with "
            f"`docker load -i IMAGE.tar` or `docker build -t {image} DIR`")

    def _check_registry(self, image: str) -> None:
        """Refuse a pull from a registry on an address of this host's (loopback,
        link-local, its interfaces') the admin did not list: dockerd, as root, would
        contact it for the user. Blocking: a name is resolved."""
        registry = registry_of(image)
        if registry is None or registry in self.local_registries:
            return
        host, _, port = registry.partition(":")
        try:
            addresses = local_addresses.resolve(host, int(port) if port.isdigit() else 443)
        except OSError as exc:
            raise LaunchError(f"image {image!r}: its registry {host} does not resolve "
                              f"({exc.strerror or exc})") from None
        for address in addresses:
            why = local_addresses.refused(address, ())
            if why is not None:
                where = f"{host} is" if str(address) == host else \
                    f"{host} resolves to {address},"
                raise LaunchError(
                    f"image {image!r}: its registry {registry} is on this host ({where} "
                    f"{why}); images are pulled from this host's registries only where the "
                    f"admin lists them ({REGISTRY_SETTING})")

    def _remove_job_containers(self, client: docker.DockerClient, job_id: int) -> None:
        """Whatever an earlier, lost attempt of the job left: it must not run beside the
        retry."""
        for found in client.api.containers(all=True, filters=job_filter(self.instance,
                                                                        job_id)):
            log.info("removing container %s left by job %d", found["Id"][:12], job_id)
            try:
                client.api.remove_container(found["Id"], force=True, v=True)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as exc:  # e.g. dockerd is removing it already
                log.warning("removing container %s: %s", found["Id"][:12], _explain(exc))


def _explain(exc: docker.errors.APIError) -> str:
    text = exc.explanation if isinstance(exc.explanation, str) else str(exc)
    return text.strip() or str(exc)
