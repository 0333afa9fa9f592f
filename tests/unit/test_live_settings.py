"""A config reload reaches every part of the daemon: build_daemon's parts read one
LiveSettings holder, what is derived from a live setting is made again on a replace, and
no part keeps a Settings of its own that a reload would leave behind."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import ipaddress
import os
import pwd
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.settings import Settings
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.gpus.service import GpuService, simulated_inventory
from noduslocal.daemon.runtime.docker.runtime import DockerRuntime
from noduslocal.daemon.store import job_writes
from noduslocal.domain import errors
from noduslocal.domain.validation import parse_create
from noduslocal.testing import eventually, lifecycle

LOOPBACK_HOOK = "http://127.0.0.1:9/hook"


def busy_gpu() -> Any:
    """One L4 with 1.5 GiB used by something else: busy under the default 1 GiB."""
    inventory = simulated_inventory("1xL4")
    inventory.gpus[0].memory_used = 3 * 2**29
    return inventory


def settings_copies(root: object, path: str = "daemon") -> Iterator[str]:
    """Where a Settings is reachable from ROOT other than through a LiveSettings: in an
    attribute, a container, a bound method's object or a closure's cell; each by its
    shortest path."""
    seen: set[int] = set()
    stack: deque[tuple[object, str]] = deque([(root, path)])
    while stack:
        obj, where = stack.popleft()
        if id(obj) in seen or isinstance(obj, LiveSettings):
            continue
        seen.add(id(obj))
        if isinstance(obj, Settings):
            yield where
            continue
        if isinstance(obj, dict):
            stack += [(v, f"{where}[{k!r}]") for k, v in obj.items()]
        elif isinstance(obj, list | tuple | set | frozenset):
            stack += [(v, f"{where}[{i}]") for i, v in enumerate(obj)]
        elif isinstance(obj, functools.partial):
            stack += [(obj.func, f"{where}.func"), (obj.args, f"{where}.args")]
        elif hasattr(obj, "__self__") and hasattr(obj, "__func__"):  # a bound method
            stack.append((obj.__self__, f"{where}.__self__"))
        elif hasattr(obj, "__code__"):  # a function or lambda: what it closed over
            cells = getattr(obj, "__closure__", None) or ()
            names = obj.__code__.co_freevars  # type: ignore[attr-defined]
            for name, cell in zip(names, cells, strict=True):
                with contextlib.suppress(ValueError):  # a cell not filled yet
                    stack.append((cell.cell_contents, f"{where}<{name}>"))
        elif type(obj).__module__.startswith("noduslocal"):
            attrs = dict(getattr(obj, "__dict__", {}))
            for slot in getattr(type(obj), "__slots__", ()):
                if hasattr(obj, slot):
                    attrs[slot] = getattr(obj, slot)
            stack += [(v, f"{where}.{k}") for k, v in attrs.items()]


def test_a_reload_reaches_every_part(tmp_path: Path) -> None:
    """Live settings changed, each seen by the part that uses it: the queue's per-user
    limit and the GPU pool's busy memory let waiting jobs start, the webhook check lets a
    local address through, admission's priority cap, the API's and `admin users`' reads;
    then the disk reserve: no room left, and new work refused once the disk is read."""
    user = pwd.getpwuid(os.getuid()).pw_name
    someone = job_writes.Owner(os.getuid(), os.getgid(), user, admin=False)
    other = job_writes.Owner(os.getuid() + 1, os.getgid(), "other", admin=False)
    urgent = parse_create({"name": "urgent", "command": ["x"], "priority": 3},
                          regions=("local",))
    gpu_req = parse_create({"name": "gpu", "command": ["x"], "cpu": 1, "gpu": 1},
                           regions=("local",))

    async def scenario() -> None:
        async with lifecycle(tmp_path, inventory=busy_gpu(), user_max_jobs=1,
                             disk_poll=0.05) as h:
            parts = h.lifecycle
            first = await h.create_job("first", cpu=1)
            await h.launched(first.id)
            second = await h.create_job("second", cpu=1)
            # Another user's, so that only the GPU keeps it waiting.
            gpu_job, _ = await parts.admission.create(gpu_req, other, None, None)
            for job, why in ((second, "user limit 1/1"), (gpu_job, "GPU 0 busy")):
                await eventually(lambda job=job, why=why: why in (
                    parts.jobs.wait_reason(job.id) or ""), f"{job.name} to wait for {why}")
            with pytest.raises(errors.InvalidArgument, match="webhook"):
                await parts.webhooks.check(LOOPBACK_HOOK)
            with pytest.raises(errors.InvalidArgument, match="priority: at most 0"):
                parts.admission.check(urgent, someone)

            h.daemon.live.replace(dataclasses.replace(
                h.settings, user_max_jobs=None, gpu_busy_memory=2 * 2**30,
                max_user_priority=5, user_max_execs=3, max_wait_poll=7.0,
                webhook_local_networks=(ipaddress.ip_network("127.0.0.0/8"),)))

            await h.launched(second.id)  # the per-user limit made again, and a pass run
            await h.launched(gpu_job.id)  # the GPU is not busy at 1.5 GiB used any more
            await parts.webhooks.check(LOOPBACK_HOOK)
            parts.admission.check(urgent, someone)
            assert h.daemon.services.settings.max_wait_poll == 7.0  # what the handlers read
            limits = [u["limits"] for u in await parts.users.report()
                      if u["uid"] == someone.uid]
            assert limits and (limits[0]["max_jobs"], limits[0]["max_execs"],
                               limits[0]["max_priority"]) == (None, 3, 5)

            assert parts.disk.room() > 0
            parts.room.require("new jobs", someone.uid, user)
            h.daemon.live.replace(dataclasses.replace(h.settings, disk_reserve=2**62))
            assert parts.disk.room() == 0  # below a reserve no disk has
            await eventually(lambda: parts.disk.reading.low, "the disk to read low")
            with pytest.raises(errors.ResourceExhausted, match="disk_reserve"):
                parts.room.require("new jobs", someone.uid, user)
            doctor = {d.name: d for d in await parts.admin.doctor()}
            assert doctor["disk"].ok is False, doctor["disk"]

    asyncio.run(scenario())


def test_no_part_keeps_a_copy_of_the_settings(tmp_path: Path) -> None:
    """A part that kept the Settings it was built with would miss every reload."""

    async def scenario() -> None:
        async with lifecycle(tmp_path, inventory=busy_gpu()) as h:
            assert list(settings_copies(h.daemon)) == []
            # The walk does find a copy where one is kept.
            h.lifecycle.stopper.kept = h.settings  # type: ignore[attr-defined]
            assert list(settings_copies(h.daemon)) == ["daemon.lifecycle.stopper.kept"]

    asyncio.run(scenario())


def test_the_real_runtimes_and_gpus_read_the_holder(tmp_path: Path) -> None:
    """What build_daemon makes only for the real daemon (no test runtimes): the docker
    runtime's log cap and GPU readings follow the holder, with no copy of their own."""
    live = LiveSettings(Settings(socket=tmp_path / "s", data_dir=tmp_path))

    async def is_ended(job_id: int, number: int) -> bool:
        return False

    async def scenario() -> None:
        docker = DockerRuntime(live, JobLayout(tmp_path), lambda: None, is_ended)
        gpus = GpuService(live)
        try:
            assert list(settings_copies([docker, gpus], "parts")) == []
            live.replace(dataclasses.replace(live.current, max_log_bytes=2**20, gpu_poll=9.0))
            assert docker.engine.log_cap() == 2**20
            assert gpus.live.current.gpu_poll == 9.0
        finally:
            await docker.close()

    asyncio.run(scenario())


def test_a_setting_that_waits_for_a_restart_is_not_replaced(tmp_path: Path) -> None:
    live = LiveSettings(Settings(socket=tmp_path / "s", data_dir=tmp_path))
    heard: list[Settings] = []
    live.subscribe(heard.append)
    with pytest.raises(ValueError, match="cpus_m"):
        live.replace(dataclasses.replace(live.current, cpus_m=1000, kill_grace=1.0))
    assert live.current.kill_grace == 10.0 and heard == []
    new = dataclasses.replace(live.current, kill_grace=1.0)
    live.replace(new)
    assert live.current is new and heard == [new]
