"""What a sweep's code costs each task (issue 25): `noduslocal map --max-parallel 2` from a
code directory of 400 files (20 MB), a 10 MB `.git` and a 10 MB `data/` that `.gitignore`
lists, against the same tasks with `--no-code`, in one run on one daemon each, the pair
repeated ROUNDS times in turn (a shared box drifts; the ratio is each round's). Each task
checks it sees neither `.git` nor `data/` (and, with code, the code). After the timed sweep
with code, an untimed one of REWRITERS tasks on the same daemon checks that a code file is
as uploaded and then rewrites it, so a task that saw another's rewrite fails it (untimed:
overlayfs fsyncs each copied-up file, a cost of the tasks that write code files, not of the
code's delivery, which the timed tasks compare like for like). The table gives the wall
time, its ratio to `--no-code`, how much the jobs directory grew per task and the daemon's
snapshot store (the one unpacked copy a sweep's tasks share).

    python scripts/bench/code_snapshot.py [TASKS [ROUNDS]]   targets: with code <= 1.3x
                                        --no-code, <= 256 KB of jobs directory per task
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import table

from noduslocal import testing

FILES = 400
FILE_BYTES = 50 * 1000  # 400 x 50 kB = 20 MB
SIDE_BYTES = 10 * 1000 * 1000  # .git and data/, 10 MB each
# Fails the task (and so the sweep) if what should have been left out reached it, or (with
# code) if the code did not.
LEFT_OUT = "test ! -e .git && test ! -e data"
MARKED, MARK = "pkg/file-0000.py", "original"  # the code file every task rewrites


def make_code(root: Path) -> Path:
    code = root / "code"
    pkg = code / "pkg"
    pkg.mkdir(parents=True)
    for i in range(FILES):
        (pkg / f"file-{i:04d}.py").write_bytes(os.urandom(FILE_BYTES))
    (code / MARKED).write_bytes(f"{MARK}\n".encode() + os.urandom(FILE_BYTES - 9))
    for side in (".git/objects/pack", "data"):
        (code / side).mkdir(parents=True)
        (code / side / "blob").write_bytes(os.urandom(SIDE_BYTES))
    (code / ".gitignore").write_text("data/\n")
    return code


def du(path: Path) -> int:
    """Bytes allocated under `path` (what the disk lost to it), not apparent sizes, on its
    own file system (never through a mount below it); 0 if it does not exist."""
    if not path.exists():
        return 0
    out = subprocess.run(["du", "-s", "-x", "-B1", str(path)], capture_output=True,
                         text=True, check=True).stdout
    return int(out.split()[0])


# A task's check that the code file it reads starts as uploaded, then its rewrite.
REWRITE = (f"read first < {MARKED} && [ \"$first\" = {MARK} ] && echo rewritten > {MARKED}")
REWRITERS = 20


def sweep(exe: str, env: dict[str, str], code: Path, d: testing.Daemon, name: str,
          tasks: int, command: str, *flags: str) -> None:
    subprocess.run([exe, "map", "--name", name, "--max-parallel", "2", *flags, "--", "sh",
                    "-c", command, ":::", *map(str, range(tasks))], env=env, cwd=code,
                   check=True, capture_output=True)
    subprocess.run([exe, "sweep", "wait", name], env=env, check=True, capture_output=True)
    counts = d.client().get_sweep(name)["counts"]
    assert counts == {"Succeeded": tasks}, (name, counts)


def run(tasks: int, code: Path, with_code: bool) -> tuple[float, int, int]:
    d = testing.Daemon(cpus=2, log_level="WARNING")
    try:
        d.start()
        env = {**os.environ, "NODUSLOCAL_SOCKET": str(d.socket)}
        exe = shutil.which("noduslocal", path=str(Path(sys.executable).parent)) or "noduslocal"
        jobs = d.data_dir / "jobs"
        before = du(jobs)
        start = time.perf_counter()
        if with_code:
            sweep(exe, env, code, d, "cs", tasks, f"{LEFT_OUT} && test -e pkg/file-0399.py")
        else:
            sweep(exe, env, code, d, "cs", tasks, LEFT_OUT, "--no-code")
        took = time.perf_counter() - start
        grown = du(jobs) - before
        if with_code:
            sweep(exe, env, code, d, "rewrite", REWRITERS, REWRITE)
        return took, grown, du(d.data_dir / "snapshots")
    finally:
        d.close()


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="nl-bench-code-") as tmp:
        code = make_code(Path(tmp))
        for round_ in range(1, rounds + 1):
            bare, bare_bytes, bare_store = run(tasks, code, with_code=False)
            full, full_bytes, full_store = run(tasks, code, with_code=True)
            rows += [{"round": str(round_), "runner": name, "tasks": str(tasks),
                      "total s": f"{took:.2f}", "x --no-code": f"{took / bare:.2f}",
                      "jobs dir KB/task": f"{grown / tasks / 1024:.0f}",
                      "snapshots KB": f"{store / 1024:.0f}"}
                     for name, took, grown, store in (
                         ("map --no-code", bare, bare_bytes, bare_store),
                         ("map (code: cwd)", full, full_bytes, full_store))]
    print(table(rows))


if __name__ == "__main__":
    main()
