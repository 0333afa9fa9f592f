"""The fast path of `job run` and `job list` (cli/fast.py) without a daemon: its option
table is click's, its parser gives what click's gives and leaves the rest to click, and its
time and JSON helpers agree with the standard library's. What it sends and prints is held to
click's path against a real daemon in tests/daemon/test_cli_fast_path.py."""

from __future__ import annotations

import json
from typing import Any

import click
import pytest

from noduslocal.cli import fast
from noduslocal.cli.job import list_, run
from noduslocal.cli.map import map_
from noduslocal.cli.sweeps import wait
from noduslocal.domain.timefmt import iso, parse_iso


@pytest.mark.parametrize(("command", "table", "left_to_click", "arguments"), [
    (run, fast.RUN_OPTIONS, fast.RUN_LEFT_TO_CLICK, []),
    (list_, fast.LIST_OPTIONS, {}, []),
    (wait, fast.WAIT_OPTIONS, {}, ["a-sweep"]),
    (map_, fast.MAP_OPTIONS, fast.MAP_LEFT_TO_CLICK, ["true", ":::", "1"]),
])
def test_the_table_is_clicks_options(command: click.Command, table: dict[str, Any],
                                     left_to_click: dict[str, Any],
                                     arguments: list[str]) -> None:
    params = {p.name: p for p in command.params if isinstance(p, click.Option)}
    with click.Context(command) as ctx:
        command.parse_args(ctx, arguments)
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
        elif kind == fast.FLOAT:
            assert param.type is click.FLOAT, flag
        elif kind == fast.VALUE:
            assert param.type is click.STRING, flag
    covered = {spec[0] for spec in table.values()} | set(left_to_click)
    assert covered == set(params), "every click option is in the table or left to click"
    for name, default in left_to_click.items():
        assert defaults[name] == default, name
    # Every flag of each option the table has is in it, so none of them goes to click.
    for dest in {spec[0] for spec in table.values()}:
        assert set(params[dest].opts) <= set(table), dest


RUN_LINES = [
    ["--name=x", "-e", "A=1", "--env", "B=2", "--label", "k=v", "--retries", "3", "--",
     "echo", "hi"],
    ["-d", "--priority", "-5", "sh", "-c", "exit 0"],
    ["--cpu", "500m", "--memory", "64M", "--", "--looks-like-a-flag"],
    ["--nodes", "2", "--gpus-per-node", "0", "true"],
]
MAP_LINES = [
    ["--no-code", "--name", "tp", "--max-parallel", "2", "--", "true", ":::", "1", "2"],
    ["-e", "A=1", "--env=B=2", "--label", "k=v", "--retries", "3", "--no-canary", "echo",
     "{}", ":::", "a", "b"],
    ["--cpu", "500m", "--memory", "64M", "--no-wait", "--json", "--", "--looks-like-a-flag",
     ":::", "x"],
    ["--after", "afterany:other", "--volume", "data", "-p", "lab", "sh", "-c", "exit $1",
     ":::", "0", "1"],
    ["--dry-run", "echo", "--name", "not-an-option-here", ":::", "1"],
]


@pytest.mark.parametrize(("command", "table", "left_to_click", "argv"), [
    *((run, fast.RUN_OPTIONS, fast.RUN_LEFT_TO_CLICK, argv) for argv in RUN_LINES),
    *((map_, fast.MAP_OPTIONS, fast.MAP_LEFT_TO_CLICK, argv) for argv in MAP_LINES),
])
def test_parse_gives_what_click_gives(command: click.Command, table: dict[str, Any],
                                      left_to_click: dict[str, Any],
                                      argv: list[str]) -> None:
    parsed = fast.parse(argv, table, positional=True)
    assert parsed is not None
    # With the command's own settings (map and job run stop at their first argument).
    with command.make_context(command.name, list(argv)) as ctx:
        expected = dict(ctx.params)
    assert {**parsed, **left_to_click} == expected


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


@pytest.mark.parametrize("argv", [
    ["--code", ".", "true", ":::", "1"],         # a directory click checks
    ["--max-parallel", "0", "true", ":::", "1"],  # out of range
    ["--help"],
    [],                                            # no command: click says so
])
def test_what_the_map_parser_leaves_to_click(argv: list[str]) -> None:
    parsed = fast.parse(argv, fast.MAP_OPTIONS, positional=True)
    assert parsed is None or not parsed["command"]
    assert fast.run(["map", *argv]) is None


def test_list_takes_no_argument() -> None:
    assert fast.parse(["stray"], fast.LIST_OPTIONS, positional=False) is None
    assert fast.parse(["--", "stray"], fast.LIST_OPTIONS, positional=False) is None
    assert fast.parse(["-a", "--"], fast.LIST_OPTIONS, positional=False) is not None
    assert fast.parse(["-a", "--limit=5"], fast.LIST_OPTIONS, positional=False) == {
        "show_all": True, "phases": (), "owner": None, "labels": (), "project": None,
        "limit": 5, "as_json": False, "cells": False}


def test_times_parse_without_strptime() -> None:
    for stamp in (0.0, 1.5, 951782400.123, 1796419646.265, 4102444800.999):
        assert parse_iso(iso(stamp)) == pytest.approx(stamp, abs=1e-6)
    assert parse_iso("2026-01-02T03:04:05.123456Z") == pytest.approx(1767323045.123456)
    assert parse_iso("2026-01-02T03:04:05Z") == 1767323045.0
    with pytest.raises(ValueError):
        parse_iso("2026-01-02 03:04:05")


def test_transport_json_is_jsons() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from noduslocal.sdk import transport

    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner), max_leaves=16)

    @settings(max_examples=300, deadline=None)
    @given(values)
    def same(value: object) -> None:
        assert transport.json_dumps(value) == json.dumps(value)
        assert transport.json_loads(json.dumps(value).encode()) == value

    same()
    for bad in ("", "[1,]", "1 2", "{"):
        with pytest.raises(ValueError):
            transport.json_loads(bad)
    with pytest.raises(TypeError):
        transport.json_dumps(object())


@pytest.mark.parametrize("argv", [
    ["s"], ["s", "--json"], ["-p", "lab", "s", "--timeout", "2.5"],
    ["--timeout=30", "--project=lab", "--", "s"], ["--json", "s", "-p", "x"],
])
def test_sweep_wait_parses_as_click_does(argv: list[str]) -> None:
    parsed = fast.parse(argv, fast.WAIT_OPTIONS, positional=True, interspersed=True)
    assert parsed is not None
    (parsed["name"],) = parsed.pop("command")
    with wait.make_context("wait", list(argv)) as ctx:
        expected = dict(ctx.params)
    assert parsed == expected


@pytest.mark.parametrize("argv", [
    ["--timeout", "soon", "s"],   # click says what a float is
    ["s", "--bogus"],
    ["--help"],
    ["--timeout"],
])
def test_what_the_sweep_wait_parser_leaves_to_click(argv: list[str]) -> None:
    assert fast.parse(argv, fast.WAIT_OPTIONS, positional=True, interspersed=True) is None


@pytest.mark.parametrize("argv", [["sweep", "wait"], ["sweep", "wait", "a", "b"],
                                  ["sweep", "wait", "s", "--help"]])
def test_sweep_wait_without_one_name_goes_to_click(argv: list[str]) -> None:
    assert fast.run(argv) is None
