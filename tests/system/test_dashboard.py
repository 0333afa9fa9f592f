"""Issue 27: `noduslocal dashboard` in a real browser (Debian's chromium driven by
Playwright), run by two Unix users against a real daemon with the stand-in NVML: live jobs,
logs, sweeps and GPU charts; no console errors; and the guard: the one-time token, the
cookie, the Host header, CSRF, and a second user who cannot read or cancel the first's work.
The GPUs and Sweep screenshots in docs/ are taken here, with NODUSLOCAL_DOCS_SCREENSHOTS=1
(else into the test's directory: a run of the suite leaves the checkout as it was).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.testing import wait_until
from tests.nvml_standin.build import build_or_skip, sample_state, write_state
from tests.system.lab import DEADLINE, REPO, SYSTEM_PYTHON, Box, open_box

pytestmark = [pytest.mark.root, pytest.mark.browser, pytest.mark.beside]

CHROMIUM = "/usr/bin/chromium"
ALICE, BOB = "nldalice", "nldbob"
DOCS = REPO / "docs"
SCREENSHOTS_ENV = "NODUSLOCAL_DOCS_SCREENSHOTS"  # 1: the screenshots replace docs/'s


def screenshot(page: Any, name: str, tmp_path: Path) -> None:
    """The page, whole, as docs/NAME where SCREENSHOTS_ENV asks for it, else beside the
    test (taken all the same: it fails on a page that cannot be drawn)."""
    where = DOCS if os.environ.get(SCREENSHOTS_ENV) == "1" else tmp_path
    page.screenshot(path=str(where / name), full_page=True)


def unavailable(message: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        unavailable("playwright is not installed (scripts/test.sh installs it in the venv)")
    if not os.access(CHROMIUM, os.X_OK):
        unavailable(f"{CHROMIUM} is missing (scripts/test.sh installs Debian's chromium)")
    with sync_playwright() as playwright:
        # --no-sandbox: chromium's sandbox refuses to run as root.
        chromium = playwright.chromium.launch(executable_path=CHROMIUM,
                                              args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Box]:
    lib = build_or_skip(tmp_path_factory.mktemp("nvml"))
    state = tmp_path_factory.mktemp("nvml-state") / "nvml.json"
    busy = sample_state(2)
    busy["gpus"][0]["utilization_gpu"] = 63
    write_state(state, busy)
    os.chmod(state.parent, 0o755)
    before = os.environ.get("NODUS_FAKE_NVML")
    os.environ["NODUS_FAKE_NVML"] = str(state)  # the daemon inherits it
    try:
        # keep_group: the other system tests' boxes run beside this one and need the group.
        with open_box(config=f'nvml_library = "{lib}"\ngpu_poll = 0.2\n',
                      names=(ALICE, BOB), keep_group=True) as box:
            yield box
    finally:
        if before is None:
            os.environ.pop("NODUS_FAKE_NVML", None)
        else:
            os.environ["NODUS_FAKE_NVML"] = before


@dataclass
class Dashboard:
    """One user's `noduslocal dashboard`, and a browser page signed in to it."""

    proc: subprocess.Popen[str]
    link: str
    page: Any = None
    problems: list[str] = field(default_factory=list)

    @property
    def base(self) -> str:
        return self.link.split("/?", 1)[0]

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    def goto(self, path: str) -> None:
        self.page.goto(self.base + path)

    def close(self) -> None:
        if self.page is not None:
            self.page.close()
        self.proc.terminate()
        self.proc.communicate(timeout=30)


def start_dashboard(lab: Box, user: str) -> Dashboard:
    if user == "root":
        argv = [sys.executable, "-m", "noduslocal.cli", "dashboard", "--no-browser"]
        env: dict[str, str] | None = {**os.environ, SOCKET_ENV: str(lab.daemon.socket)}
        cwd = REPO
    else:
        argv = lab.argv_as(user, SYSTEM_PYTHON, "-m", "noduslocal.cli", "dashboard",
                           "--no-browser")
        env, cwd = None, lab.lib
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
    assert proc.stdout is not None
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the dashboard of {user} exited: {proc.communicate()}")
        if found := re.search(r"http://127\.0\.0\.1:\d+/\?token=\S+", line):
            return Dashboard(proc, found.group(0))
    raise AssertionError(f"the dashboard of {user} printed no link")


def sign_in(dash: Dashboard, browser: Any) -> Dashboard:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("console", lambda m: dash.problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda exc: dash.problems.append(f"page error: {exc}"))
    page.on("dialog", lambda dialog: dialog.accept())
    page.goto(dash.link)
    assert "token=" not in page.url, page.url  # the token is gone from the address
    dash.page = page
    return dash


@pytest.fixture
def alice(lab: Box, browser: Any) -> Iterator[Dashboard]:
    dash = sign_in(start_dashboard(lab, ALICE), browser)
    yield dash
    problems = list(dash.problems)
    dash.close()
    assert problems == [], problems  # no page had a console error


def run_cli(lab: Box, user: str, *args: str) -> str:
    done = lab.cli(user, *args)
    assert done.returncode == 0, f"{done.stdout}{done.stderr}"
    return done.stdout


def request(dash: Dashboard, method: str, path: str, *, host: str | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, str]:
    """One plain HTTP request to the dashboard (no browser, no cookie unless given)."""
    conn = http.client.HTTPConnection("127.0.0.1", dash.port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True)
        conn.putheader("Host", host or f"127.0.0.1:{dash.port}")
        for key, value in (headers or {}).items():
            conn.putheader(key, value)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read().decode(errors="replace")
    finally:
        conn.close()


def cookie_header(dash: Dashboard) -> dict[str, str]:
    cookies = dash.page.context.cookies()
    return {"Cookie": "; ".join(f"{c['name']}={c['value']}" for c in cookies)}


# --- the views ------------------------------------------------------------------------------


def test_the_jobs_page_shows_a_running_job_and_one_started_later(lab: Box,
                                                                 alice: Dashboard) -> None:
    run_cli(lab, ALICE, "job", "run", "-d", "--name", "first", "--", "sleep", "60")
    try:
        alice.goto("/jobs")
        alice.page.wait_for_selector("table.jobs >> text=first", timeout=DEADLINE * 1000)
        row = alice.page.locator("table.jobs tr", has_text="first")
        wait_until(lambda: "Running" in row.inner_text(), "first never showed Running")
        run_cli(lab, ALICE, "job", "run", "-d", "--name", "second", "--", "sleep", "60")
        # No reload: the table asks again by itself.
        alice.page.wait_for_selector("table.jobs >> text=second", timeout=DEADLINE * 1000)
        assert alice.page.url.endswith("/jobs")
    finally:
        lab.cli(ALICE, "job", "kill", "first")
        lab.cli(ALICE, "job", "kill", "second")


def test_a_job_page_shows_log_lines_as_they_come_and_search_finds_one(
        lab: Box, alice: Dashboard) -> None:
    run_cli(lab, ALICE, "job", "run", "-d", "--name", "ticker", "--", "sh", "-c",
            "for i in 1 2 3 4 5 6; do echo tick $i; "
            "echo \"{\\\"loss\\\": $i}\" >> $NODUS_METRICS_FILE; sleep 1; done")
    alice.goto(f"/jobs/{ALICE}/ticker")
    log = alice.page.locator("#log")
    log.locator("text=tick 2").wait_for(timeout=DEADLINE * 1000)
    assert "tick 6" not in log.inner_text()  # shown while the job still prints
    log.locator("text=tick 5").wait_for(timeout=DEADLINE * 1000)
    alice.page.fill("#log-search", "tick 4")
    assert alice.page.get_attribute("#log", "data-hits") == "1"
    assert alice.page.inner_text("#log-hits") == "1 found"
    assert alice.page.locator("#log .hit").inner_text().strip() == "tick 4"
    wait_until(lambda: "Succeeded" in alice.page.inner_text("#summary"),
               "the summary never said Succeeded")
    download = request(alice, "GET", f"/jobs/{ALICE}/ticker/log?download=1",
                       headers=cookie_header(alice))
    assert download[0] == 200 and "tick 6" in download[1]
    alice.page.wait_for_selector("#metrics-chart canvas", timeout=DEADLINE * 1000)


def test_a_sweep_page_moves_and_charts_one_point_per_finished_cell(
        lab: Box, alice: Dashboard, browser: Any, tmp_path: Path) -> None:
    run_cli(lab, ALICE, "map", "--no-code", "--name", "lrs", "--max-parallel", "1",
            "--no-wait", "--no-canary", "--", "sh", "-c",
            "sleep 1; echo \"{\\\"acc\\\": 0.$(( {} * 7 % 10 ))}\" >> $NODUS_METRICS_FILE",
            ":::", "1", "2", "3", "4", "5")
    alice.goto(f"/sweeps/{ALICE}/lrs")
    progress = alice.page.locator("#summary progress")

    def done() -> int:
        return int(progress.get_attribute("value") or 0)

    first = done()
    wait_until(lambda: done() > first, "the sweep's progress never moved", DEADLINE)
    wait_until(lambda: done() == 5, "the sweep never finished", DEADLINE)
    rows = alice.page.locator("#cells table.cells tbody tr")
    wait_until(lambda: rows.count() == 5, "the report table lacks cells")
    charts = alice.page.locator("#sweep-charts")
    alice.page.select_option("#sweep-metric", "acc")
    wait_until(lambda: charts.get_attribute("data-points") == "5"
               and charts.get_attribute("data-metric") == "acc",
               f"the chart never had 5 points: {charts.get_attribute('data-points')}")
    assert charts.locator("canvas").count() >= 1
    # The table sorts by a column on a click.
    alice.page.locator("#cells table.cells th", has_text="acc").click()
    values = [float(v) for v in alice.page.locator(
        "#cells table.cells tbody tr td:nth-child(5)").all_inner_texts()]
    assert values == sorted(values), values
    screenshot(alice.page, "dashboard-sweep.png", tmp_path)


def test_the_gpus_page_draws_utilization_from_the_history(
        lab: Box, alice: Dashboard, tmp_path: Path) -> None:
    alice.goto("/gpus")
    alice.page.wait_for_selector("#gpus table >> text=63%", timeout=DEADLINE * 1000)
    charts = alice.page.locator("#gpu-charts")
    wait_until(lambda: int(charts.get_attribute("data-points") or 0) >= 4,
               "no GPU history was drawn", DEADLINE)
    assert charts.locator("canvas").count() == 2  # one chart a GPU
    history = json.loads(request(alice, "GET", "/gpus/history.json",
                                 headers=cookie_header(alice))[1])
    assert 63 in history["gpus"][0]["utilization"], history["gpus"][0]
    screenshot(alice.page, "dashboard-gpus.png", tmp_path)


def test_queue_and_me_pages(lab: Box, alice: Dashboard) -> None:
    alice.goto("/queue")
    alice.page.wait_for_selector("#queue")
    alice.goto("/me")
    text = alice.page.inner_text("main")
    assert ALICE in text and "gpu hours" in text, text


# --- the guard ----------------------------------------------------------------------------


def test_without_the_token_or_cookie_everything_is_403(lab: Box, alice: Dashboard) -> None:
    for path in ("/", "/jobs", "/static/dashboard.js", "/gpus/history.json",
                 f"/jobs/{ALICE}/anything/log"):
        status, body = request(alice, "GET", path)
        assert status == 403, (path, status, body)
    # The link worked once: used again (a leaked terminal line), it signs nobody in.
    status, _ = request(alice, "GET", "/" + alice.link.split("/", 3)[3])
    assert status == 403
    # Cookies are not told apart by port: another dashboard's is not this one's.
    status, _ = request(alice, "GET", "/jobs",
                        headers={"Cookie": f"noduslocal_dashboard_{alice.port}=guess"})
    assert status == 403


def test_a_wrong_host_is_refused_even_with_the_cookie(lab: Box, alice: Dashboard) -> None:
    with_cookie = cookie_header(alice)
    assert request(alice, "GET", "/jobs", headers=with_cookie)[0] == 200
    for host in (f"evil.example:{alice.port}", "127.0.0.1", f"127.0.0.1:{alice.port + 1}"):
        status, _ = request(alice, "GET", "/jobs", host=host, headers=with_cookie)
        assert status == 403, host


def test_answers_carry_a_strict_csp_and_nosniff(lab: Box, alice: Dashboard) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", alice.port, timeout=30)
    conn.request("GET", "/jobs", headers=cookie_header(alice))
    resp = conn.getresponse()
    resp.read()
    csp = resp.getheader("Content-Security-Policy") or ""
    assert "default-src 'none'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert resp.getheader("X-Content-Type-Options") == "nosniff"
    assert resp.getheader("X-Frame-Options") == "DENY"
    conn.close()


def test_a_cancel_without_the_csrf_token_is_refused(lab: Box, alice: Dashboard) -> None:
    run_cli(lab, ALICE, "job", "run", "-d", "--name", "keep", "--", "sleep", "60")
    try:
        status, body = request(alice, "POST", f"/jobs/{ALICE}/keep/cancel",
                               headers=cookie_header(alice))
        assert status == 403 and "CSRF" in body
        phase = json.loads(run_cli(lab, ALICE, "job", "status", "keep", "--json"))["phase"]
        assert phase not in ("Cancelled", "Failed"), phase
        # The page's own button carries it: the cancel goes through.
        alice.goto(f"/jobs/{ALICE}/keep")
        alice.page.click("button.danger")
        alice.page.wait_for_selector("#action >> text=cancel asked", timeout=DEADLINE * 1000)
        wait_until(lambda: json.loads(run_cli(lab, ALICE, "job", "status", "keep",
                                              "--json"))["phase"] == "Cancelled",
                   "the cancel from the page never landed")
    finally:
        lab.cli(ALICE, "job", "kill", "keep")


def test_a_second_user_s_dashboard_cannot_read_or_cancel_the_first_user_s_job(
        lab: Box, alice: Dashboard, browser: Any) -> None:
    run_cli(lab, ALICE, "job", "run", "-d", "--name", "private", "--", "sh", "-c",
            "echo alice-$((6 * 7))-secret; sleep 60")
    bob = sign_in(start_dashboard(lab, BOB), browser)
    try:
        cookies = cookie_header(bob)
        status, body = request(bob, "GET", f"/jobs/{ALICE}/private/log?download=1",
                               headers=cookies)
        assert status == 403 and "alice-42-secret" not in body, (status, body)
        bob.goto(f"/jobs/{ALICE}/private")
        time.sleep(1)  # the log's stream is refused: nothing of it shows
        assert "alice-42-secret" not in bob.page.content()
        assert bob.page.locator("button.danger").count() == 0  # no cancel offered
        csrf = bob.page.get_attribute("meta[name=csrf-token]", "content")
        status, body = request(bob, "POST", f"/jobs/{ALICE}/private/cancel",
                               headers={**cookies, "X-CSRF-Token": csrf or ""})
        assert "may not" in body, (status, body)  # the daemon refuses it, as for the CLI
        phase = json.loads(run_cli(lab, ALICE, "job", "status", "private", "--json"))["phase"]
        assert phase == "Running", phase
        # Alice's session is not Bob's: her cookie does not open his dashboard.
        status, _ = request(bob, "GET", "/jobs", headers=cookie_header(alice))
        assert status == 403
    finally:
        bob.problems.clear()  # the refused log stream is a console error on purpose
        bob.close()
        lab.cli(ALICE, "job", "kill", "private")


def test_the_readme_s_command_serves_until_ctrl_c_and_says_so(lab: Box) -> None:
    """The README's dashboard block as written (BROWSER=true: the browser it would open)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## The dashboard"):]
    block = re.search(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert block is not None
    [command] = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    proc = subprocess.Popen(["bash", "-c", command], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, SOCKET_ENV: str(lab.daemon.socket),
                                 "BROWSER": "true",
                                 "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
                            start_new_session=True,
                            # As a shell's background job gets it (scripts/test.sh runs the
                            # tests so): SIGINT ignored, which Python keeps unless told.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert proc.stdout is not None
    link = ""
    while "token=" not in link:
        link = proc.stdout.readline()
        assert link, "the dashboard printed no link"
    os.killpg(proc.pid, 2)  # Ctrl-C reaches the terminal's whole foreground group
    out, _ = proc.communicate(timeout=30)
    assert "dashboard stopped" in out, out
    assert proc.returncode == 0
