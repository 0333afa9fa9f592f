"""What the route modules are given: one service per domain (jobs, sweeps, the box and its
admins, what users own besides jobs, the GPUs' history), under one application key. Route
modules import this, never app.py, so the API has no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from noduslocal.daemon.admin import AdminService
from noduslocal.daemon.api.lanes import Lanes
from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.settings import Settings
from noduslocal.daemon.gpus.history import GpuHistory
from noduslocal.daemon.jobs.service import JobService
from noduslocal.daemon.resources import ResourceService
from noduslocal.daemon.sweeps.service import SweepService


@dataclass
class Services:
    live: LiveSettings
    jobs: JobService
    sweeps: SweepService
    admin: AdminService  # the box: GPUs, health, doctor, metrics, disk use, admins' acts
    resources: ResourceService  # secrets, volumes, uploaded sources
    gpu_history: GpuHistory  # each GPU's readings over the last hour
    started_at: float
    lanes: Lanes = field(default_factory=Lanes)  # each user's heavy reads, apart

    @property
    def settings(self) -> Settings:
        """The settings in force now (a reload replaces them)."""
        return self.live.current


SERVICES = web.AppKey("services", Services)
# On a request, the stream a handler prepared: a client that leaves mid-stream ends it.
STREAM = "nodus.stream"


async def start_stream(request: web.Request, resp: web.StreamResponse) -> None:
    await resp.prepare(request)
    request[STREAM] = resp
