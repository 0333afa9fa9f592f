"""The dashboard's costs (issue 27): the jobs page's server time with 10,000 jobs in the
database, and an idle dashboard's CPU with a browser left on a page (its polls every 2 s).

    .venv/bin/python scripts/bench/dashboard.py [JOBS] [IDLE_S]
        targets: jobs page < 150 ms (server time), idle dashboard < 1 % of a core

JOBS jobs (10,000) are created on a daemon whose only CPU a `sleep` job holds, so all of
them wait: the jobs page lists everyone's active jobs (its first 200) and asks the queue for
their reasons and ETAs, the heaviest view. Server time is the dashboard's answer to one GET
from a client on the same host (the daemon's answers included), 5 warm-up requests, then 40.
Idle CPU: chromium (Debian's, through Playwright) keeps each page open for IDLE_S seconds
(60); the dashboard's utime+stime from /proc over that time, and the daemon's.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import urllib.request
from http.cookiejar import CookieJar
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, table

from noduslocal import testing
from noduslocal.domain.sockets import SOCKET_ENV

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_dashboard(socket: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "noduslocal.cli", "dashboard",
                             "--no-browser"], stdout=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, SOCKET_ENV: str(socket)})
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("the dashboard exited")
        if found := re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", line):
            return proc, found.group(0)


def timed(opener: urllib.request.OpenerDirector, url: str, n: int = 40) -> list[float]:
    for _ in range(5):
        opener.open(url).read()
    times = []
    for _ in range(n):
        start = time.perf_counter()
        body = opener.open(url).read()
        times.append(time.perf_counter() - start)
    assert b"<table" in body
    return times


def main() -> None:
    jobs = int(sys.argv[1]) if len(sys.argv) > 1 else 10_000
    idle = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    d = testing.Daemon(cpus=1, memory="8GiB", log_level="WARNING")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "blocker", "command": ["sleep", "3600"]}, retry=False)
        started = time.perf_counter()
        for i in range(jobs):
            client.create_job({"name": f"bench-{i}", "command": ["true"],
                               "labels": {"bench": "dashboard"}}, retry=False)
        print(f"created {jobs} waiting jobs in {time.perf_counter() - started:.1f} s",
              file=sys.stderr)
        proc, link = start_dashboard(d.socket)
        try:
            opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(CookieJar()))
            opener.open(link).read()
            base = link.split("/?", 1)[0]
            rows = [
                {"what": f"/jobs, {jobs} waiting (page)", **summary_ms(timed(opener,
                                                                             base + "/jobs"))},
                {"what": "/fragments/jobs (the 2 s poll)",
                 **summary_ms(timed(opener, base + "/fragments/jobs"))},
                {"what": "/fragments/jobs?phase=Pending&label=bench=dashboard",
                 **summary_ms(timed(opener, base + "/fragments/jobs?phase=Pending&label="
                                    "bench%3Ddashboard"))},
                {"what": "/queue (page)", **summary_ms(timed(opener, base + "/queue"))},
                {"what": "/gpus (page)", **summary_ms(timed(opener, base + "/gpus"))},
            ]
            print(table(rows))
            print()
            idle_rows = []
            # A fresh sign-in for the browser: the link works once, so start another.
            proc.terminate()
            proc.wait()
            proc, link = start_dashboard(d.socket)
            from playwright.sync_api import sync_playwright

            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM,
                                                     args=["--no-sandbox"])
                page = browser.new_page()
                page.goto(link)
                for path in ("/jobs", "/gpus", "/queue"):
                    page.goto(link.split("/?", 1)[0] + path)
                    time.sleep(3)  # settled
                    dash0, daemon0 = cpu_seconds(proc.pid), cpu_seconds(d.proc.pid)
                    time.sleep(idle)
                    dash1, daemon1 = cpu_seconds(proc.pid), cpu_seconds(d.proc.pid)
                    idle_rows.append({
                        "page left open": path, "seconds": f"{idle:g}",
                        "dashboard CPU %": f"{100 * (dash1 - dash0) / idle:.2f}",
                        "daemon CPU %": f"{100 * (daemon1 - daemon0) / idle:.2f}"})
                browser.close()
            print(table(idle_rows))
        finally:
            proc.terminate()
            proc.wait()
    finally:
        d.close()


if __name__ == "__main__":
    main()
