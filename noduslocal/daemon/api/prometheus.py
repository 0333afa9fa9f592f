"""Prometheus text at /metrics (prometheus-client): a collector that reads the daemon's state
when scraped (GPUs, jobs by phase, the queue by user, attempts by outcome, disk) and the API's
latency histogram, kept by a middleware. Everyone may scrape it, as everyone may list jobs;
the optional TCP port, which any local user reaches, leaves the series by user out when
`metrics_port_per_user` is off.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from noduslocal.daemon.admin import GPU_STATES
from noduslocal.daemon.api.services import STREAM, Services
from noduslocal.domain.states import Phase

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
routes = web.RouteTableDef()
# Seconds: a submit is about a millisecond, a listing of thousands tens of them.
TALLY_EVERY = 1.0  # seconds a tally of jobs and attempts is served again
BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class DaemonCollector(Collector):
    """The daemon's state, read at each scrape: what the GPUs, the queue and the disk are
    now, and the durable tallies of jobs and attempts from the database."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.tallies: tuple[dict[tuple[str, str], int], dict[tuple[str, str], int]] = ({}, {})

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return self.series(per_user=True)

    def series(self, per_user: bool) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """Every family; without PER_USER, none with a user label (the queue's total
        instead of its length by owner, no disk use by user)."""
        yield from self._gpus()
        jobs, attempts = self.tallies
        by_phase = GaugeMetricFamily("noduslocal_jobs", "Jobs by phase (removed ones left "
                                     "out, as in `job list --all`)", labels=["phase"])
        for phase in Phase:
            by_phase.add_metric([phase.value], sum(n for (p, _), n in jobs.items()
                                                   if p == phase.value))
        if per_user:
            queued = GaugeMetricFamily("noduslocal_queue_length", "Pending jobs by owner",
                                       labels=["user"])
            for (phase, owner), count in sorted(jobs.items()):
                if phase == Phase.PENDING:
                    queued.add_metric([owner], count)
        else:
            queued = GaugeMetricFamily("noduslocal_queue_length", "Pending jobs", value=sum(
                n for (p, _), n in jobs.items() if p == Phase.PENDING))
        outcomes = CounterMetricFamily("noduslocal_attempts", "Ended attempts by phase and "
                                       "reason", labels=["phase", "reason"])
        for (phase, reason), count in sorted(attempts.items()):
            outcomes.add_metric([phase, reason], count)
        yield from (by_phase, queued, outcomes)
        yield from self._disk(per_user)

    def _gpus(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["gpu", "uuid", "model"]
        state = GaugeMetricFamily("noduslocal_gpu_state", "1 for the state each GPU is in",
                                  labels=[*labels, "state"])
        util = GaugeMetricFamily("noduslocal_gpu_utilization_ratio",
                                 "GPU utilization (0 to 1)", labels=labels)
        used = GaugeMetricFamily("noduslocal_gpu_memory_used_bytes", "GPU memory in use",
                                 labels=labels)
        total = GaugeMetricFamily("noduslocal_gpu_memory_total_bytes", "GPU memory",
                                  labels=labels)
        energy = CounterMetricFamily("noduslocal_gpu_energy_joules",
                                     "Energy the GPU used since the driver loaded",
                                     labels=labels)
        for now in self.services.admin.gpus():
            gpu = now.gpu
            values = [str(gpu.index), gpu.uuid, gpu.model]
            for each in GPU_STATES:
                state.add_metric([*values, each], 1.0 if each == now.state else 0.0)
            if gpu.utilization is not None:
                util.add_metric(values, gpu.utilization / 100)
            used.add_metric(values, gpu.memory_used)
            total.add_metric(values, gpu.memory_total)
            if gpu.energy_mj is not None:
                energy.add_metric(values, gpu.energy_mj / 1000)
        yield from (state, util, used, total, energy)

    def _disk(self, per_user: bool) -> Iterator[GaugeMetricFamily]:
        reading = self.services.admin.disk_reading()
        free = GaugeMetricFamily("noduslocal_disk_free_bytes",
                                 "Free bytes on the data dir's disk", labels=["path"])
        size = GaugeMetricFamily("noduslocal_disk_size_bytes",
                                 "Size of the data dir's disk", labels=["path"])
        if reading is not None:
            free.add_metric([str(reading.path)], reading.free)
            size.add_metric([str(reading.path)], reading.total)
        yield from (free, size)
        if not per_user:
            return
        used = GaugeMetricFamily("noduslocal_user_disk_bytes",
                                 "What each user holds on the data dir, as `noduslocal du` "
                                 "last measured it", labels=["user", "kind"])
        for usage in self.services.admin.disk_use():
            for kind in ("workspaces", "volumes", "blobs"):
                used.add_metric([usage.user, kind], getattr(usage, kind))
        yield used


class _WithoutUsers(Collector):
    """The daemon's collector less its series by user, for the TCP port."""

    def __init__(self, daemon: DaemonCollector) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        return self.daemon.series(per_user=False)


class Metrics:
    """This daemon's registry (never prometheus-client's process-global one): the collector
    and the API's latency histogram."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._tallied_at = -TALLY_EVERY
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = DaemonCollector(services)
        self.registry.register(self.collector)
        self.latency = Histogram("noduslocal_api_request_seconds", "API request latency to "
                                 "the answer (streams and long polls left out)",
                                 ["method", "route"],
                                 buckets=BUCKETS, registry=self.registry)
        self.without_users = CollectorRegistry(auto_describe=False)
        self.without_users.register(_WithoutUsers(self.collector))
        self.without_users.register(self.latency)

    async def text(self, per_user: bool = True) -> bytes:
        # The tallies are a query over every job: at most one a second, however often
        # anyone scrapes, so a scraper cannot slow everyone's reads.
        if time.monotonic() - self._tallied_at >= TALLY_EVERY:
            self.collector.tallies = await self.services.admin.tallies()
            self._tallied_at = time.monotonic()
        return generate_latest(self.registry if per_user else self.without_users)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        try:
            return await handler(request)
        finally:
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else "unmatched"
            # A stream's handler returns when it ends, a long poll's when the job does:
            # neither is how fast the daemon answers.
            if request.get(STREAM) is None and not route.endswith("/wait"):
                self.latency.labels(request.method, route).observe(
                    time.perf_counter() - start)


METRICS = web.AppKey("nodus.metrics", Metrics)


@routes.get("/metrics")
async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=await request.app[METRICS].text(),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


async def scraped(request: web.Request) -> web.Response:
    """The TCP port's /metrics: any local user reaches it, not only the socket's group, so
    the admin may leave the series by user out (`metrics_port_per_user = false`)."""
    metrics = request.app[METRICS]
    per_user = metrics.services.settings.metrics_port_per_user
    return web.Response(body=await metrics.text(per_user),
                        headers={"Content-Type": CONTENT_TYPE_LATEST})


def scrape_app(metrics: Metrics) -> web.Application:
    """/metrics alone, for the optional TCP port (`metrics_port`): nothing else of the API is
    ever served off the Unix socket, whose peer credentials are its identity."""
    app = web.Application()
    app[METRICS] = metrics
    app.router.add_get("/metrics", scraped)
    return app
