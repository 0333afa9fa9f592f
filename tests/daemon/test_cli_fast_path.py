"""The fast path of `job run`, `job list`, `map` and `sweep wait` (cli/fast.py) against click's
commands, each run against a real daemon as separate processes: what it sends and prints is
what click's path sends and prints, whatever it does not take goes to click, refusals
included, in the CLI's one style, and it loads none of the heavy modules. Its option
table and parser are held to click's without a daemon in
tests/unit/test_cli_fast_path_parser.py."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from noduslocal import testing
from noduslocal.cli import fast
from noduslocal.domain.sockets import SOCKET_ENV
from tests.conftest import run_cli
from tests.daemon.conftest import job_names

CLICK_ONLY = [sys.executable, "-c", "from noduslocal.cli.root import main; main()"]


def click_cli(d: testing.Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """The same command line through click alone."""
    return subprocess.run([*CLICK_ONLY, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, SOCKET_ENV: str(d.socket)})


def test_both_paths_submit_the_same_job(daemon: testing.Daemon) -> None:
    args = ["--export", "NONE", "-e", "A=1", "--label", "k=v", "--retries", "2",
            "--priority", "0", "--cpu", "500m", "--timeout", "5m", "-d", "--", "sh", "-c",
            "echo $A"]
    fast_run = run_cli(daemon, "job", "run", "--name", "by-fast", *args)
    click_run = click_cli(daemon, "job", "run", "--name", "by-click", *args)
    assert (fast_run.returncode, fast_run.stdout) == (0, "by-fast\n"), fast_run.stderr
    assert (click_run.returncode, click_run.stdout) == (0, "by-click\n"), click_run.stderr
    client = daemon.client()
    one, two = (client.wait_job(name) for name in ("by-fast", "by-click"))
    assert one["labels"] == two["labels"] == {"k": "v"}
    assert one["retries"] == two["retries"] == 2
    assert one["spec"] == two["spec"]
    assert one["spec"]["env"] == {"A": "1"}
    assert one["spec"]["command"] == ["sh", "-c", "echo $A"]


def test_both_paths_list_alike(daemon: testing.Daemon) -> None:
    client = daemon.client()
    for i in range(3):
        client.wait_job(client.create_job({"name": f"listed-{i}",
                                           "command": ["true"]})["name"])
    for args in (["-a"], ["-a", "--json"], ["--phase", "succeeded", "--json"],
                 ["--phase", "Succeeded", "-a", "--label", "none=here"]):
        by_fast = run_cli(daemon, "job", "list", *args)
        by_click = click_cli(daemon, "job", "list", *args)
        assert by_fast.returncode == by_click.returncode == 0, (by_fast.stderr,
                                                                by_click.stderr)
        if "--json" in args:
            assert json.loads(by_fast.stdout) == json.loads(by_click.stdout)
        else:
            assert [line.split()[:4] for line in by_fast.stdout.splitlines()] == \
                [line.split()[:4] for line in by_click.stdout.splitlines()]
    table = run_cli(daemon, "job", "list", "-a").stdout.splitlines()
    assert table[0].split() == ["NAME", "PROJECT", "OWNER", "PHASE", "WHY", "AGE", "RAN",
                                "EXIT"]
    assert {line.split()[0] for line in table[1:]} >= {"listed-0", "listed-1", "listed-2"}


@pytest.mark.parametrize(("args", "message"), [
    (["job", "run", "-d", "--retries", "101", "true"],
     "noduslocal: --retries: 101 is not in the range 0<=x<=100."),
    (["job", "run", "-d", "--env", "NOEQUALS", "true"],
     "noduslocal: --env: 'NOEQUALS' is not KEY=VALUE"),
    (["job", "run", "-d", "--export", "NODUS_TEST_SURELY_UNSET", "true"],
     "noduslocal: --export: NODUS_TEST_SURELY_UNSET is not set in your environment"),
    (["job", "run", "-d", "--replace", "true"], "noduslocal: --replace needs --name"),
    (["job", "run", "-d", "--timeout", "2x", "true"], "noduslocal: --timeout: '2x' is not"),
    (["job", "list", "--phase", "nope"], "noduslocal: --phase: 'nope' is not one of"),
    (["job", "list", "--label", "novalue"], "noduslocal: --label: 'novalue' is not KEY=VALUE"),
    (["sweep", "wait", "--timeout", "nan", "any"],
     "noduslocal: --timeout: nan is not a number of seconds (0 or more)"),
    (["sweep", "wait", "any", "--timeout", "-1"],
     "noduslocal: --timeout: -1.0 is not a number of seconds (0 or more)"),
])
def test_refusals_have_one_style_and_create_nothing(daemon: testing.Daemon,
                                                    args: list[str], message: str) -> None:
    before = job_names(daemon)
    result = run_cli(daemon, *args)
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert result.stderr.count("\n") == 1
    assert job_names(daemon) == before


def test_api_errors_exit_as_click_path_does(daemon: testing.Daemon) -> None:
    run_cli(daemon, "job", "run", "--name", "twice", "-d", "--", "true")
    again = run_cli(daemon, "job", "run", "--name", "twice", "-d", "--", "true")
    by_click = click_cli(daemon, "job", "run", "--name", "twice", "-d", "--", "true")
    assert again.returncode == by_click.returncode != 0
    assert again.stderr == by_click.stderr
    assert again.stderr.startswith("noduslocal: ") and again.stderr.count("\n") == 1


def test_attached_run_through_the_fast_path(daemon: testing.Daemon) -> None:
    result = run_cli(daemon, "job", "run", "--", "sh", "-c", "echo out; exit 4")
    assert result.returncode == 4
    assert result.stdout == "out\n"
    assert "exited with code 4" in result.stderr


@pytest.mark.parametrize(("argv", "allowed"), [
    (["job", "run", "-d", "--", "true"], set()), (["job", "list"], set()),
    # The values' grammar is parsed by regular expressions; the sweep's errors are enums.
    (["map", "--no-code", "--no-wait", "--name", "m", "true", ":::", "1", "2"],
     {"re", "enum"}),
])
def test_the_fast_path_loads_none_of_the_heavy_modules(daemon: testing.Daemon,
                                                       argv: list[str],
                                                       allowed: set[str]) -> None:
    """What keeps a submit near the interpreter's own start (docs/benchmarks.md): the
    modules a call would pay for and does not need, checked by name, not by time."""
    probe = ("import sys\nfrom noduslocal.cli import fast\n"
             f"assert fast.run({argv!r}) == 0\n"
             "heavy = {'click', 're', 'json', 'rich', 'pathlib', 'socket', 'http.client',\n"
             "         'typing', 'enum', 'urllib.parse', 'datetime', 'threading', 'aiohttp'}\n"
             "print(sorted(heavy & set(sys.modules)), file=sys.stderr)\n")
    result = subprocess.run([sys.executable, "-S", "-c", probe], capture_output=True,
                            text=True, timeout=60, cwd=Path(fast.__file__).parents[2],
                            env={**os.environ, SOCKET_ENV: str(daemon.socket)})
    assert result.returncode == 0, result.stderr
    loaded = ast.literal_eval(result.stderr.strip().splitlines()[-1])
    assert set(loaded) <= allowed, loaded




def test_both_paths_wait_for_a_sweep_alike(daemon: testing.Daemon) -> None:
    """`sweep wait` through the fast path (cli/sweep_actions.py) and through click: the
    same line, the same JSON, the same exit (0 when every cell succeeded, 1 otherwise),
    and the same refusal of a sweep that does not exist."""
    client = daemon.client()
    client.create_sweep({"name": "all-ok", "canary": "none",
                         "template": {"command": ["true"]}, "grid": {"X": [1, 2]}})
    client.create_sweep({"name": "one-bad", "canary": "none",
                         "template": {"command": ["sh", "-c", "exit $X"]},
                         "grid": {"X": [0, 3]}})
    for name, code in (("all-ok", 0), ("one-bad", 1)):
        for args in ([name], [name, "--json"], ["--timeout", "60", name, "-p", "root"]):
            by_fast = run_cli(daemon, "sweep", "wait", *args)
            by_click = click_cli(daemon, "sweep", "wait", *args)
            assert by_fast.returncode == by_click.returncode == code, (by_fast.stderr,
                                                                       by_click.stderr)
            if "--json" in args:
                fast_doc, click_doc = json.loads(by_fast.stdout), json.loads(by_click.stdout)
                assert fast_doc["phase"] == click_doc["phase"]
                assert fast_doc["counts"] == click_doc["counts"]
            else:
                assert by_fast.stdout == by_click.stdout
                assert by_fast.stdout.startswith(f"{name}: "), by_fast.stdout
    missing = run_cli(daemon, "sweep", "wait", "no-such-sweep")
    by_click = click_cli(daemon, "sweep", "wait", "no-such-sweep")
    assert missing.returncode == by_click.returncode != 0
    assert missing.stderr == by_click.stderr
    assert missing.stderr.startswith("noduslocal: ") and missing.stderr.count("\n") == 1


def test_both_paths_map_alike(daemon: testing.Daemon) -> None:
    """`map` through the fast path (cli/map_actions.py) and through click: the same sweep
    created from the same command line, values given after ::: or on standard input, the
    same lines printed, and the same refusal of a bad --env, with nothing created."""
    args = ["--no-code", "--export", "NONE", "-e", "A=1", "--label", "k=v", "--retries",
            "1", "--max-parallel", "3", "--no-canary", "--", "sh", "-c", "echo $A $1"]
    by_fast = run_cli(daemon, "map", "--name", "by-fast", *args, ":::", "x", "y")
    by_click = click_cli(daemon, "map", "--name", "by-click", *args, ":::", "x", "y")
    assert by_fast.returncode == by_click.returncode == 0, (by_fast.stderr, by_click.stderr)
    assert by_fast.stdout == "by-fast\n" and by_click.stdout == "by-click\n"
    assert (by_fast.stderr.replace("by-fast", "NAME")
            == by_click.stderr.replace("by-click", "NAME")), (by_fast.stderr, by_click.stderr)
    client = daemon.client()
    one, two = (client.get_sweep(name) for name in ("by-fast", "by-click"))
    assert one["labels"] == two["labels"] == {"k": "v"}
    assert one["max_parallel"] == two["max_parallel"] == 3
    assert one["cells"] == two["cells"] == 2 and one["canary"] == two["canary"]
    for cell in (0, 1):
        fast_job, click_job = (client.get_job(f"{name}-{cell}")
                               for name in ("by-fast", "by-click"))
        assert fast_job["spec"]["env"].pop("NODUS_SWEEP") == "by-fast"
        assert click_job["spec"]["env"].pop("NODUS_SWEEP") == "by-click"
        for job in (fast_job, click_job):
            job["spec"]["env"].pop("SUPERCOMPUTER_JOB", None)
        assert fast_job["spec"] == click_job["spec"]
        assert fast_job["spec"]["env"]["A"] == "1" and fast_job["retries"] == 1
    lines = run_cli(daemon, "map", "--name", "from-stdin", "--no-code", "--no-wait", "echo",
                    input="a\nb\nc\n")
    assert lines.returncode == 0, lines.stderr
    assert client.get_sweep("from-stdin")["cells"] == 3
    bad = run_cli(daemon, "map", "--name", "bad", "--no-code", "-e", "NOEQUALS", "true",
                  ":::", "1")
    bad_click = click_cli(daemon, "map", "--name", "bad", "--no-code", "-e", "NOEQUALS",
                          "true", ":::", "1")
    assert bad.returncode == bad_click.returncode == 2
    assert bad.stderr == bad_click.stderr and bad.stderr.count("\n") == 1, bad.stderr
    # The values on standard input: the fast path refuses before reading them, so click,
    # which it hands the line to, finds them and refuses the same way (not "standard
    # input had no lines").
    piped = run_cli(daemon, "map", "--name", "bad", "--no-code", "-e", "NOEQUALS", "echo",
                    input="a\nb\n")
    assert (piped.returncode, piped.stderr) == (2, bad.stderr), piped.stderr
    assert "bad" not in {s["name"] for s in client.list_sweeps()}
