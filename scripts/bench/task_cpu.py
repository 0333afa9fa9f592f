"""Where a short task's CPU goes: one `noduslocal map --no-code --max-parallel 2` of `true`
and its `sweep wait` on a fresh daemon (cpus=2), per task: the machine's busy CPU, the
daemon's event loop and its other threads (user and system), the two CLIs, the spawner, and
what is left (shims, the jobs, the kernel's work for them).

    python scripts/bench/task_cpu.py [TASKS] [ROUNDS]      default 1000 tasks, 3 rounds
    BENCH_DATA_ROOT=/dev/shm ...                           the daemon's directory in RAM
    BENCH_KEEP=1 ...                                       leave the daemons' directories

Each round's directory is removed only at the end (as in sweeps.py: on a file system
without a journal, inodes deleted in the last minutes make every new one dearer).
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import remove_unless_kept, table
from sweeps import busy_cpu_seconds, map_of_true

from noduslocal import testing

TICK = os.sysconf("SC_CLK_TCK")


def stat_fields(path: Path) -> list[str]:
    text = path.read_text()
    return text[text.rindex(")") + 2:].split()


def threads(pid: int) -> dict[int, tuple[int, int]]:
    """Each thread of PID: (user, system) ticks."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = stat_fields(task / "stat")
        found[int(task.name)] = (int(fields[11]), int(fields[12]))
    return found


def children_of(pid: int) -> dict[int, int]:
    """The direct children of PID: their own user + system ticks."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fields = stat_fields(proc / "stat")
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[1]) == pid:
            found[int(proc.name)] = int(fields[11]) + int(fields[12])
    return found


def one_round(n: int, root: str | None, made: list[Path]) -> dict[str, str]:
    d = testing.Daemon(tempfile.mkdtemp(prefix="nl-bench-", dir=root), cpus=2,
                       log_level="WARNING")
    made.append(d.root)
    try:
        d.start()
        assert d.proc is not None
        pid = d.proc.pid
        before_threads, before_children = threads(pid), children_of(pid)
        before_busy = busy_cpu_seconds()
        before_cli = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        map_of_true(d, n)
        wall = time.perf_counter() - start
        busy = (busy_cpu_seconds() - before_busy) * TICK
        after_cli = resource.getrusage(resource.RUSAGE_CHILDREN)
        after_threads, after_children = threads(pid), children_of(pid)
    finally:
        if d.proc is not None:
            d.kill()
        # Its cgroups, which a killed daemon leaves (hundreds after a long series of
        # runs); its directories stay (see above).
        d.remove_cgroups()

    def ms(ticks: float) -> str:
        return f"{1000 * ticks / TICK / n:.2f}"

    loop_user = after_threads[pid][0] - before_threads[pid][0]
    loop_system = after_threads[pid][1] - before_threads[pid][1]
    others = sum(u + s - sum(before_threads.get(tid, (0, 0)))
                 for tid, (u, s) in after_threads.items() if tid != pid)
    spawner = sum(t - before_children.get(c, 0) for c, t in after_children.items())
    cli = (after_cli.ru_utime + after_cli.ru_stime
           - before_cli.ru_utime - before_cli.ru_stime) * TICK
    daemon = loop_user + loop_system + others
    return {"wall s": f"{wall:.2f}", "machine": ms(busy), "daemon loop": ms(loop_user) + "+"
            + ms(loop_system), "daemon threads": ms(others), "CLIs": ms(cli),
            "spawner": ms(spawner), "the rest": ms(busy - daemon - cli - spawner)}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    root = os.environ.get("BENCH_DATA_ROOT")
    print(f"{n} tasks of `true`, --max-parallel 2, daemon directory in {root or '/tmp'}; "
          "CPU in ms a task (the loop as user+system; the rest: shims, jobs, kernel)")
    made: list[Path] = []
    print(table([one_round(n, root, made) for _ in range(rounds)]))
    remove_unless_kept(made)


if __name__ == "__main__":
    main()
