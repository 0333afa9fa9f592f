"""Sweeps: creating a 10,000-cell sweep in one call (target < 1 s), and 1,000 tasks of
`true` at --max-parallel 2 through `noduslocal map` on a daemon with cpus=2, submit to last
end, beside GNU parallel (`parallel -j2 true ::: 1..1000`) and task-spooler (`tsp -S 2`,
`tsp true I` for I in 1..1000: each runs the same command line) in the same run.

    python scripts/bench/sweeps.py [TASKS] [CELLS] [ROUNDS]   targets: create < 1 s; map
                                                              faster than parallel, near tsp
    BENCH_DATA_ROOT=/dev/shm ...   the daemon's directory in RAM (CELLS 0: skip creates)
    BENCH_KEEP=1 ...               leave the daemons' directories (for runs back to back:
                                   on a file system without a journal, inodes deleted in
                                   the last minutes make every new one dearer)
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import remove_unless_kept, summary_ms, table
from throughput import run_tsp

from noduslocal import testing
from noduslocal.daemon.runtime import compiled_shim


def create_times(cells: int, rounds: int) -> list[float]:
    side = int(cells ** 0.5)
    times = []
    with testing.daemon(cpus=2, log_level="WARNING") as d:
        client = d.client()
        client.create_job({"name": "hold", "command": ["sleep", "600"], "cpu": 2})
        for r in range(rounds):
            start = time.perf_counter()
            created = client.create_sweep({
                "name": f"big-{r}", "template": {"command": ["true"]},
                "grid": {"A": list(range(side)), "B": list(range(cells // side))}})
            times.append(time.perf_counter() - start)
            assert created["cells"] == side * (cells // side)
            client.cancel_sweep(f"big-{r}")
    return times


def run_map(n: int, root: str | None, made: list[Path]) -> tuple[float, float]:
    """`root`: where the daemon's directory goes (default: a new one in /tmp). Its files
    are removed only at the end of the run (`made`): on a file system without a journal,
    inodes deleted in the last minutes make every new file slower to allocate, and one
    round's cleanup would slow the next."""
    d = testing.Daemon(tempfile.mkdtemp(prefix="nl-bench-", dir=root), cpus=2,
                       log_level="WARNING")
    made.append(d.root)
    try:
        d.start()
        cpu = busy_cpu_seconds()
        start = time.perf_counter()
        map_of_true(d, n)
        total = time.perf_counter() - start
        cpu = busy_cpu_seconds() - cpu
    finally:
        if d.proc is not None:
            d.kill()
        # Its cgroups, which a killed daemon leaves (hundreds after a long series of
        # runs); its directories stay (see above).
        d.remove_cgroups()
    return total, cpu


def map_of_true(d: testing.Daemon, n: int) -> None:
    """`noduslocal map --no-code --max-parallel 2 -- true ::: 0..n-1` against D and its
    `sweep wait`, as a user types them; every task must have succeeded."""
    exe = shutil.which("noduslocal", path=str(Path(sys.executable).parent)) or "noduslocal"
    env = {**os.environ, "NODUSLOCAL_SOCKET": str(d.socket)}
    subprocess.run([exe, "map", "--no-code", "--name", "tp", "--max-parallel", "2", "--",
                    "true", ":::", *map(str, range(n))], env=env, check=True,
                   capture_output=True)
    subprocess.run([exe, "sweep", "wait", "tp"], env=env, check=True, capture_output=True)
    assert d.client().get_sweep("tp")["counts"] == {"Succeeded": n}


def interpreter() -> str:
    """Which Python runs the daemon and the CLIs (sys.executable's), and whether it calls
    into a shared libpython: this VM's pyenv build does, and ran the daemon's loop 10 to
    20 % dearer than Debian's /usr/bin/python3.11, which has the interpreter linked in and
    is what install.sh and a fresh box's scripts use (issue 25, part 5)."""
    maps = Path("/proc/self/maps").read_text()
    shared = "libpython" in maps
    return (f"python {platform.python_version()} ({os.path.realpath(sys.executable)}, "
            f"{'libpython shared' if shared else 'libpython linked in'})")


def busy_cpu_seconds() -> float:
    """CPU time every process of the machine has used (/proc/stat: all but idle and
    iowait), so a runner's cost counts its daemon, helpers, shims and jobs alike."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(fields[:8]) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def run_parallel(n: int) -> float | None:
    exe = shutil.which("parallel")
    if exe is None:
        return None
    start = time.perf_counter()
    subprocess.run([exe, "--will-cite", "-j2", "true", ":::", *map(str, range(n))],
                   check=True)
    return time.perf_counter() - start


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    cells = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    root = os.environ.get("BENCH_DATA_ROOT")  # e.g. /dev/shm: the daemon's files in RAM
    shim = compiled_shim.find(Path(tempfile.gettempdir()))
    print(f"shim: {shim.name if shim else 'python'}; daemon directory in {root or '/tmp'}; "
          f"{interpreter()}")
    if cells:
        created = create_times(cells, 5)
        print(table([{"what": f"create a {cells}-cell sweep (one call, 5 rounds)",
                      **summary_ms(created)}]))
        print()
    rows = []
    made: list[Path] = []

    def row(runner: str, run: Callable[[], float | tuple[float, float] | None]) -> None:
        """`run` returns its time, or its time and the CPU of just that (no startup)."""
        before = busy_cpu_seconds()
        result = run()
        total, cpu = result if isinstance(result, tuple) else (
            result, busy_cpu_seconds() - before)
        rows.append({"runner": runner, "tasks": str(n), "total s": f"{total:.2f}",
                     "tasks/s": f"{n / total:.0f}", "CPU ms/task": f"{1000 * cpu / n:.2f}"}
                    if total else {"runner": f"{runner}: not installed"})

    runners: list[tuple[str, Callable[[], float | tuple[float, float] | None]]] = [
        ("noduslocal map --max-parallel 2 (cpus=2)", lambda: run_map(n, root, made)),
        ("GNU parallel -j2", lambda: run_parallel(n)),
        ("task-spooler (tsp -S 2)",
         lambda: (run_tsp(n, numbered=True) or (0.0, 0.0))[1] or None)]
    # Interleaved: this VM's speed drifts from minute to minute. Each round starts with
    # the next runner: the first run after a quiet spell was the slowest of its series,
    # and the map always went first.
    for r in range(rounds):
        turn = r % len(runners)
        for runner, run in runners[turn:] + runners[:turn]:
            row(f"{r + 1}: {runner}", run)
    print(table(rows))
    remove_unless_kept(made)


if __name__ == "__main__":
    main()
