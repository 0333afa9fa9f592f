"""What `noduslocal map` does, apart from click: the fast path (cli/fast.py) and click's
command (cli/map.py) both call it, so a map pays no import of click (a third of the
command's CPU, issue 25 part 5): the values expanded, the code uploaded once, the sweep
created, and its canary waited for with a live line on a terminal.
"""

from __future__ import annotations

import contextlib
import sys
import time

from noduslocal.cli.usage import Usage

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

CANARY_POLL = 0.5  # seconds a long poll on the canary lasts (a terminal's line)
CANARY_SETTLE = 0.05  # seconds between looks at a sweep whose canary has ended


def run(o: dict[str, Any]) -> int:
    """`map`: the exit code. O: the command's options by their click names, `command`
    the words after them; `code` a directory click has checked (None: this one)."""
    from noduslocal.domain import map_args as expand

    if o["replace"] and o["name"] is None:
        raise Usage("--replace needs --name")
    if o["canary_smoke"] is not None and o["no_canary"]:
        raise Usage("give --canary-smoke or --no-canary, not both")
    if o["gpus"] and o["sku"]:
        raise Usage("give --gpus or --sku, not both")
    if sum((o["code"] is not None, o["no_code"], o["from_job"] is not None)) > 1:
        raise Usage("give one of --code, --no-code and --from")
    args = list(o["command"])  # never empty: click requires it, the fast path checks
    # Every refusal of the command line comes before standard input is read: the fast
    # path hands a refused one to click, which must find it unread.
    body = _body(o, args)
    lines = None
    if expand.MARKER not in args:
        if sys.stdin.isatty():
            raise Usage("no ::: values, and standard input is a terminal: pipe one task's "
                        "value per line, or see `noduslocal help map`")
        lines = body["map"]["lines"] = sys.stdin.read().splitlines()
    tasks = expand.parse(args, lines)
    if o["dry_run"]:
        import shlex

        for task in tasks.tasks():
            print(shlex.join(task.argv))
        return 0
    from noduslocal.sdk.api_client import ApiClient

    client = ApiClient()
    template = body["template"]
    if o["from_job"] is not None:
        copied = client.snapshot_job(o["from_job"], o["project"],
                                     allow_large=o["allow_large_source"])
        template["source"] = {"sha256": copied["sha256"]}
        if o["image"] is None and copied["image"] is not None:
            template["image"] = copied["image"]  # --image names another
    elif not o["no_code"]:
        from pathlib import Path

        from noduslocal.cli import output

        template["source"] = client.upload_source(
            [o["code"] or Path.cwd()], contents_of_single_dir=True,
            allow_large=o["allow_large_source"], say=output.upload_said(quiet=o["as_json"]))
    if o["replace"]:
        client.replace_sweep(o["name"], o["project"])
    sweep = client.create_sweep(body)
    if o["no_wait"] or sweep["phase"] != "Canary":
        _done(sweep, o["as_json"], "created")
        return 0
    try:
        sweep = _wait_canary(client, sweep, quiet=o["as_json"])
    except KeyboardInterrupt:
        print(f"\ndetached; {sweep['name']} goes on. Watch: noduslocal sweep status "
              f"{sweep['name']} --watch  Stop: noduslocal sweep cancel {sweep['name']}",
              file=sys.stderr, flush=True)
        return 130
    if sweep["reason"] == "CanaryFailed":
        if o["as_json"]:
            from noduslocal.cli import output

            output.print_json(sweep)
        else:
            print(f"noduslocal: {sweep['name']}: {sweep['message']}", file=sys.stderr)
            canary = f"{sweep['name']}-{'canary' if o['canary_smoke'] else 0}"
            print(f"the canary's log: noduslocal job logs {canary} -p {sweep['project']}"
                  f"; after a fix: noduslocal sweep retry {sweep['name']}", file=sys.stderr,
                  flush=True)
        return 1
    _done(sweep, o["as_json"], "canary passed")
    return 0


def _body(o: dict[str, Any], args: list[str]) -> dict[str, Any]:
    """The sweep's create request, but for its code (uploaded after every check) and the
    lines of standard input (read after it)."""
    from noduslocal.cli.export import exported, pairs

    template: dict[str, Any] = {}
    for key, value in (("image", o["image"]), ("gpu", o["gpus"] or o["sku"]),
                       ("cpu", o["cpu"]), ("memory", o["memory"]), ("region", o["region"]),
                       ("timeout", o["timeout"])):
        if value is not None:
            template[key] = value
    if o["retries"]:
        template["retries"] = o["retries"]
    secrets = o["secrets"]
    env = {**{k: v for k, v in exported(o["export"], o["image"] is not None).items()
              if k not in secrets}, **pairs(o["envs"], "--env")}
    if env:
        template["env"] = env
    if secrets:
        template["secrets"] = list(secrets)
    if o["volumes"]:
        template["volumes"] = {mount or f"/workspace/{vol}": vol for vol, _, mount in
                               (item.partition(":") for item in o["volumes"])}
    body: dict[str, Any] = {"template": template, "max_parallel": o["max_parallel"],
                            "map": {"args": args},
                            "canary": "none" if o["no_canary"] else "cell"}
    if o["canary_smoke"] is not None:
        body.pop("canary")
        body["canary_smoke"] = o["canary_smoke"]
    for key in ("name", "project", "webhook"):
        if o[key] is not None:
            body[key] = o[key]
    if o["labels"]:
        body["labels"] = pairs(o["labels"], "--label")
    if o["after"]:
        body["after"] = [item for value in o["after"] for item in value.split(",")]
    return body


def _wait_canary(client: Any, sweep: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Until the canary (cell 0) has passed or failed: long polls on the canary, so the
    command returns as soon as it has, with a live line of how it stands on a terminal."""
    from noduslocal.domain import errors

    live = not quiet and sys.stderr.isatty()
    settle = CANARY_SETTLE
    with _canary_line(sweep) if live else contextlib.nullcontext(None) as show:
        while sweep["phase"] == "Canary":
            try:
                canary = client.wait_job(sweep["canary_job"], sweep["project"], CANARY_POLL)
            except errors.WaitTimeout:
                canary = None
            sweep = client.get_sweep(sweep["name"], sweep["project"])
            if canary is not None and sweep["phase"] == "Canary":
                # Its sweep moves on right after it ends; should it not, looked at less
                # and less often, never in a loop of requests.
                time.sleep(settle)
                settle = min(CANARY_POLL, settle * 2)
            if show is not None:
                show(sweep, canary or client.get_job(sweep["canary_job"], sweep["project"]))
    return sweep


@contextlib.contextmanager
def _canary_line(sweep: dict[str, Any]) -> Iterator[Callable[[dict[str, Any], dict[str, Any]],
                                                             None]]:
    """A live line on stderr of how the canary stands; yields what updates it."""
    from rich.console import Console

    started = time.monotonic()
    with Console(stderr=True).status(f"{sweep['name']}: canary of {sweep['cells']} "
                                     "tasks") as bar:
        yield lambda sweep, canary: bar.update(
            f"{sweep['name']}: canary {canary['name']} {canary['phase']}"
            f"{' - ' + canary['hold'] if canary.get('hold') else ''}, "
            f"{time.monotonic() - started:.0f}s")


def _done(sweep: dict[str, Any], as_json: bool, what: str) -> None:
    if as_json:
        from noduslocal.cli import output

        output.print_json(sweep)
        return
    print(sweep["name"], flush=True)
    print(f"{what}: {sweep['cells']} tasks, at most {sweep['max_parallel']} at once. "
          f"Watch: noduslocal sweep status {sweep['name']} --watch", file=sys.stderr,
          flush=True)
