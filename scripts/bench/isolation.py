"""One user's heavy load must not stall another's work: the review's load shapes from one
user (root) while a second Unix user (nlbench, made here) times its own small requests.

    python scripts/bench/isolation.py [listings|all] [CELLS]     # as root
    cd OLD && PYTHONPATH=OLD python /path/to/isolation.py ...     # the code before

(`python -m noduslocal.daemon.main` puts its working directory first on the path, so the old
code's daemon runs only from the old checkout's directory.)

`listings`: a sweep of CELLS cells (100,000) and six readers each paging through
`GET /v1/jobs?all=1` without pause. `all` adds a job that printed 100 MB with no newline
read by ten `logs?tail=1` loops, and a 2-rank gang printing 100 MB per rank. The other user
meanwhile times `job list` (its default page), `/v1/health`, and `job run -- true` (create,
then wait until it ended). Targets: job list < 0.5 s, health < 100 ms, job run < 1 s.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import pwd
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, table

import noduslocal
from noduslocal import testing
from noduslocal.domain import errors
from noduslocal.sdk.api_client import ApiClient

USER, GROUP = "nlbench", "noduslocal"
READERS, TAILERS = 6, 10


def ensure_user() -> pwd.struct_passwd:
    with contextlib.suppress(KeyError):
        grp.getgrnam(GROUP)
        return pwd.getpwnam(USER)
    subprocess.run(["groupadd", "-f", GROUP], check=True)
    with contextlib.suppress(KeyError):
        return pwd.getpwnam(USER)
    subprocess.run(["useradd", "-M", "-G", GROUP, USER], check=True)
    return pwd.getpwnam(USER)


def list_everything(client: ApiClient, stop: threading.Event, pages: list[int]) -> None:
    """A reader that pages through every job, again and again (the review's
    `?all=1&limit=100000`, as the paged API answers it)."""
    while not stop.is_set():
        before = None
        while not stop.is_set():
            page = client.transport.request("GET", "/v1/jobs", query={
                "all": "1", "limit": 100_000, "before": before}, timeout=600)
            pages.append(len(page["jobs"]))
            if not (before := page.get("next")):
                break


def tail(client: ApiClient, stop: threading.Event, count: list[int]) -> None:
    while not stop.is_set():
        for _ in client.transport.stream("/v1/jobs/longline/logs", query={"tail": 1},
                                         timeout=600):
            pass
        count.append(1)


def measure(socket: Path, uid: int, gid: int, rounds: int, out: int) -> None:
    """In a forked child as the other user: time its requests, write them as JSON."""
    os.setgroups([grp.getgrnam(GROUP).gr_gid])
    os.setgid(gid)
    os.setuid(uid)
    client = ApiClient(socket)
    times: dict[str, list[float]] = {"health": [], "job list": [], "job run -- true": []}
    for index in range(rounds):
        start = time.perf_counter()
        client.transport.request("GET", "/v1/health")
        times["health"].append(time.perf_counter() - start)
        start = time.perf_counter()
        client.list_jobs()
        times["job list"].append(time.perf_counter() - start)
        if index % 3 == 0:
            start = time.perf_counter()
            client.create_job({"name": f"probe-{index}", "command": ["true"], "cpu": 0.1})
            client.wait_job(f"probe-{index}")
            times["job run -- true"].append(time.perf_counter() - start)
        time.sleep(0.05)
    os.write(out, json.dumps(times).encode())
    os.close(out)


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "listings"
    cells = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
    user = ensure_user()
    where = Path(noduslocal.__file__).resolve().parent.parent
    with testing.daemon(cpus=2, memory="8GiB", log_level="WARNING") as d:
        client = d.client()
        start = time.perf_counter()
        client.create_sweep({"name": "big", "canary": "none", "max_parallel": 1,
                             "template": {"command": ["sleep", "3600"], "cpu": 0.1},
                             "grid": {"I": [str(i) for i in range(cells)]}})
        print(f"sweep of {cells} cells accepted in {time.perf_counter() - start:.1f} s",
              file=sys.stderr)
        stop = threading.Event()
        threads: list[threading.Thread] = []
        pages: list[int] = []
        tails: list[int] = []
        if mode == "all":
            client.create_job({"name": "longline", "cpu": 0.1, "command": [
                "sh", "-c", "head -c 100000000 /dev/zero | tr '\\0' A"]})
            client.wait_job("longline", timeout=300)
            client.create_job({"name": "gang", "cpu": 0.1,
                               "distributed": {"nodes": 2},
                               "command": ["sh", "-c", "yes | head -c 100000000"]})
            threads += [threading.Thread(target=tail, args=(d.client(), stop, tails))
                        for _ in range(TAILERS)]
        threads += [threading.Thread(target=list_everything, args=(d.client(), stop, pages))
                    for _ in range(READERS)]
        for thread in threads:
            thread.start()
        time.sleep(2)  # every reader under way
        read, write = os.pipe()
        child = os.fork()
        if child == 0:
            os.close(read)
            try:
                measure(d.socket, user.pw_uid, user.pw_gid, 30, write)
            finally:
                os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            times = json.loads(pipe.read() or "{}")
        os.waitpid(child, 0)
        stop.set()
        for thread in threads:
            with contextlib.suppress(errors.NodusError):
                thread.join(timeout=120)
    print(table([{"what": f"{what} as {USER} ({mode}; {where})", **summary_ms(values)}
                 for what, values in times.items()]))
    print(f"load: {len(pages)} pages of jobs read by {READERS} readers, {len(tails)} tails",
          file=sys.stderr)


if __name__ == "__main__":
    main()
