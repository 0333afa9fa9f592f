"""Container latency: N container jobs of `true` run one at a time through the SDK, next
to the same container run by docker itself, interleaved in the same run.

    python scripts/bench/container_latency.py [N] [--network none]
                                                      target: p50 within +80 ms of docker

`--network none` runs every container of every runner without a network (docker's bridge
costs about 30 ms at start and 40 ms at exit on the project's VM).

Two quantities per run, both read against dockerd's own event stream (`start` and `die`,
`timeNano`: dockerd's wall clock, the host's):

- submit -> start: from the start of `nodus.Job.create(image=..., command=...)` (docker:
  the start of `containers.run` / `docker run`) to the container's `start` event, which
  dockerd sends once the container's process runs;
- exit -> return: from the container's `die` event to the return of `job.wait()` (docker:
  of `containers.run(remove=True)` / `docker run --rm`, both of which also wait for the
  container's removal, as noduslocal does before it records the end).

Runners: noduslocal (SDK); docker-py `containers.run(remove=True)`, the reference for the
target; the docker CLI `docker run --rm`; and docker-py with the options noduslocal creates
its containers with (init, dropped capabilities, a bind-mounted workspace, limits), which
separates what those options cost from what the daemon adds. A second table cuts both
quantities at dockerd's `create` and `destroy` events, p50 per step and runner. Run it on
an idle machine: the load average before and after is printed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import docker
from common import pct, table

import noduslocal as nodus
from noduslocal import testing
from noduslocal.domain.jobs import parse_iso

IMAGE = "noduslocal-test/busybox:1"
COMMAND = ["true"]
WARMUP = 3
TARGET_MS = 80.0
JOB_LABEL = "io.noduslocal.job"
ACTIONS = ("create", "start", "die", "destroy")
NODUS = "noduslocal (SDK)"
REFERENCE = "docker-py run(remove=True)"  # the target's reference
CLI = "docker CLI run --rm"


class Events:
    """dockerd's container create, start, die and destroy events, keyed by noduslocal job
    name or, for other containers, by container name."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.seen: dict[str, dict[str, int]] = {}
        self.cond = threading.Condition()
        # The request is made here, so nothing started after this returns goes unseen.
        self.stream = client.api.events(decode=True, filters={
            "type": "container", "event": list(ACTIONS)})
        self.thread = threading.Thread(target=self._run, name="events", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for event in self.stream:
                attrs = event.get("Actor", {}).get("Attributes", {})
                key = attrs.get(JOB_LABEL) or attrs.get("name")
                action = event.get("Action") or event.get("status")
                if key is None or action not in ACTIONS:
                    continue
                with self.cond:
                    self.seen.setdefault(key, {})[action] = int(event["timeNano"])
                    self.cond.notify_all()
        except Exception:  # closed at the end of the run
            pass

    def wait(self, key: str, timeout: float = 10.0) -> dict[str, int]:
        with self.cond:
            if not self.cond.wait_for(lambda: len(self.seen.get(key, {})) == len(ACTIONS),
                                      timeout):
                raise AssertionError(f"not all of {ACTIONS} seen for {key} "
                                     f"(saw {self.seen.get(key)})")
            return self.seen.pop(key)

    def close(self) -> None:
        self.stream.close()


class Sample:
    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, quantity: str, ns: float) -> None:
        self.values.setdefault(quantity, []).append(ns / 1e6)

    def add_run(self, t0: int, t_done: int, seen: dict[str, int]) -> None:
        self.add("submit -> start", seen["start"] - t0)
        self.add("exit -> return", t_done - seen["die"])
        # The same two, cut at dockerd's create and destroy events.
        self.add("submit -> create event", seen["create"] - t0)
        self.add("create event -> start", seen["start"] - seen["create"])
        self.add("die -> destroy event", seen["destroy"] - seen["die"])
        self.add("destroy event -> return", t_done - seen["destroy"])


def nodus_run(network: str | None) -> Callable[..., None]:
    def run(name: str, events: Events, sample: Sample | None) -> None:
        run_nodus(name, events, sample, network)
    return run


def run_nodus(name: str, events: Events, sample: Sample | None, network: str | None) -> None:
    t0 = time.time_ns()
    job = nodus.Job.create(name=name, image=IMAGE, command=COMMAND, network=network)
    t_created = time.time_ns()
    doc = job.wait()
    t_done = time.time_ns()
    seen = events.wait(name)
    if sample is None:
        return
    sample.add_run(t0, t_done, seen)
    sample.add("submit -> create returned", t_created - t0)
    sample.add("create returned -> create event", seen["create"] - t_created)
    ended_at = parse_iso(doc.get("ended_at"))
    if ended_at is not None:
        sample.add("destroy event -> ended_at (ms)", ended_at * 1e9 - seen["destroy"])


def docker_run(client: docker.DockerClient, **options: Any) -> Callable[..., None]:
    def run(name: str, events: Events, sample: Sample | None) -> None:
        t0 = time.time_ns()
        client.containers.run(IMAGE, name=name, remove=True, **options)
        t_done = time.time_ns()
        seen = events.wait(name)
        if sample is not None:
            sample.add_run(t0, t_done, seen)
    return run


def cli_run(network: str | None) -> Callable[..., None]:
    options = ["--network", network] if network else []

    def run(name: str, events: Events, sample: Sample | None) -> None:
        t0 = time.time_ns()
        subprocess.run(["docker", "run", "--rm", "--name", name, *options, IMAGE, *COMMAND],
                       check=True, stdout=subprocess.DEVNULL)
        t_done = time.time_ns()
        seen = events.wait(name)
        if sample is not None:
            sample.add_run(t0, t_done, seen)
    return run


def noduslike_options(workspace: str) -> dict[str, Any]:
    """What container_spec.create_kwargs gives a root job with no limits of its own."""
    return {
        "entrypoint": COMMAND, "command": [], "working_dir": "/workspace", "user": "0:0",
        "init": True, "privileged": False, "security_opt": ["no-new-privileges"],
        "cap_drop": ["ALL"], "pids_limit": 8192, "nano_cpus": 1_000_000_000,
        "shm_size": 8 * 2**30, "stdin_open": False, "tty": False,
        "mounts": [docker.types.Mount("/workspace", workspace, type="bind")],
        "labels": {"bench": "container-latency"},
        "environment": {"HOME": "/root", "USER": "root", "NODUS_JOB": "x",
                        "NODUS_WORKSPACE": "/workspace"},
    }


def main() -> None:
    args = sys.argv[1:]
    network = None
    if "--network" in args:
        at = args.index("--network")
        network = args[at + 1]
        del args[at:at + 2]
    n = int(args[0]) if args else 50
    net = {"network_mode": network} if network else {}
    tag = f"{int(time.time()) % 100000:05d}"
    client = docker.from_env(timeout=60)
    client.images.get(IMAGE)
    events = Events(docker.from_env(timeout=60))
    workspace = tempfile.mkdtemp(prefix="nl-bench-ws-")
    runners: dict[str, Callable[..., None]] = {
        NODUS: nodus_run(network),
        REFERENCE: docker_run(client, entrypoint=COMMAND, command=[], **net),
        CLI: cli_run(network),
        "docker-py, noduslocal's options": docker_run(
            client, **noduslike_options(workspace), **net),
    }
    samples = {runner: Sample() for runner in runners}
    load_before = os.getloadavg()[0]
    try:
        with testing.daemon(cpus=2, log_level="WARNING"):
            for i in range(-WARMUP, n):
                # Interleaved, so every runner sees the same machine from minute to minute.
                for k, (runner, run) in enumerate(runners.items()):
                    name = f"cl{tag}-{k}-{'w' if i < 0 else ''}{abs(i)}"
                    run(name, events, samples[runner] if i >= 0 else None)
    finally:
        events.close()
        Path(workspace).rmdir()

    print(f"network: {network or 'docker default (bridge)'}")
    print(report(samples))
    print(f"load average (1 min) before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")


def report(samples: dict[str, Sample]) -> str:
    reference = samples[REFERENCE].values
    cli = samples[CLI].values
    rows = []
    for quantity in ("submit -> start", "exit -> return"):
        for runner, sample in samples.items():
            ms = sample.values[quantity]
            rows.append({
                "quantity": quantity, "runner": runner, "n": str(len(ms)),
                "p50 ms": f"{pct(ms, 50):.1f}", "p90 ms": f"{pct(ms, 90):.1f}",
                "max ms": f"{max(ms):.1f}",
                "p50 - docker-py": f"{pct(ms, 50) - pct(reference[quantity], 50):+.1f}",
                "p50 - CLI": f"{pct(ms, 50) - pct(cli[quantity], 50):+.1f}",
            })
    out = [table(rows), ""]
    # p50 of each step, per runner: where the two quantities go.
    steps = ["submit -> create returned", "create returned -> create event",
             "submit -> create event", "create event -> start", "die -> destroy event",
             "destroy event -> ended_at (ms)", "destroy event -> return"]
    breakdown = []
    for step in steps:
        row = {"p50 ms of step": step}
        for runner, sample in samples.items():
            values = sample.values.get(step)
            row[runner] = f"{pct(values, 50):.1f}" if values else "-"
        breakdown.append(row)
    out += [table(breakdown), ""]
    ours = samples[NODUS].values
    for quantity in ("submit -> start", "exit -> return"):
        delta = pct(ours[quantity], 50) - pct(reference[quantity], 50)
        verdict = "met" if delta <= TARGET_MS else "MISSED"
        out.append(f"target {quantity}: noduslocal p50 - docker-py p50 = {delta:+.1f} ms "
                   f"(<= +{TARGET_MS:.0f} ms): {verdict}")
    return "\n".join(out)


if __name__ == "__main__":
    main()
