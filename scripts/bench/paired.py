"""Two source trees of noduslocal compared on one 1,000-task `map --no-code` of `true`, in
interleaved pairs (a fresh daemon per run, the order swapped from pair to pair), reported as
the medians of the pairs' ratios: this VM's speed drifts by more than most changes.

    python scripts/bench/paired.py BEFORE_TREE AFTER_TREE [PAIRS] [TASKS]   default 8, 1000
    (a tree: a checkout or `git worktree add /tmp/wt-x COMMIT`; each run imports it)

Per run: the wall time, the machine's busy CPU a task (/proc/stat), and the daemon's CPU a
task (its threads' schedstat, exact to the nanosecond). The daemons' directories are left
until the end (BENCH_KEEP=1: left in place), as in sweeps.py.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import remove_unless_kept, table

# One run, in a process that imports the tree under test (PYTHONPATH); the map and the
# machine's CPU are sweeps.py's.
ONE_RUN = r"""
import sys, tempfile, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from sweeps import busy_cpu_seconds, map_of_true
from noduslocal import testing
n, root = int(sys.argv[1]), sys.argv[2]
d = testing.Daemon(tempfile.mkdtemp(prefix="nl-pair-", dir=root), cpus=2,
                   log_level="WARNING")
d.start()
def daemon_cpu():
    return sum(int((t / "schedstat").read_text().split()[0])
               for t in Path(f"/proc/{d.proc.pid}/task").iterdir()) / 1e9
b0, c0, w = busy_cpu_seconds(), daemon_cpu(), time.perf_counter()
map_of_true(d, n)
w, b1, c1 = time.perf_counter() - w, busy_cpu_seconds(), daemon_cpu()
d.kill()
d.remove_cgroups()  # a killed daemon leaves them: hundreds after a long series of runs
print(d.root, w, 1000 * (b1 - b0) / n, 1000 * (c1 - c0) / n)
"""


def run(tree: Path, tasks: int, root: str) -> tuple[Path, float, float, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", ONE_RUN, str(tasks), root,
                          str(Path(__file__).resolve().parent)], env=env,
                         check=True, capture_output=True, text=True, cwd="/").stdout.split()
    return Path(out[0]), float(out[1]), float(out[2]), float(out[3])


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    before, after = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 8
    tasks = int(sys.argv[4]) if len(sys.argv) > 4 else 1000
    root = os.environ.get("BENCH_DATA_ROOT") or tempfile.gettempdir()
    made: list[Path] = []
    ratios: list[tuple[float, float, float]] = []
    rows = []
    for i in range(pairs):
        order = (before, after) if i % 2 == 0 else (after, before)
        got = {}
        for tree in order:
            directory, *values = run(tree, tasks, root)
            made.append(directory)
            got[tree] = values
        ratios.append(tuple(a / b for a, b in zip(got[after], got[before], strict=True)))
        rows.append({"pair": str(i + 1),
                     **{f"{name} {what}": f"{got[tree][k]:.2f}"
                        for name, tree in (("before", before), ("after", after))
                        for k, what in enumerate(("wall s", "CPU ms", "daemon ms"))}})
    print(table(rows))
    print()
    print(table([{"after / before (medians of the pairs' ratios)": what,
                  "ratio": f"{statistics.median(r[k] for r in ratios):.3f}",
                  "each": " ".join(f"{r[k]:.2f}" for r in ratios)}
                 for k, what in enumerate(("wall", "machine CPU a task",
                                           "daemon CPU a task"))]))
    remove_unless_kept(made)


if __name__ == "__main__":
    main()
