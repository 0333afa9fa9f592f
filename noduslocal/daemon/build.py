"""The daemon's one composition root: build_daemon() makes the live settings, the store, the
job layout, the event hub, the GPUs, the runtimes, the Lifecycle and the API's services, and
the Daemon it returns starts, stops and closes them in order. main.py serves what it builds;
the tests build it with runtimes (FakeRuntime) and GPUs of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from noduslocal.daemon import logfmt
from noduslocal.daemon.api.services import Services
from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.settings import SYSTEM_DATA_DIR, Settings
from noduslocal.daemon.coordinator import Lifecycle
from noduslocal.daemon.events import EventHub
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.gpus.history import GpuHistory
from noduslocal.daemon.gpus.model import Inventory
from noduslocal.daemon.gpus.service import GpuService
from noduslocal.daemon.runtime import compiled_shim
from noduslocal.daemon.runtime.base import Runtime
from noduslocal.daemon.runtime.docker.runtime import DockerRuntime
from noduslocal.daemon.runtime.host.cgroups import Cgroups, parent_name
from noduslocal.daemon.runtime.host.runtime import HostRuntime
from noduslocal.daemon.runtime.host.spawner import Spawner
from noduslocal.daemon.runtime.slurm.runtime import SlurmRuntime
from noduslocal.daemon.store import Store

DATABASE = "noduslocal.db"  # in the data directory


@dataclass
class Daemon:
    """What build_daemon() made: every part, and what closes them."""

    live: LiveSettings  # the settings every part reads; a config reload replaces them here
    hub: EventHub
    store: Store
    layout: JobLayout
    runtimes: dict[str, Runtime]  # by kind
    lifecycle: Lifecycle
    services: Services  # the API's doors
    gpus: GpuService | None  # None: the GPUs were given, not read
    closing: contextlib.AsyncExitStack  # closes what was opened, last first

    async def start(self) -> None:
        """Recover (adopt what ran on while no daemon was up), then supervise."""
        await self.lifecycle.start()
        self.services.started_at = time.time()  # the API's uptime counts from here

    async def stop(self) -> None:
        """Stop supervising; jobs keep running and are adopted by the next daemon."""
        await self.lifecycle.stop()

    async def close(self) -> None:
        """The runtimes, the GPU readings and the store, after stop()."""
        await self.closing.aclose()


async def build_daemon(settings: Settings, *, runtimes: Sequence[Runtime] | None = None,
                       inventory: Inventory | None = None) -> Daemon:
    """Open the store in settings.data_dir (which must exist: main.py makes and locks it)
    and build the daemon around it, not started.
    RUNTIMES: None makes the host's and docker's, started (the daemon's own); given (a
    test's), jobs run only on those, and they are neither started nor closed here.
    INVENTORY: None reads the GPUs (NVML, or settings.simulate_gpus) and follows them;
    given, the GPUs are that and do not change."""
    live = LiveSettings(settings)
    closing = contextlib.AsyncExitStack()
    try:
        return await _build(live, closing, runtimes, inventory)
    except BaseException:
        await closing.aclose()
        raise


async def _build(live: LiveSettings, closing: contextlib.AsyncExitStack,
                 given: Sequence[Runtime] | None, inventory: Inventory | None) -> Daemon:
    settings = live.current
    hub = EventHub()
    store = Store(settings.data_dir / DATABASE)
    layout = JobLayout(settings.data_dir, settings.overlay_workspaces)
    # Above the highest job directory: an id the database forgot is never given again.
    await store.open(hub.publish, settings.commit_batch,
                     max(layout.job_ids_on_disk(), default=0))
    closing.push_async_callback(store.close)
    lifecycle: Lifecycle | None = None

    def held() -> set[str]:  # the GPUs a job here holds now (read after each GPU poll)
        assert lifecycle is not None
        return {now.gpu.uuid for now in lifecycle.admin.gpus()
                if now.job is not None or now.state == "allocated"}

    history = GpuHistory(settings.gpu_poll, held)
    live.subscribe(lambda new: history.resize(new.gpu_poll))
    gpus = None
    if inventory is None:
        gpus = GpuService(live, history)
        closing.push_async_callback(gpus.close)
        inventory = await gpus.start()
    docker: DockerRuntime | None = None
    if given is None:
        host = _host_runtime(live, layout, await _compiled_shim(settings))
        closing.push_async_callback(host.close)
        await host.start()

        def docker_changed() -> None:  # dockerd came or went
            assert lifecycle is not None
            lifecycle.runtime_changed()

        docker = DockerRuntime(live, layout, docker_changed, store.attempt_ended)
        # Inert until a [regions.NAME] names a Slurm cluster (none by default).
        slurm = SlurmRuntime(live, layout, settings.data_dir,
                             lambda: live.current.max_log_bytes)
        closing.push_async_callback(slurm.close)
        runtimes: dict[str, Runtime] = {host.kind: host, docker.kind: docker,
                                        slurm.kind: slurm}
    else:
        runtimes = {runtime.kind: runtime for runtime in given}
    lifecycle = Lifecycle(live, store, layout, runtimes, inventory, hub=hub)
    if gpus is not None:
        gpus.watch(lifecycle.set_inventory)
    hub.listen(lifecycle.on_committed)
    hub.listen(logfmt.log_job_events)
    if docker is not None:  # started once the lifecycle can hear that dockerd came or went
        closing.push_async_callback(docker.close)
        await docker.start()
    services = Services(live, lifecycle.jobs, lifecycle.sweep_service, lifecycle.admin,
                        lifecycle.resources, history, time.time())
    return Daemon(live, hub, store, layout, runtimes, lifecycle, services, gpus, closing)


async def _compiled_shim(settings: Settings) -> Path | None:
    """The compiled shim, found or built (None: the Python shim, by choice or for want of
    a C compiler)."""
    if settings.host_shim == "python":
        return None
    return await asyncio.to_thread(compiled_shim.find, settings.data_dir)


def _host_runtime(live: LiveSettings, layout: JobLayout, compiled: Path | None) -> HostRuntime:
    spawner = Spawner(compiled, live.current.max_log_bytes)

    def log_cap_changed(new: Settings) -> None:  # for the attempts launched from now on
        spawner.max_log_bytes = new.max_log_bytes

    live.subscribe(log_cap_changed)
    cgroups = Cgroups.detect(parent_name(live.current.data_dir, SYSTEM_DATA_DIR))
    return HostRuntime(layout, spawner, cgroups, lambda: live.current.host_pids_max)
