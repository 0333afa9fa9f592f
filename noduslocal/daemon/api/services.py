"""What the route modules are given: the daemon's services, under one application key.
Route modules import this, never app.py, so the API has no import cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from noduslocal.daemon.api.lanes import Lanes
from noduslocal.daemon.config.reload import ConfigReloader
from noduslocal.daemon.config.settings import Settings
from noduslocal.daemon.coordinator import Lifecycle
from noduslocal.daemon.events import EventHub
from noduslocal.daemon.files.layout import JobLayout
from noduslocal.daemon.store import Store


@dataclass
class Services:
    settings: Settings
    store: Store
    lifecycle: Lifecycle  # jobs, attempts, the queue, GPUs, exec and log locations
    layout: JobLayout  # workspaces, volumes and stored blobs (the data plane)
    hub: EventHub
    started_at: float
    config: ConfigReloader | None = None  # the config file followed; None: not followed
    lanes: Lanes = field(default_factory=Lanes)  # each user's heavy reads, apart


SERVICES = web.AppKey("services", Services)
# On a request, the stream a handler prepared: a client that leaves mid-stream ends it.
STREAM = "nodus.stream"


async def start_stream(request: web.Request, resp: web.StreamResponse) -> None:
    await resp.prepare(request)
    request[STREAM] = resp
