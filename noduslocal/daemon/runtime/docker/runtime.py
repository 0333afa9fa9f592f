"""The docker runtime: each rank a container of dockerd's, created as the job's owner with
its limits and GPUs, found again by its labels after a restart of the daemon or dockerd,
and removed once its end is committed; and a container gang's own docker network.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import docker

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.runtime.base import (
    LOG_FILES,
    Alive,
    AttemptRef,
    AttemptState,
    ExecResult,
    Handle,
    Launch,
    LaunchFailed,
    NeverStarted,
    NotLaunched,
    Queued,
    Rank,
    Terminal,
    rank_dir,
)
from noduslocal.daemon.runtime.docker import spec as container_spec
from noduslocal.daemon.runtime.docker.engine import DockerEngine, DockerUnavailable, LaunchError
from noduslocal.daemon.runtime.docker.execute import exec_in_container
from noduslocal.daemon.runtime.docker.spec import LABEL
from noduslocal.daemon.runtime.docker.terminal import DockerTerminal
from noduslocal.daemon.runtime.gang_launch import adopted, launch_ranks
from noduslocal.domain import errors
from noduslocal.domain.jobs import Diagnosis, JobRecord

log = logging.getLogger(__name__)
ADOPT_RETRY = 1.0  # seconds between looks for a dockerd that is away, after a restart


class DockerRuntime:
    kind = "docker"

    def __init__(self, live: LiveSettings, layout: JobLayout, on_change: Callable[[], None],
                 is_ended: Callable[[int, int], Awaitable[bool]]) -> None:
        """`on_change`: dockerd came or went (hold() changed); `is_ended(job_id, number)`:
        whether that attempt's end is committed, so its container may go."""
        self.live = live
        self.layout = layout
        self._on_change = on_change
        self._is_ended = is_ended
        self._tasks: set[asyncio.Task[None]] = set()
        settings = live.current  # what the engine takes here is not live (config.LIVE)
        self.engine = DockerEngine(settings.docker_host,
                                   container_spec.instance_id(settings.data_dir),
                                   settings.image_pull, self._availability_changed,
                                   settings.local_registries)
        self.networks = GangNetworks(self.engine)
        self.engine.log_cap = lambda: self.live.current.max_log_bytes  # a reload applies at once

    async def start(self) -> None:
        await self.engine.start()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.engine.close()

    def wait_reason(self) -> str | None:
        if self.engine.available:
            return None
        return f"dockerd unreachable: {self.engine.unavailable_reason}"

    def queue_reason(self, handles: list[Handle]) -> Queued | None:
        return None  # launched here means running: this runtime has no queue of its own

    async def regions(self) -> list[dict[str, Any]]:
        return []  # this box's own region (AdminService describes it)

    async def diagnose(self, gpus: bool) -> list[Diagnosis]:
        if not self.engine.available:
            return [Diagnosis("dockerd", False, f"unreachable: {self.engine.unavailable_reason}"
                                                " (start it: systemctl start docker); jobs "
                                                "with an image wait")]
        try:
            info = await self.engine.call(lambda: self.engine.client.info())
        except DockerUnavailable as exc:
            return [Diagnosis("dockerd", False, f"unreachable: {exc}")]
        found = [Diagnosis("dockerd", True, f"docker {info.get('ServerVersion')}, storage "
                                            f"{info.get('Driver')}")]
        runtimes = sorted(info.get("Runtimes") or {})
        if "nvidia" in runtimes:
            found.append(Diagnosis("nvidia runtime", True, "registered with dockerd"))
        elif gpus:
            found.append(Diagnosis("nvidia runtime", False, "dockerd has no nvidia runtime "
                                   f"(it has {', '.join(runtimes)}): GPU containers fail to "
                                   "start; install nvidia-container-toolkit, then "
                                   "`nvidia-ctk runtime configure --runtime=docker` and restart "
                                   "docker"))
        else:
            found.append(Diagnosis("nvidia runtime", None, "not needed: no NVIDIA GPUs here"))
        return found

    def _availability_changed(self) -> None:
        if self.engine.available:
            task = asyncio.ensure_future(self._sweep())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        self._on_change()

    async def launch(self, launch: Launch) -> list[Rank]:
        ref = launch.ref
        try:
            if ref.job.spec.gang is not None:
                await self.networks.make(ref.job, ref.number)
            return await launch_ranks(
                launch, lambda rank: self._launch_rank(launch, rank),
                lambda rank, sig: self.signal(ref, rank.handle, sig),
                lambda ranks: self._discard(ref))
        except DockerUnavailable as exc:  # queued again, no retry spent
            raise NotLaunched(NeverStarted(f"dockerd went away ({exc})")) from None
        except LaunchError as exc:
            raise LaunchFailed(str(exc)) from None

    async def _launch_rank(self, launch: Launch, rank: int) -> Rank:
        ref, job, instance = launch.ref, launch.ref.job, self.engine.instance
        assert job.spec.image is not None
        gpus = launch.rank_gpus(rank)
        # On the gang's network a rank is found by its container's name.
        plan = launch.plan(rank, container_spec.container_name(instance, job, ref.number),
                           container_spec.container_name(instance, job, ref.number, rank))
        kwargs = container_spec.create_kwargs(
            self.live.current, self.layout, instance, job, ref.number, launch.secrets,
            gpus.env(in_container=True), gpus.device_ids, plan, launch.index_env(), rank)
        directory = ref.rank_dir(rank)
        directory.mkdir(mode=0o700, exist_ok=True)
        container_id, ended = await self.engine.launch(
            job.spec.image, kwargs, job.id, ref.number, directory, launch.mask, rank)
        return Rank(Handle(self.kind, container_id, rank), time.time(), ended)

    async def _discard(self, ref: AttemptRef) -> None:
        """A launch that failed part way: every container of the job goes (a create that
        was cut off may have made one we never learnt of), and the gang's network."""
        await self.engine.clear_job(ref.job.id)
        if ref.job.spec.gang is not None:
            await self.networks.remove(ref.job.id, ref.number)

    async def adopt(self, launch: Launch, recorded: list[Handle], recorded_running: bool,
                    stopping: bool) -> list[Rank] | AttemptState:
        # The containers are found by their labels, so a container created after the
        # last commit is found too.
        ref = launch.ref
        found: list[tuple[int, AttemptState, Rank | None]] = []
        for rank in launch.ranks:
            while True:
                try:
                    state, container_id, started, ended = await self.engine.adopt(
                        ref.job.id, ref.number, ref.rank_dir(rank), launch.mask,
                        recorded_running=recorded_running, stopping=stopping, rank=rank)
                    break
                except DockerUnavailable:
                    await asyncio.sleep(ADOPT_RETRY)  # adopt() waits for dockerd
            if not isinstance(state, Alive):
                found.append((rank, state, None))
                continue
            assert container_id is not None and ended is not None
            log.info("adopting job %s attempt %d rank %d (container %s)", ref.job.name,
                     ref.number, rank, container_id[:12])
            found.append((rank, state, Rank(Handle(self.kind, container_id, rank), started,
                                            ended)))
        return adopted(found, self.kind, recorded)

    async def signal(self, ref: AttemptRef, handle: Handle, sig: int) -> bool:
        return await self.engine.signal(handle.ref, sig)

    async def clear_lost(self, ref: AttemptRef, handles: list[Handle]) -> None:
        """Nothing now: a lost attempt's container goes with release(), once its end is
        committed, and the next attempt's launch removes whatever earlier ones left."""

    async def release(self, ref: AttemptRef, handles: list[Handle]) -> None:
        for handle in handles:
            if handle.ref != "0":  # "0": a rank found ended after a restart, no container
                await self.engine.remove(handle.ref)
        if ref.job.spec.gang is not None:
            await self.networks.remove(ref.job.id, ref.number)

    async def exec(self, launch: Launch, handle: Handle, command: list[str],
                   timeout: float) -> ExecResult:
        job = launch.ref.job
        try:
            return await exec_in_container(
                self.engine.call, self.engine.client, handle.ref, command,
                f"{job.owner_uid}:{job.owner_gid}", job.spec.workdir, launch.mask, timeout)
        except DockerUnavailable as exc:
            raise errors.Conflict(f"dockerd unreachable: {exc}") from None

    async def open_terminal(self, launch: Launch, handle: Handle, command: list[str],
                            rows: int, cols: int) -> Terminal:
        job = launch.ref.job
        try:
            return await DockerTerminal.start(
                self.engine.call, self.engine.client, handle.ref, command,
                f"{job.owner_uid}:{job.owner_gid}", job.spec.workdir, rows, cols)
        except DockerUnavailable as exc:
            raise errors.Conflict(f"dockerd unreachable: {exc}") from None

    def log_path(self, directory: Path, stream: str, rank: int = 0) -> Path:
        return rank_dir(directory, rank) / LOG_FILES[stream]

    async def _sweep(self) -> None:
        """Remove containers whose attempt's end is committed: ones whose removal failed
        (dockerd away), or whose daemon died between the commit and the removal."""
        engine = self.engine
        try:
            # Running ones too: a container whose attempt was judged lost (dockerd
            # restarted) may live on under live-restore, and its job has moved on.
            found: list[dict[str, Any]] = await engine.call(
                lambda: engine.client.api.containers(
                    all=True, filters=container_spec.job_filter(engine.instance)))
            for container in found:
                labels = container["Labels"]
                job_id = int(labels[f"{container_spec.LABEL}.job-id"])
                number = int(labels[f"{container_spec.LABEL}.attempt"])
                if await self._is_ended(job_id, number):
                    await engine.remove(container["Id"])
            await self.networks.sweep(self._is_ended)
        except Exception:
            log.exception("removing ended containers failed")


class GangNetworks:
    """A container gang's own docker network: made before its ranks, removed once the
    attempt's end is committed, and swept after a restart like the containers; with the job's
    `network="none"` it is internal (ranks reach each other, nothing else).
    """

    def __init__(self, engine: DockerEngine) -> None:
        self.engine = engine

    def _labels(self, job: JobRecord, number: int) -> dict[str, str]:
        return {f"{LABEL}.instance": self.engine.instance, f"{LABEL}.job-id": str(job.id),
                f"{LABEL}.attempt": str(number), f"{LABEL}.owner": job.owner}

    def _find(self, job_id: int | None = None) -> list[dict[str, Any]]:
        wanted = [f"{LABEL}.instance={self.engine.instance}"]
        if job_id is not None:
            wanted.append(f"{LABEL}.job-id={job_id}")
        found: list[dict[str, Any]] = self.engine.client.api.networks(
            filters={"label": wanted})
        return found

    async def make(self, job: JobRecord, number: int) -> None:
        """The attempt's network, after removing what earlier attempts of the job left."""
        engine = self.engine
        for old in await engine.call(self._find, job.id):
            await self._remove(old["Id"])
        name = container_spec.network_name(engine.instance, job, number)
        try:
            await engine.call(lambda: engine.client.api.create_network(
                name, driver="bridge", internal=job.spec.network == "none",
                labels=self._labels(job, number), check_duplicate=True))
        except docker.errors.APIError as exc:
            raise LaunchError(f"creating the gang's network failed: {exc.explanation or exc}"
                              ) from None

    async def remove(self, job_id: int, number: int) -> None:
        for found in await self.engine.call(self._find, job_id):
            if found["Labels"].get(f"{LABEL}.attempt") == str(number):
                await self._remove(found["Id"])

    async def sweep(self, is_ended: Callable[[int, int], Awaitable[bool]]) -> None:
        """Remove networks whose attempt's end is committed (a removal that failed, or a
        daemon that died before it)."""
        for found in await self.engine.call(self._find):
            labels = found["Labels"]
            if await is_ended(int(labels[f"{LABEL}.job-id"]), int(labels[f"{LABEL}.attempt"])):
                await self._remove(found["Id"])

    async def _remove(self, network_id: str) -> None:
        try:
            await self.engine.call(lambda: self.engine.client.api.remove_network(network_id))
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # still in use, or dockerd away: the next sweep tries again
            log.warning("removing network %s failed: %s", network_id[:12], exc)
