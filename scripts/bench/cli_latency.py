"""The CLI and the SDK import as whole processes, median over N runs each, interleaved
with the floor (`python -c pass` from the same interpreter), against a daemon whose jobs stay
queued: `import noduslocal` and `job list` of a queue of 20 jobs, then
`job run --detach -- true` (so the list's length does not grow with the submits).

Measured twice: from the checkout's editable install (.venv: setuptools' editable finder
runs in every interpreter there, the floor included), and from a regular install as pip lays
one out (a venv with the package copied into site-packages and compiled, bin/noduslocal as
pip installs it, the dependencies reached through a .pth), which is what an installed box
runs.

    python scripts/bench/cli_latency.py [N]    targets: submit and list <= 40 ms median,
                                               import noduslocal <= 30 ms
"""

from __future__ import annotations

import compileall
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, table

from noduslocal import testing
from noduslocal.domain import errors

REPO = Path(__file__).resolve().parents[2]
def regular_install(where: Path) -> tuple[str, str]:
    """A venv at WHERE holding this checkout as a regular install; its python and CLI."""
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    site = Path(subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True).stdout.strip())
    shutil.copytree(REPO / "noduslocal", site / "noduslocal",
                    ignore=shutil.ignore_patterns("__pycache__"))
    compileall.compile_dir(site / "noduslocal", quiet=1)
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    cli = where / "bin" / "noduslocal"  # as pip installs a script file: its shebang rewritten
    cli.write_text((REPO / "bin" / "noduslocal").read_text().replace("#!python", f"#!{python}", 1))
    cli.chmod(0o755)
    return str(python), str(cli)


def measure(python: str, cli: str, env: dict[str, str], n: int) -> dict[str, list[float]]:
    floor = "python -c pass (the floor)"
    rounds = [
        {floor: [python, "-c", "pass"],
         "python -c 'import noduslocal'": [python, "-c", "import noduslocal"],
         "noduslocal job list (20 jobs)": [cli, "job", "list"]},
        {floor: [python, "-c", "pass"],
         "noduslocal job run --detach -- true": [cli, "job", "run", "--detach", "--",
                                                 "true"]},
    ]
    times: dict[str, list[float]] = {}
    for commands in rounds:
        for i in range(n + 3):
            for what, argv in commands.items():
                start = time.perf_counter()
                subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
                if i >= 3:  # the first runs fill the page cache
                    times.setdefault(what, []).append(time.perf_counter() - start)
    return times


def queue(client: object) -> None:
    """The blocker and 19 queued jobs, and nothing else pending (a run's submits go)."""
    for job in client.list_jobs():  # type: ignore[attr-defined]
        if job["name"] != "blocker" and not job["name"].startswith("queued-"):
            client.cancel_job(job["name"])  # type: ignore[attr-defined]
    for i in range(19):
        name = f"queued-{i}"
        try:
            client.get_job(name)  # type: ignore[attr-defined]
        except errors.NotFound:
            client.create_job({"name": name, "command": ["true"]},  # type: ignore[attr-defined]
                              retry=False)


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    dev_cli = shutil.which("noduslocal", path=str(Path(sys.executable).parent))
    if dev_cli is None:
        sys.exit("noduslocal is not installed; run scripts/test.sh or pip install -e .")
    # Byte code as an install has it (this environment may forbid writing it on import).
    compileall.compile_dir(REPO / "noduslocal", quiet=1)
    d = testing.Daemon(cpus=1, log_level="WARNING")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "blocker", "command": ["sleep", "600"]}, retry=False)
        env = {**os.environ, "NODUSLOCAL_SOCKET": str(d.socket)}
        with tempfile.TemporaryDirectory(prefix="nl-bench-") as tmp:
            runs = {"editable (.venv)": (sys.executable, dev_cli),
                    "installed": regular_install(Path(tmp) / "venv")}
            rows = []
            for install, (python, cli) in runs.items():
                queue(client)
                for what, took in measure(python, cli, env, n).items():
                    rows.append({"install": install, "what": what, **summary_ms(took),
                                 "median ms": f"{statistics.median(took) * 1000:.1f}"})
        print(table(rows))
    finally:
        d.close()


if __name__ == "__main__":
    main()
