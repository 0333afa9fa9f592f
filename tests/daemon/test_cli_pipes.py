"""Issue 28: a reader that stops early (`| head`) ends the command quietly: no traceback on
stderr, on the fast path (`job list`) or click's, with a tool's usual failing status."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from noduslocal import testing

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args", [["job", "list", "--all"], ["job", "list", "--all", "--json"],
                                  ["--help"], ["help", "map"], ["queue"], ["events"]])
def test_a_closed_pipe_ends_it_quietly(daemon: testing.Daemon, args: list[str]) -> None:
    client = daemon.client()
    for _ in range(3):
        client.create_job({"command": ["true"], "labels": {"test": "pipes"}})
    read, write = os.pipe()
    os.close(read)  # nobody reads: the first write fails with EPIPE
    try:
        done = subprocess.run([sys.executable, "-m", "noduslocal.cli", *args], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=60, cwd=REPO,
                              env={**os.environ, "NODUSLOCAL_SOCKET": str(daemon.socket)})
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode in (0, 1, 141), (done.returncode, done.stderr)


def test_the_client_imports_none_of_the_daemon_s_dependencies() -> None:
    """Issue 28: the SDK and the CLI load without aiosqlite, docker, NVML, watchfiles or
    aiohttp (only `dashboard` and `exec -it` take aiohttp, when they run)."""
    probe = ("import sys, noduslocal, noduslocal.sdk.client, noduslocal.cli.main, "
             "noduslocal.cli.root\n"
             "import noduslocal as nodus\n"
             "heavy = {'aiosqlite', 'docker', 'pynvml', 'watchfiles', 'aiohttp',"
             " 'prometheus_client'}\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, cwd=REPO)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_map_and_sweep_wait_into_a_pipe_draw_nothing_and_wait_on_the_canary(
        daemon: testing.Daemon) -> None:
    """Into a pipe `map` and `sweep wait` load no rich (it draws nothing there, and loading
    it was half of each command's CPU), and `map` waits on its canary in long polls: it
    slept half a second before its first look, and returned that late after a short one."""
    probe = ("import sys, time\n"
             "slept = []\n"
             "real = time.sleep\n"
             "time.sleep = lambda s: (slept.append(s), real(s))[1]\n"
             # As cli/main.py does, without the fast path's os._exit (which would leave
             # nothing printed here).
             "from noduslocal.cli import fast\n"
             "code = fast.run(sys.argv[1:])\n"
             "if code is None:\n"
             "    from noduslocal.cli.root import main\n"
             "    try:\n"
             "        main()\n"
             "    except SystemExit as exc:\n"
             "        code = exc.code\n"
             "print(code, 'rich' in sys.modules, max(slept, default=0), file=sys.stderr)\n")
    env = {**os.environ, "NODUSLOCAL_SOCKET": str(daemon.socket)}
    said = []
    for args in (["map", "--no-code", "--name", "piped", "--", "true", ":::", "1", "2"],
                 ["sweep", "wait", "piped"]):
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True,
                              text=True, timeout=120, cwd=REPO, env=env)
        said.append(done.stderr.splitlines()[-1])
    assert said[0].split()[:2] == ["0", "False"], said
    assert float(said[0].split()[2]) < 0.5, said  # no sleep of CANARY_POLL's length
    assert said[1].split()[:2] == ["0", "False"], said
