"""What a container's end means: its exit code and OOM as docker recorded them, unless
the end was not the job's own (a kill nobody here sent, or dockerd restarting under it),
which makes the attempt lost. Blocking helpers, run in the runtime's pool.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import docker

from noduslocal.daemon.runtime.base import AttemptState, Exited, Vanished
from noduslocal.domain.timefmt import parse_iso

PID_FILES = (Path("/run/docker.pid"), Path("/var/run/docker.pid"))


def parse_time(value: str | None) -> float:
    """Docker's RFC 3339 time with nanoseconds; 0 for its "never" (year 1)."""
    if not value or value.startswith("0001-"):
        return 0.0
    head, _, rest = value.partition(".")
    frac = "".join(ch for ch in rest if ch.isdigit())[:6]
    return parse_iso(f"{head.rstrip('Z')}.{frac or '0'}Z")


def dockerd_started_at() -> float | None:
    """When the running dockerd started (from its pid file and /proc), or None when that
    cannot be read (a remote or rootless engine)."""
    for pid_file in PID_FILES:
        try:
            pid = int(pid_file.read_text().strip())
            with open(f"/proc/{pid}/stat", "rb") as file:
                stat = file.read()
            ticks = int(stat[stat.rindex(b")") + 2:].split()[19])
            with open("/proc/stat", "rb") as file:
                btime = next(int(line.split()[1]) for line in file
                             if line.startswith(b"btime "))
            return btime + ticks / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, StopIteration, IndexError):
            continue
    return None


def history(client: docker.DockerClient, container_id: str, since: float) -> list[str]:
    """The container's event actions from `since` until now, from dockerd's memory (its
    last 256 events: a busy dockerd may have forgotten them)."""
    stream = client.api.events(since=int(since), until=int(time.time()) + 1, decode=True,
                               filters={"container": container_id})
    return [e.get("status") or e.get("Action") or "" for e in stream]


def ended_while_away(client: docker.DockerClient, container_id: str,
                     attrs: dict[str, Any]) -> tuple[int, Vanished | None]:
    """For a container found ended after we were not watching it: the number of kills
    docker reported, and Vanished when the end was dockerd's own restart. With its `die`
    still in dockerd's history the end was seen by this dockerd; without it, an end
    before this dockerd started was its predecessor's shutdown."""
    state = attrs["State"]
    seen = history(client, container_id, parse_time(state.get("StartedAt")))
    if "die" in seen:
        return seen.count("kill"), None
    started = dockerd_started_at()
    if started is not None and parse_time(state.get("FinishedAt")) < started:
        return 0, Vanished("dockerd restarted under it")
    return 0, None


def exit_state(attrs: dict[str, Any], kills_seen: int, signals_sent: int) -> AttemptState:
    state = attrs["State"]
    if kills_seen > signals_sent:
        return Vanished("its container was stopped from outside noduslocal: dockerd "
                        "shutting down, or a docker kill")
    code = int(state["ExitCode"])
    # docker sets OOMKilled when any process of the container was; the job's verdict
    # follows its main process, so a job that survived a killed child and exited 0 passed.
    oom: bool | None = bool(state.get("OOMKilled")) and code != 0
    if not oom and code == 137 and kills_seen == 0:
        oom = None  # SIGKILLed, and not through dockerd: most likely the OOM killer
    sig = code - 128 if 128 < code < 160 else None
    return Exited(code, sig, parse_time(state.get("StartedAt")),
                  parse_time(state.get("FinishedAt")), oom_killed=oom)
