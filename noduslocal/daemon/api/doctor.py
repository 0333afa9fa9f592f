"""GET /v1/doctor: what the daemon can see of what it needs, one check each, OK or what to
do: its runtimes (dockerd and the NVIDIA container runtime, the host jobs' shim), its GPUs
(NVML and the driver), the data dir's disk, its config, and its clock against the database.
Anyone may read it; `noduslocal doctor` adds what only the caller's side can see.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from aiohttp import web

from noduslocal.daemon.api.services import SERVICES, Services
from noduslocal.daemon.store import reports
from noduslocal.domain.jobs import Diagnosis
from noduslocal.domain.units import fmt_bytes

routes = web.RouteTableDef()
CLOCK_SLACK = 5.0  # seconds the newest recorded event may lie ahead of the clock


def gpus(services: Services) -> Diagnosis:
    inventory = services.lifecycle.inventory
    count = len(inventory.gpus)
    if inventory.source == "nvml":
        broken = [g for g in inventory.gpus if not g.healthy]
        detail = f"NVML, driver {inventory.driver}, {count} GPU(s)"
        if broken:
            return Diagnosis("gpus", False, detail + "; unhealthy: " + ", ".join(
                f"GPU {g.index} ({g.problem})" for g in broken))
        return Diagnosis("gpus", True, detail)
    if inventory.source == "simulated":
        return Diagnosis("gpus", True, f"simulated: {inventory.note} (simulate_gpus; NVML "
                                       "is not used)")
    return Diagnosis("gpus", None, f"none: {inventory.note} (GPU jobs are refused; on a GPU "
                                   "box install the NVIDIA driver and restart the daemon)")


def disk(services: Services) -> Diagnosis:
    reading = services.lifecycle.disk.reading
    if reading is None:
        return Diagnosis("disk", None, "not read yet")
    detail = (f"{fmt_bytes(reading.free)} free of {fmt_bytes(reading.total)} at "
              f"{reading.path} (reserve {fmt_bytes(services.settings.disk_reserve)})")
    if reading.low:
        return Diagnosis("disk", False, (
            f"{reading.describe()}: new work is refused; free space there (`noduslocal du` "
            "says who holds what; `noduslocal gc` removes what is past keep_ended, "
            "`noduslocal job rm` ended jobs), or lower disk_reserve"))
    return Diagnosis("disk", True, detail)


def config(services: Services) -> Diagnosis:
    if services.config is None:
        return Diagnosis("config", None, "not followed by this daemon")
    status = services.config.status
    if status.error:
        return Diagnosis("config", False, f"{status.error}; the daemon keeps the settings "
                                          "it had: fix the file (it is read again when saved)")
    if not Path(status.path).exists():
        return Diagnosis("config", True, f"no {status.path}: the defaults are in force "
                                         "(scripts/install.sh puts a commented one there)")
    detail = f"{status.path}: in force"
    if status.restart_pending:
        detail += (f"; {', '.join(status.restart_pending)} changed and take effect when the "
                   "daemon restarts (systemctl restart noduslocal)")
    return Diagnosis("config", True, detail)


async def clock(services: Services) -> Diagnosis:
    newest = await reports.newest_event_time(services.store)
    now = time.time()
    if newest is not None and newest > now + CLOCK_SLACK:
        return Diagnosis("clock", False, f"the clock is {newest - now:.0f}s behind the newest "
                                         "event in the database: ages, timeouts and fair "
                                         "share go wrong (check NTP: timedatectl)")
    return Diagnosis("clock", True, "not behind the database")


@routes.get("/v1/doctor")
async def doctor(request: web.Request) -> web.Response:
    services = request.app[SERVICES]
    checks = [*await services.lifecycle.diagnose(), gpus(services), disk(services),
              config(services), await clock(services)]
    body: dict[str, Any] = {"checks": [c.to_wire() for c in checks]}
    return web.json_response(body)
