"""The commands people run in loops and scripts, `job run`, `job list`, `map` and `sweep
wait`, parsed without click: importing click costs a call more than all the rest of it.
Whatever this parser does not know for certain (an option it has no entry for, --help, a
value click must judge) makes it answer None, and click parses the whole command line
again, so refusals keep one style.
"""

from __future__ import annotations

import sys

from noduslocal.cli.usage import Usage
from noduslocal.domain import errors

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

FLAG, VALUE, MANY, INT, FLOAT = "flag", "value", "many", "int", "float"


def _opt(dest: str, kind: str = VALUE, lo: int | None = None, hi: int | None = None,
         default: Any = None) -> tuple[str, str, int | None, int | None, Any]:
    if default is None:
        default = {FLAG: False, MANY: ()}.get(kind)
    return dest, kind, lo, hi, default


# Each an option of click's command by the same flags, dest, bounds and default
# (tests/unit/test_cli_fast_path_parser.py holds them to it). Options left out (--network,
# --launcher, --transport, --max-cost, --upload, --include) go through click.
RUN_OPTIONS = {
    "--name": _opt("name"), "--project": _opt("project"), "-p": _opt("project"),
    "--image": _opt("image"), "--as-args": _opt("as_args", FLAG),
    "--checkpoint": _opt("checkpoint"),
    "--env": _opt("envs", MANY), "-e": _opt("envs", MANY), "--export": _opt("export"),
    "--secret": _opt("secrets", MANY), "--gpus": _opt("gpus"), "--sku": _opt("sku"),
    "--priority": _opt("priority", INT, -1000, 1000),
    "--expected-duration": _opt("expected_duration"), "--profile": _opt("profile"),
    "--region": _opt("region"),
    "--cpu": _opt("cpu"), "--memory": _opt("memory"), "--disk": _opt("disk"),
    "--min-disk-gb": _opt("min_disk_gb", INT, 1),
    "--retries": _opt("retries", INT, 0, 100, 0),
    "--timeout": _opt("timeout"), "--workdir": _opt("workdir"),
    "--label": _opt("labels", MANY), "--volume": _opt("volumes", MANY),
    "--output": _opt("outputs", MANY), "--nodes": _opt("nodes", INT, 1),
    "--gpus-per-node": _opt("gpus_per_node", INT, 0),
    "--startup-timeout": _opt("startup_timeout"),
    "--completions": _opt("completions", INT, 1),
    "--parallelism": _opt("parallelism", INT, 1),
    "--allow-large-source": _opt("allow_large_source", FLAG),
    "--after": _opt("after", MANY), "--replace": _opt("replace", FLAG),
    "--detach": _opt("detach", FLAG),
    "-d": _opt("detach", FLAG), "--json": _opt("as_json", FLAG),
}
RUN_LEFT_TO_CLICK = {"network": None, "launcher": None, "transport": None,
                     "max_cost": None, "uploads": ()}

LIST_OPTIONS = {
    "--all": _opt("show_all", FLAG), "-a": _opt("show_all", FLAG),
    "--phase": _opt("phases", MANY), "--owner": _opt("owner"),
    "--label": _opt("labels", MANY), "--project": _opt("project"), "-p": _opt("project"),
    "--limit": _opt("limit", INT, 1, 100_000, 1000), "--json": _opt("as_json", FLAG),
    "--cells": _opt("cells", FLAG),
}

MAP_OPTIONS = {  # `map ... COMMAND ::: VALUES`
    "--name": _opt("name"), "--replace": _opt("replace", FLAG),
    "--project": _opt("project"), "-p": _opt("project"),
    "--image": _opt("image"), "--gpus": _opt("gpus"), "--sku": _opt("sku"),
    "--cpu": _opt("cpu"), "--memory": _opt("memory"), "--region": _opt("region"),
    "--timeout": _opt("timeout"),
    "--max-parallel": _opt("max_parallel", INT, 1, 10_000, 8),
    "--retries": _opt("retries", INT, 0, 100, 0),
    "--canary-smoke": _opt("canary_smoke"), "--no-canary": _opt("no_canary", FLAG),
    "--no-wait": _opt("no_wait", FLAG), "--no-code": _opt("no_code", FLAG),
    "--from": _opt("from_job"), "--volume": _opt("volumes", MANY),
    "--env": _opt("envs", MANY), "-e": _opt("envs", MANY), "--export": _opt("export"),
    "--secret": _opt("secrets", MANY), "--label": _opt("labels", MANY),
    "--webhook": _opt("webhook"), "--allow-large-source": _opt("allow_large_source", FLAG),
    "--after": _opt("after", MANY), "--dry-run": _opt("dry_run", FLAG),
    "--json": _opt("as_json", FLAG),
}
MAP_LEFT_TO_CLICK = {"code": None}  # a directory click checks exists

WAIT_OPTIONS = {  # `sweep wait NAME`
    "--project": _opt("project"), "-p": _opt("project"),
    "--timeout": _opt("timeout", FLOAT), "--json": _opt("as_json", FLAG),
}


def parse(argv: list[str], table: dict[str, tuple[str, str, int | None, int | None, Any]],
          positional: bool, interspersed: bool = False) -> dict[str, Any] | None:
    """ARGV's options by their dest, as click would give them, and the arguments after
    them as `command`; None where click must decide. `interspersed`: arguments may come
    between options (click's default; `job run`'s first argument ends its options)."""
    found: dict[str, Any] = {dest: default for dest, _, _, _, default in table.values()}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            if not positional and i + 1 < len(argv):
                return None  # arguments a command without any: click refuses them
            rest += argv[i + 1:]
            break
        if not arg.startswith("-") or arg == "-":
            if not positional:
                return None
            if interspersed:
                rest.append(arg)
                i += 1
                continue
            rest = argv[i:]  # the first argument ends the options, as in click's job run
            break
        key, eq, inline = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        spec = table.get(key)
        if spec is None:
            return None
        dest, kind, lo, hi, _ = spec
        if kind == FLAG:
            if eq:
                return None
            found[dest] = True
            i += 1
            continue
        if eq:
            value, i = inline, i + 1
        elif i + 1 < len(argv) and argv[i + 1] not in table and argv[i + 1] != "--":
            value, i = argv[i + 1], i + 2
        else:
            return None
        if kind == FLOAT:
            try:
                found[dest] = float(value)
            except ValueError:
                return None
        elif kind == INT:
            try:
                number = int(value)
            except ValueError:
                return None
            if (lo is not None and number < lo) or (hi is not None and number > hi):
                return None
            found[dest] = number
        elif kind == MANY:
            found[dest] = (*found[dest], value)
        else:
            found[dest] = value
    if positional:
        found["command"] = tuple(rest)
    return found


def run(argv: list[str]) -> int | None:
    """The exit code of `noduslocal ARGV` when this path can take it, else None."""
    if argv[:2] == ["sweep", "wait"]:
        options = parse(argv[2:], WAIT_OPTIONS, positional=True, interspersed=True)
        if options is None or len(options["command"]) != 1:
            return None
        from noduslocal.cli import sweep_actions

        (options["name"],) = options.pop("command")
        return _act(sweep_actions.wait, options)
    if argv[:1] == ["map"]:
        options = parse(argv[1:], MAP_OPTIONS, positional=True)
        if options is None or not options["command"]:
            return None
        from noduslocal.cli import map_actions

        return _act(map_actions.run, {**options, **MAP_LEFT_TO_CLICK})
    if len(argv) < 2 or argv[0] != "job" or argv[1] not in ("run", "list"):
        return None
    from noduslocal.cli import job_actions

    if argv[1] == "run":
        options = parse(argv[2:], RUN_OPTIONS, positional=True)
        if options is not None:
            options.update(RUN_LEFT_TO_CLICK)
        action = job_actions.run
    else:
        options = parse(argv[2:], LIST_OPTIONS, positional=False)
        action = job_actions.list_jobs
    if options is None:
        return None
    return _act(action, options)


def _act(action: Callable[[dict[str, Any]], int], options: dict[str, Any]) -> int | None:
    try:
        return action(options)
    except Usage:
        return None  # raised before anything was sent: click says it in its words
    except errors.NodusError as exc:
        print(f"noduslocal: {exc.message}", file=sys.stderr)
        return exc.cli_exit
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
