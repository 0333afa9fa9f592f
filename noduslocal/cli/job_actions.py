"""What `job run` and `job list` do once their command line is parsed, on the standard
library alone: click's commands (cli/job.py) and the fast path (cli/fast.py) both call these,
so the two parsers cannot differ in what they send or print.
"""

from __future__ import annotations

import sys

from noduslocal.cli.export import exported, pairs
from noduslocal.cli.usage import Usage
from noduslocal.domain import errors

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from noduslocal.sdk.api_client import ApiClient

# `job run` values that go into the body under the same name when given.
_PLAIN = ("name", "project", "cpu", "memory", "disk", "timeout", "workdir", "image",
          "network", "checkpoint", "priority", "max_cost", "expected_duration", "profile",
          "completions", "parallelism", "region")
_GANG = ("nodes", "gpus_per_node", "launcher", "transport", "startup_timeout")


# What a detached submit needs is imported at the top; the rest (output, states, units) where
# it is used, so `job run --detach` in a loop pays for none of it.


def exit_code(job: dict[str, Any]) -> int:
    from noduslocal.domain.states import Phase

    if job["phase"] == Phase.SUCCEEDED:
        return 0
    code = job.get("exit_code")
    return code if isinstance(code, int) and code != 0 else 125


def run_body(o: dict[str, Any]) -> dict[str, Any]:
    """The create body `job run` sends for its options O; every refusal of the command line
    is raised here, as `Usage`, before anything reaches the daemon."""
    if o["timeout"] is not None:
        from noduslocal.domain.units import parse_duration

        try:
            parse_duration(o["timeout"], "timeout")
        except errors.InvalidArgument as exc:
            raise Usage(exc.message, "--timeout") from None
    image = o["image"]
    if not o["command"] and image is None:
        raise Usage("give a COMMAND to run (after --), or an --image")
    if o["gpus"] and o["sku"]:
        raise Usage("give --gpus or --sku, not both")
    if (o["as_args"] or o["network"]) and image is None:
        raise Usage(f"{'--as-args' if o['as_args'] else '--network'} needs --image")
    if o["disk"] and o["min_disk_gb"]:
        raise Usage("give --disk or --min-disk-gb, not both")
    if o["replace"] and o["name"] is None:
        raise Usage("--replace needs --name")
    gang = {key: o[key] for key in _GANG if o[key] is not None}
    if gang and o["nodes"] is None:
        raise Usage(f"--{next(iter(gang)).replace('_', '-')} needs --nodes")
    body: dict[str, Any] = {"args" if o["as_args"] else "command": list(o["command"])}
    body.update((key, o[key]) for key in _PLAIN if o[key] is not None)
    if o["min_disk_gb"]:
        body["disk"] = f"{o['min_disk_gb']}GiB"
    if o["gpus"] or o["sku"]:
        body["gpu"] = o["gpus"] or o["sku"]
    given = pairs(o["envs"], "--env")
    secret_names = {item.partition("=")[0] for item in o["secrets"]}
    env = {**{k: v for k, v in exported(o["export"], image is not None).items()
              if k not in secret_names}, **given}  # a secret is passed as a secret
    if env:
        body["env"] = env
    if o["secrets"]:
        body["secrets"] = [
            {"env": key, "value": value} if sep else key
            for key, sep, value in (item.partition("=") for item in o["secrets"])]
    if o["labels"]:
        body["labels"] = pairs(o["labels"], "--label")
    if o["outputs"]:
        body["outputs"] = pairs(o["outputs"], "--output")
    if o["volumes"]:
        body["volumes"] = {mount or f"/workspace/{vol}": vol for vol, _, mount in
                           (item.partition(":") for item in o["volumes"])}
    if o["retries"]:
        body["retries"] = o["retries"]
    if o["after"]:  # the daemon judges the grammar (domain/dependencies.py)
        body["after"] = [item for value in o["after"] for item in value.split(",")]
        if o["replace"] and any(_names_itself(item, o["name"], o["project"])
                                for item in body["after"]):
            # The old job would be removed first and the create refused: refuse both now.
            raise Usage(f"--after names {o['name']}, the job --replace removes; a job "
                        "cannot wait for itself", "--after")
    if gang:
        body["distributed"] = gang
    return body


def _names_itself(item: str, name: str, project: str | None) -> bool:
    """Whether the `--after` ITEM names job NAME of PROJECT (None: the caller's own)."""
    *kinds, target = item.strip().split(":")
    if "sweep" in kinds:
        return False
    where, _, named = target.rpartition("/")
    return named == name and (not where or where == project)


def run(o: dict[str, Any]) -> int:
    """`job run`: submit, then (unless detached) stream the log and return the job's exit
    code. Raises `Usage` only before anything is sent."""
    body = run_body(o)
    from noduslocal.sdk.api_client import ApiClient

    client = ApiClient()
    if o["uploads"]:
        from noduslocal.cli.output import upload_said

        body["source"] = client.upload_source(list(o["uploads"]), contents_of_single_dir=False,
                                              allow_large=o["allow_large_source"],
                                              say=upload_said(quiet=o["as_json"]))
        if o["allow_large_source"]:
            body["allow_large_source"] = True
    if o["replace"]:
        _replace(client, o["name"], o["project"])
    created = client.create_job(body)
    from noduslocal.cli import output

    if o["detach"]:
        if o["as_json"]:
            output.print_json(created)
        else:
            print(created["name"])
        return 0
    if sys.stderr.isatty():  # whom to ask later (download, logs); scripts read stdout
        print(f"noduslocal: job {created['name']} (project {created['project']}); Ctrl-C "
              "detaches", file=sys.stderr, flush=True)
    # With --json, stdout carries only the final document; the log goes to stderr.
    out = sys.stderr.buffer if o["as_json"] else sys.stdout.buffer
    try:
        try:
            # Every rank's and every index's lines, prefixed, as `logs --rank/--index all`.
            for chunk in client.logs(created["name"], created["project"], follow=True,
                                     rank="all" if "distributed" in body else None,
                                     index="all" if (body.get("completions") or 1) > 1 else None):
                out.write(chunk)
                out.flush()
        except errors.DaemonUnavailable:
            print("noduslocal: the log stream broke off (daemon restarting?); waiting "
                  f"for {created['name']} to end", file=sys.stderr)
        final = client.wait_job(created["name"], created["project"])
    except KeyboardInterrupt:
        print(f"\ndetached from {created['name']}; it keeps running. "
              f"Follow: noduslocal job logs -f {created['name']}  "
              f"Stop: noduslocal job kill {created['name']}", file=sys.stderr)
        return 130
    if o["as_json"]:
        output.print_json(final)
    elif exit_code(final) != 0:
        print(f"noduslocal: {output.summary(final)}", file=sys.stderr)
    return exit_code(final)


def _replace(client: ApiClient, name: str, project: str | None) -> None:
    """Make the name free: the job that has it is cancelled (and waited for) if it has
    not ended, then removed."""
    from noduslocal.domain.states import TERMINAL

    try:
        old = client.get_job(name, project)
    except errors.NotFound:
        return
    if old["phase"] not in TERMINAL:
        client.cancel_job(name, project)
        client.wait_job(name, project)
    client.remove_job(name, project)


def list_jobs(o: dict[str, Any]) -> int:
    """`job list`: everyone's jobs as a table, or JSON."""
    phases = None
    if o["phases"]:  # the enum costs an unfiltered listing a millisecond
        from noduslocal.domain.states import Phase

        by_lower = {p.value.lower(): p.value for p in Phase}
        unknown = [x for x in o["phases"] if x.lower() not in by_lower]
        if unknown:
            raise Usage(f"{unknown[0]!r} is not one of {', '.join(by_lower.values())}",
                        "--phase")
        phases = [by_lower[x.lower()] for x in o["phases"]]
    labels = pairs(o["labels"], "--label")
    from noduslocal.cli import output
    from noduslocal.sdk.api_client import ApiClient

    jobs = ApiClient().list_jobs(phases=phases,
                              owner=o["owner"], project=o["project"], labels=labels,
                              all=o["show_all"], limit=o["limit"])
    if o["as_json"]:
        output.print_json(jobs)
        return 0
    from noduslocal.cli import job_rows

    output.print_table(job_rows.HEADER, job_rows.rows(jobs, cells=o.get("cells", False)))
    return 0
