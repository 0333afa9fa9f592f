"""N one-second jobs (`sleep 1`) through a daemon's Slurm region (`region="cluster"`) against
the same N submitted with plain `sbatch --parsable --wrap 'sleep 1'`, in the same run and in
alternating order over R repeats: wall from the first submit to the last end, the daemon's
CPU per Slurm job, slurmctld's CPU, and slurmctld's RPCs (sdiag) each side caused.

    .venv/bin/python scripts/bench/slurm_region.py [REPEATS] [--jobs N] [--mem 1G|none]
        [--poll S] [--export-none] [--py-spy DIR]  target: noduslocal within 1.2x of sbatch

--export-none adds plain sbatch with the daemon's --export=NONE as a third side; the
numbers and what they say are in docs/benchmarks.md ("Slurm region").

Needs the test cluster (scripts/slurm-cluster.sh up) and root (slurmctld's /proc stat).
Both sides ask for --mem (1G by default): the test cluster has no DefMemPerNode, so a job
without it takes a whole node and only 2 of them run at once instead of 8. Each run waits
for a cluster with no jobs of anyone else first, and counts the other users' jobs that
overlapped it anyway. Everything either side submitted is cancelled at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from common import pct, table

import noduslocal as nodus
from noduslocal import testing
from noduslocal.daemon.runtime.slurm.runtime import TAG, daemon_tag, node_dir

TERMINAL = {"Succeeded", "Failed", "Cancelled"}
TICK = os.sysconf("SC_CLK_TCK")
SPY_RATE = 200  # py-spy's samples a second
SQUEUE_EVERY = 0.1  # seconds between the sbatch side's squeue reads (its end's resolution)
CONFIG = '[regions.cluster]\nruntime = "slurm"\npartition = "debug"\n'


# --- what the processes and slurmctld spent -------------------------------------------------


def cpu(pid: int) -> tuple[float, float]:
    """(utime + stime, cutime + cstime) of PID in seconds: its own CPU, and its reaped
    children's (the sbatch and squeue processes a daemon runs)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    own = int(fields[11]) + int(fields[12])
    children = int(fields[13]) + int(fields[14])
    return own / TICK, children / TICK


def slurmctld_pid() -> int:
    for candidate in [Path("/run/slurmctld.pid"), *Path("/proc").glob("[0-9]*")]:
        try:
            pid = int(candidate.read_text()) if candidate.is_file() else int(candidate.name)
            if Path(f"/proc/{pid}/comm").read_text().strip() == "slurmctld":
                return pid
        except (OSError, ValueError):
            continue
    raise SystemExit("no slurmctld on this host: scripts/slurm-cluster.sh up")


_RPC = re.compile(r"^\s+(REQUEST_\w+|MESSAGE_\w+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:\d+"
                  r"\s+total_time:(\d+)")


def sdiag() -> tuple[str, dict[str, tuple[int, int]]]:
    """slurmctld's statistics start and its RPC counts and total microseconds by type (only
    the section by message type, not the one by user)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    since = next((line for line in out.splitlines() if line.startswith("Data since")), "")
    section = out.split("by message type", 1)[-1].split("by user", 1)[0]
    rpcs = {}
    for line in section.splitlines():
        if m := _RPC.match(line):
            rpcs[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return since, rpcs


@dataclass
class Meter:
    """CPU and RPCs from before the first submit to after the last end."""

    daemon: int | None
    ctld: int = field(default_factory=slurmctld_pid)
    start: dict[str, Any] = field(default_factory=dict)
    spent: dict[str, Any] = field(default_factory=dict)

    def _read(self) -> dict[str, Any]:
        since, rpcs = sdiag()
        return {"daemon": cpu(self.daemon) if self.daemon else (0.0, 0.0),
                "ctld": sum(cpu(self.ctld)), "since": since, "rpcs": rpcs,
                "me": resource.getrusage(resource.RUSAGE_CHILDREN)}

    def begin(self) -> None:
        self.start = self._read()

    def end(self) -> None:
        now, then = self._read(), self.start
        me = now["me"].ru_utime + now["me"].ru_stime - then["me"].ru_utime - then["me"].ru_stime
        rpcs = {k: (n - then["rpcs"].get(k, (0, 0))[0], us - then["rpcs"].get(k, (0, 0))[1])
                for k, (n, us) in now["rpcs"].items()}
        self.spent = {"daemon": now["daemon"][0] - then["daemon"][0],
                      "tools": now["daemon"][1] - then["daemon"][1] if self.daemon else me,
                      "ctld": now["ctld"] - then["ctld"],
                      "restarted": now["since"] != then["since"],
                      "rpcs": {k: v for k, v in rpcs.items() if v[0] > 0}}


# --- the cluster ------------------------------------------------------------------------------


def squeue(*args: str) -> list[list[str]]:
    """squeue's rows split at "|"; the format's last field may be a comment, which may hold
    "|" and line breaks (other users' tests put them there): a row without the format's
    count of fields is a comment's continuation, left out."""
    count = args[-1].count("|") + 1
    out = subprocess.run(["squeue", "--noheader", *args], capture_output=True, text=True,
                         check=True).stdout
    rows = [line.split("|", count - 1) for line in out.splitlines()]
    return [row for row in rows if len(row) == count and row[0][:1].isdigit()]


def wait_quiet(limit: float) -> int:
    """Wait (up to LIMIT seconds) until no job of anyone is pending or running; the number
    still there when it gave up."""
    deadline = time.time() + limit
    while True:
        left = len(squeue("--all", "-o", "%i"))
        if left == 0 or time.time() > deadline:
            return left
        time.sleep(1.0)


def slurm_time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def others_during(t0: float, t1: float, ours: set[int], prefix: str | None) -> int:
    """Jobs not ours that were pending or running at some time in [t0, t1] (Slurm's
    whole-second times; MinJobAge keeps ended jobs listed for a while)."""
    count = 0
    for job_id, _, submit, end, comment in squeue("--all", "--states=all",
                                                    "-o", "%i|%T|%V|%e|%k"):
        if not job_id.isdigit() or int(job_id) in ours or (prefix and comment.startswith(prefix)):
            continue
        submitted, ended = slurm_time(submit), slurm_time(end)
        if submitted is not None and submitted <= t1 + 1 and (ended is None or ended >= t0 - 1):
            count += 1
    return count


def cancel_left(ids: set[int], prefixes: list[str]) -> int:
    """scancel whatever of ours is still pending or running; how many that was."""
    left = [job_id for job_id, comment in squeue("--all", "-o", "%i|%k")
            if job_id.isdigit() and (int(job_id) in ids or any(
                comment.startswith(p) for p in prefixes))]
    if left:
        subprocess.run(["scancel", *left], check=False)
    return len(left)


# --- the two sides ----------------------------------------------------------------------------


@dataclass
class Run:
    runner: str
    submit: float  # first submit to last submit answered
    wall: float  # first submit to the last end seen
    spent: dict[str, Any]
    others: int
    slurm_ids: set[int]
    t0: float
    latency: dict[str, float] = field(default_factory=dict)


def mem_options(mem: str | None) -> list[str]:
    return [f"--mem={mem}"] if mem else []


def py_spy() -> str:
    """py-spy beside this interpreter, or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise SystemExit("--py-spy: no py-spy beside this python or on PATH (pip install "
                         "py-spy)")
    return found


def _binary(mem: str | None) -> str | None:
    """Slurm's --mem=1G (binary units) as noduslocal writes it (1GiB)."""
    if mem is None:
        return None
    return mem + "iB" if mem[-1:] in ("K", "M", "G", "T") else f"{mem}MiB"


def run_sbatch(n: int, mem: str | None, ids: set[int], extra: list[str]) -> Run:
    meter = Meter(None)
    with tempfile.TemporaryDirectory() as tmp:  # where slurm-<id>.out would go
        meter.begin()
        t0 = time.time()
        mine = []
        for _ in range(n):
            out = subprocess.run(["sbatch", "--parsable", *mem_options(mem), *extra,
                                  "--wrap", "sleep 1"], cwd=tmp, capture_output=True,
                                 text=True, check=True).stdout
            mine.append(int(out.strip().split(";")[0]))
            ids.add(mine[-1])
        submitted = time.time() - t0
        waiting = set(mine)
        while True:
            listed = {int(row[0]) for row in squeue("--all", "-o", "%i") if row[0].isdigit()}
            now = time.time()
            if not waiting & listed:
                break
            if now - t0 > 600:
                raise SystemExit(f"sbatch: {len(waiting & listed)} jobs still queued after 600 s")
            time.sleep(SQUEUE_EVERY)
        meter.end()
    return Run(f"sbatch {' '.join(extra)} --wrap".replace("  ", " "), submitted, now - t0,
               meter.spent, others_during(t0, now, set(mine), None), set(mine), t0)


class Events(threading.Thread):
    """The daemon's event stream (one connection): when each job's phases were seen."""

    def __init__(self, client: Any, n: int) -> None:
        super().__init__(daemon=True)
        self.client = client
        self.n = n
        self.seen: dict[str, dict[str, float]] = {}
        self.ended: list[float] = []
        self.all_ended = threading.Event()

    def run(self) -> None:
        buffer = b""
        try:
            for chunk in self.client.events(follow=True):
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._seen(json.loads(line), time.time())
        except Exception:  # the daemon closed: the run is over
            return

    def _seen(self, event: dict[str, Any], now: float) -> None:
        if event.get("kind") != "JobPhase":
            return
        phases = self.seen.setdefault(event["job"], {})
        key = f"{event['phase']}:{event['reason']}"
        phases.setdefault(key, now)
        if event["phase"] in TERMINAL:
            self.ended.append(now)
            if len(self.ended) == self.n:
                self.all_ended.set()


def shim_times(data_dir: Path) -> dict[str, tuple[float, float]]:
    """Each job's (started_at, ended_at) as its shim on the node recorded them."""
    found = {}
    for record in data_dir.glob("jobs/*/job.json"):
        try:
            name = json.loads(record.read_text())["name"]
            # The shim on the node writes in the owner's node directory, beside the attempt's.
            where = node_dir(record.parent / "attempt-1", 0)
            exit_ = json.loads((where / "exit.json").read_text())
        except (OSError, ValueError, KeyError):
            continue
        found[name] = (exit_["started_at"], exit_["ended_at"])
    return found


def run_noduslocal(n: int, mem: str | None, poll: float | None, ids: set[int],
                   prefixes: list[str], spy_to: Path | None, label: str) -> Run:
    config = CONFIG + (f"poll = {poll}\n" if poll is not None else "")
    d = testing.Daemon(cpus=2, memory="8GiB", config=config, log_level="WARNING")
    try:
        d.start()
        assert d.proc is not None
        prefix = f"{TAG}:{daemon_tag(d.data_dir)}:"
        prefixes.append(prefix)
        with d.as_default():
            client = d.client()
            events = Events(client, n)
            events.start()
            time.sleep(0.2)  # the stream is open before the first create
            spy = None
            if spy_to is not None:
                spy_to.mkdir(parents=True, exist_ok=True)
                spy = subprocess.Popen(
                    [py_spy(), "record", "-p",
                     str(d.proc.pid), "-r", str(SPY_RATE), "--nonblocking", "-f", "raw", "-o",
                     str(spy_to / f"daemon-{label}.txt")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.0)
            meter = Meter(d.proc.pid)
            meter.begin()
            t0 = time.time()
            memory = _binary(mem)
            jobs = [nodus.Job.create(command=["sleep", "1"], region="cluster", cpu=1,
                                     memory=memory) for _ in range(n)]
            submitted = time.time() - t0
            if not events.all_ended.wait(600):
                raise SystemExit(f"noduslocal: {len(events.ended)} of {n} ended in 600 s")
            wall = max(events.ended) - t0
            meter.end()
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            phases = Counter(job.status()["phase"] for job in jobs)
            assert phases == {"Succeeded": n}, f"noduslocal: {dict(phases)}"
            latency = _latencies(events.seen, shim_times(d.data_dir), t0)
            mine = {int(job_id) for job_id, comment in
                    squeue("--all", "--states=all", "-o", "%i|%k")
                    if comment.startswith(prefix) and job_id.isdigit()}
            ids.update(mine)
            others = others_during(t0, t0 + wall, set(), prefix)
    finally:
        d.close()  # scancels whatever this daemon left in Slurm
    poll_text = f"poll {poll:g} s" if poll is not None else "poll default"
    return Run(f"noduslocal (SDK, {poll_text})", submitted, wall, meter.spent, others, mine,
               t0, latency)


def _latencies(seen: dict[str, dict[str, float]], shims: dict[str, tuple[float, float]],
               t0: float) -> dict[str, float]:
    """Where a job's time went, from the shim's own times and when the SDK saw each phase."""
    queued, running, ended = [], [], []
    for name, (started, finished) in shims.items():
        phases = seen.get(name, {})
        if "Pending:Queued" in phases:
            queued.append(phases["Pending:Queued"] - t0)
        run_seen = phases.get("Running:Started")
        if run_seen is not None:
            running.append(run_seen - started)
        end_seen = phases.get("Succeeded:Completed")
        if end_seen is not None:
            ended.append(end_seen - finished)
    last_shim_end = max(f for _, f in shims.values())
    first_start = min(s for s, _ in shims.values())
    return {"last Queued seen s": max(queued), "first shim start s": first_start - t0,
            "Running seen-start p50 ms": pct(running, 50) * 1000,
            "p0 ms": min(running) * 1000, "p100 ms": max(running) * 1000,
            "end seen-end p50 ms": pct(ended, 50) * 1000,
            "p99 ms": pct(ended, 99) * 1000, "max ms": max(ended) * 1000,
            "last shim end s": last_shim_end - t0,
            "shim run mean ms": statistics.fmean(f - s for s, f in shims.values()) * 1000}


# --- Slurm's own logs: when each job was allocated, launched by slurmd, and completed --------


_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)")
_EVENTS = {"alloc": re.compile(r"(?:sched: Allocate JobId=|_start_job: Started JobId=)(\d+)\b"),
           "launch": re.compile(r"Launching batch job (\d+)\b"),
           "done": re.compile(r"_job_complete: JobId=(\d+) done")}


def slurm_logs() -> list[Path]:
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True,
                            check=True).stdout
    paths = dict(re.findall(r"^(SlurmctldLogFile|SlurmdLogFile)\s*=\s*(\S+)", config, re.M))
    nodes = {row[0] for row in
             (line.split() for line in subprocess.run(
                 ["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, text=True,
                 check=True).stdout.splitlines()) if row}
    found = [Path(paths["SlurmctldLogFile"])] if "SlurmctldLogFile" in paths else []
    if "SlurmdLogFile" in paths:
        found += sorted({Path(paths["SlurmdLogFile"].replace("%n", n)) for n in nodes})
    return [p for p in found if os.access(p, os.R_OK)]


def log_times(ids: set[int]) -> dict[str, dict[int, float]]:
    """The first allocation, launch and completion of each of IDS in Slurm's logs, with
    their millisecond times (empty where the logs cannot be read)."""
    times: dict[str, dict[int, float]] = {kind: {} for kind in _EVENTS}
    for path in slurm_logs():
        with path.open(errors="replace") as lines:
            for line in lines:
                stamp = _STAMP.match(line)
                if stamp is None:
                    continue
                for kind, pattern in _EVENTS.items():
                    if (m := pattern.search(stamp.group(2))) and int(m.group(1)) in ids:
                        at = datetime.fromisoformat(stamp.group(1)).timestamp()
                        times[kind].setdefault(int(m.group(1)), at)
    return times


def breakdown(run: Run, slots: int) -> dict[str, str]:
    """Where the wall went, from Slurm's logs: allocation to slurmd's launch, launch to
    completion, how busy the partition's CPUs were, and the last end to the end seen."""
    t = log_times(run.slurm_ids)
    both = [i for i in run.slurm_ids if i in t["alloc"] and i in t["launch"] and i in t["done"]]
    if not both:
        return {"runner": run.runner, "submit->1st alloc s": "(Slurm's logs unreadable)"}
    alloc, launch, done = t["alloc"], t["launch"], t["done"]
    to_launch = [1000 * (launch[i] - alloc[i]) for i in both]
    running = [1000 * (done[i] - launch[i]) for i in both]
    span = max(done[i] for i in both) - min(alloc[i] for i in both)
    held = sum(done[i] - alloc[i] for i in both)
    return {"runner": run.runner,
            "submit->1st alloc s": f"{min(alloc.values()) - run.t0:.2f}",
            "alloc->launch p50 ms": f"{pct(to_launch, 50):.0f}",
            "alloc->launch max ms": f"{max(to_launch):.0f}",
            "launch->done p50 ms": f"{pct(running, 50):.0f}",
            "launch->done max ms": f"{max(running):.0f}",
            "CPUs held %": f"{100 * held / (slots * span):.0f}",
            "last done->seen s": f"{run.t0 + run.wall - max(done[i] for i in both):.2f}"}


def partition_cpus(partition: str) -> int:
    out = subprocess.run(["sinfo", "-h", "-p", partition, "-o", "%C"], capture_output=True,
                         text=True, check=True).stdout.split("/")
    return int(out[-1])


# --- the report -------------------------------------------------------------------------------


# Leaves of py-spy's stacks that are waits, not work: the event loop's select, idle pool
# threads, aiosqlite's idle connection thread, the child watcher's waitpid, and an anyio
# thread whose leaf is native code (watchfiles' watcher blocked in Rust, one per running
# job): py-spy cannot tell those from running code.
_WAITS = ("EpollSelector.select", "_worker (concurrent/futures/thread.py:81)",
          "_connection_worker_thread (aiosqlite/core.py:59)", "WorkerThread.run (anyio",
          "_do_waitpid", "Condition.wait", "Queue.get", "Event.wait")


def _ours(frame: str) -> bool:
    # py-spy shortens paths: the Slurm runtime's two modules show as bare file names.
    where = frame.rpartition(" (")[2]
    return (where.startswith("noduslocal/") and not where.startswith("noduslocal/daemon/main")
            ) or where.startswith(("runtime.py", "commands.py"))


def spy_top(path: Path, rate: int, top: int = 12) -> list[dict[str, str]]:
    """py-spy's collapsed stacks, waits left out: the busy samples by their innermost frame
    of noduslocal's own code and by their leaf."""
    ours: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    busy = idle = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit() or not stack:
            continue
        frames = stack.split(";")
        if any(w in frames[-1] for w in _WAITS):
            idle += int(count)
            continue
        busy += int(count)
        leaves[frames[-1]] += int(count)
        own = [f for f in frames if _ours(f)]
        ours[own[-1] if own else "(no frame of noduslocal: the event loop, aiohttp)"] += \
            int(count)
    print(f"{path.name}: {busy} busy samples ({1000 * busy / rate:.0f} ms at {rate}/s), "
          f"{idle} waiting")
    rows = [{"ms": f"{1000 * c / rate:.0f}", "innermost noduslocal frame / leaf": f[:120]}
            for f, c in ours.most_common(top)]
    rows.append({"ms": "--", "innermost noduslocal frame / leaf": "leaves:"})
    rows += [{"ms": f"{1000 * c / rate:.0f}", "innermost noduslocal frame / leaf": f[:120]}
             for f, c in leaves.most_common(top)]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("repeats", nargs="?", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--mem", default="1G", help="each job's memory on both sides; none: "
                        "ask for none (a whole node each on the test cluster)")
    parser.add_argument("--poll", type=float, default=None,
                        help="the region's poll (seconds); the daemon's default when unset")
    parser.add_argument("--export-none", action="store_true",
                        help="a third side: sbatch --export=NONE, the daemon's option")
    parser.add_argument("--py-spy", type=Path, default=None, dest="spy",
                        help="record the daemon with py-spy into this directory")
    parser.add_argument("--quiet-wait", type=float, default=600.0,
                        help="seconds to wait for other users' jobs to drain before a run")
    args = parser.parse_args()
    mem = None if args.mem == "none" else args.mem
    slots = partition_cpus("debug")
    sides = ["noduslocal", "sbatch"] + (["sbatch-none"] if args.export_none else [])
    ids: set[int] = set()
    prefixes: list[str] = []
    rows: list[dict[str, str]] = []
    latency_rows: list[dict[str, str]] = []
    slurm_rows: list[dict[str, str]] = []
    walls: dict[str, list[float]] = {side: [] for side in sides}
    try:
        for repeat in range(1, args.repeats + 1):
            current: dict[str, dict[str, str]] = {}
            for side in sides if repeat % 2 else sides[::-1]:
                busy = wait_quiet(args.quiet_wait)
                if side == "noduslocal":
                    run = run_noduslocal(args.jobs, mem, args.poll, ids, prefixes, args.spy,
                                         f"r{repeat}")
                    latency_rows.append({"repeat": str(repeat),
                                         **{k: f"{v:.2f}" for k, v in run.latency.items()}})
                else:
                    run = run_sbatch(args.jobs, mem, ids,
                                     ["--export=NONE"] if side == "sbatch-none" else [])
                walls[side].append(run.wall)
                slurm_rows.append({"repeat": str(repeat), **breakdown(run, slots)})
                spent = run.spent
                rpcs = spent["rpcs"]
                ours = side == "noduslocal"
                current[side] = {
                    "repeat": str(repeat), "runner": run.runner, "jobs": str(args.jobs),
                    "submit s": f"{run.submit:.2f}", "wall s": f"{run.wall:.2f}",
                    "x sbatch": "",
                    "daemon CPU s": f"{spent['daemon']:.2f}" if ours else "-",
                    "CPU ms/job": f"{1000 * spent['daemon'] / args.jobs:.1f}" if ours else "-",
                    "tools CPU s": f"{spent['tools']:.2f}",
                    "slurmctld CPU s": f"{spent['ctld']:.2f}",
                    "submit RPCs": str(rpcs.get("REQUEST_SUBMIT_BATCH_JOB", (0, 0))[0]),
                    "job-info RPCs": str(rpcs.get("REQUEST_JOB_INFO", (0, 0))[0]),
                    "other jobs": str(run.others + busy)
                    + (" (ctld restarted)" if spent["restarted"] else "")}
                rows.append(current[side])
            for side, row in current.items():
                row["x sbatch"] = f"{walls[side][-1] / walls['sbatch'][-1]:.2f}"
    finally:
        left = cancel_left(ids, prefixes)
    print(table(rows))
    print()
    print("From Slurm's logs (slurmctld's allocation and completion, slurmd's launch):")
    print(table(slurm_rows))
    print()
    print("noduslocal: where the time went (seconds from the first submit; ms from the "
          "shim's own start and end on the node to the SDK seeing Running and Succeeded)")
    print(table(latency_rows))
    ratios = [a / b for a, b in zip(walls["noduslocal"], walls["sbatch"], strict=True)]
    print()
    print(f"wall median: noduslocal {statistics.median(walls['noduslocal']):.2f} s, sbatch "
          f"{statistics.median(walls['sbatch']):.2f} s; ratio per repeat "
          f"{', '.join(f'{r:.2f}' for r in ratios)} (target <= 1.2: "
          f"{'met' if max(ratios) <= 1.2 else 'missed'})")
    print(f"left in squeue at the end: {left} (cancelled); "
          f"ours still listed now: {cancel_left(ids, prefixes)}")
    if args.spy is not None:
        for path in sorted(args.spy.glob("daemon-*.txt")):
            print()
            print(table(spy_top(path, SPY_RATE)))


if __name__ == "__main__":
    main()
