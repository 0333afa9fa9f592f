"""The fast path of `job run` and `job list` (cli/fast.py) against click's commands: its
option table matches click's, what it sends and prints is what click's path sends and prints
(each run against a real daemon, as separate processes), and whatever it does not take goes
to click, refusals included, in the CLI's one style."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest

from noduslocal import testing
from noduslocal.cli import fast
from noduslocal.cli.job import list_, run
from noduslocal.domain.sockets import SOCKET_ENV
from noduslocal.domain.timefmt import iso, parse_iso
from tests.conftest import run_cli

CLICK_ONLY = [sys.executable, "-c", "from noduslocal.cli.root import main; main()"]


def click_cli(d: testing.Daemon, *args: str) -> subprocess.CompletedProcess[str]:
    """The same command line through click alone."""
    return subprocess.run([*CLICK_ONLY, *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, SOCKET_ENV: str(d.socket)})


@pytest.mark.parametrize(("command", "table", "left_to_click"), [
    (run, fast.RUN_OPTIONS, fast.RUN_LEFT_TO_CLICK),
    (list_, fast.LIST_OPTIONS, {}),
])
def test_the_table_is_clicks_options(command: click.Command, table: dict[str, Any],
                                     left_to_click: dict[str, Any]) -> None:
    params = {p.name: p for p in command.params if isinstance(p, click.Option)}
    with click.Context(command) as ctx:
        command.parse_args(ctx, [])
        defaults = dict(ctx.params)
    for flag, (dest, kind, lo, hi, default) in table.items():
        param = params[dest]
        assert flag in param.opts + param.secondary_opts, flag
        assert param.multiple == (kind == fast.MANY), flag
        assert param.is_flag == (kind == fast.FLAG), flag
        assert defaults[dest] == default, flag
        if kind == fast.INT:
            assert isinstance(param.type, click.IntRange), flag
            assert (param.type.min, param.type.max) == (lo, hi), flag
        elif kind == fast.VALUE:
            assert param.type is click.STRING, flag
    covered = {spec[0] for spec in table.values()} | set(left_to_click)
    assert covered == set(params), "every click option is in the table or left to click"
    for name, default in left_to_click.items():
        assert defaults[name] == default, name
    # Every flag of each option the table has is in it, so none of them goes to click.
    for dest in {spec[0] for spec in table.values()}:
        assert set(params[dest].opts) <= set(table), dest


@pytest.mark.parametrize("argv", [
    ["--name=x", "-e", "A=1", "--env", "B=2", "--label", "k=v", "--retries", "3", "--",
     "echo", "hi"],
    ["-d", "--priority", "-5", "sh", "-c", "exit 0"],
    ["--cpu", "500m", "--memory", "64M", "--", "--looks-like-a-flag"],
    ["--nodes", "2", "--gpus-per-node", "0", "true"],
])
def test_parse_gives_what_click_gives(argv: list[str]) -> None:
    parsed = fast.parse(argv, fast.RUN_OPTIONS, positional=True)
    assert parsed is not None
    with run.make_context("run", list(argv)) as ctx:  # with the command's own settings
        expected = dict(ctx.params)
    assert {**parsed, **fast.RUN_LEFT_TO_CLICK} == expected


@pytest.mark.parametrize("argv", [
    ["--network", "none", "true"],      # a choice: click judges it
    ["--retries", "101", "true"],       # out of range
    ["--retries", "x", "true"],
    ["--bogus", "true"],
    ["-de", "A=1", "true"],             # joined short flags
    ["--detach=yes", "true"],
    ["--name"],                         # a value missing
    ["--name", "--detach", "true"],     # click would take --detach as the name
    ["--help"],
])
def test_what_the_parser_leaves_to_click(argv: list[str]) -> None:
    assert fast.parse(argv, fast.RUN_OPTIONS, positional=True) is None


def test_list_takes_no_argument() -> None:
    assert fast.parse(["stray"], fast.LIST_OPTIONS, positional=False) is None
    assert fast.parse(["-a", "--limit=5"], fast.LIST_OPTIONS, positional=False) == {
        "show_all": True, "phases": (), "owner": None, "labels": (), "project": None,
        "limit": 5, "as_json": False}


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
])
def test_refusals_have_one_style_and_create_nothing(daemon: testing.Daemon,
                                                    args: list[str], message: str) -> None:
    result = run_cli(daemon, *args)
    assert result.returncode == 2
    assert result.stderr.startswith(message), result.stderr
    assert result.stderr.count("\n") == 1
    assert daemon.client().list_jobs(all=True) == []


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


def test_times_parse_without_strptime() -> None:
    for stamp in (0.0, 1.5, 951782400.123, 1796419646.265, 4102444800.999):
        assert parse_iso(iso(stamp)) == pytest.approx(stamp, abs=1e-6)
    assert parse_iso("2026-01-02T03:04:05.123456Z") == pytest.approx(1767323045.123456)
    assert parse_iso("2026-01-02T03:04:05Z") == 1767323045.0
    with pytest.raises(ValueError):
        parse_iso("2026-01-02 03:04:05")


@pytest.mark.parametrize("argv", [["job", "run", "-d", "--", "true"], ["job", "list"]])
def test_the_fast_path_loads_none_of_the_heavy_modules(daemon: testing.Daemon,
                                                       argv: list[str]) -> None:
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
    assert result.stderr.strip().splitlines()[-1] == "[]"


def test_wire_json_is_jsons() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from noduslocal.sdk import wire_json

    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=16)

    @settings(max_examples=300, deadline=None)
    @given(values)
    def same(value: object) -> None:
        assert wire_json.dumps(value) == json.dumps(value)
        assert wire_json.loads(json.dumps(value).encode()) == value

    same()
    for bad in ("", "[1,]", "1 2", "{"):
        with pytest.raises(ValueError):
            wire_json.loads(bad)
    with pytest.raises(TypeError):
        wire_json.dumps(object())
