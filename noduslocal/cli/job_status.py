"""`noduslocal job status`: one job, its gang's ranks and its indexes, as lines (or
--json)."""

from __future__ import annotations

from typing import Any

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option, project_option
from noduslocal.domain.states import TERMINAL, Phase
from noduslocal.domain.units import fmt_bytes
from noduslocal.sdk.api_client import ApiClient


@click.command("status")
@click.argument("name")
@project_option
@json_option
def status(name: str, project: str | None, as_json: bool) -> None:
    """Show one job."""
    doc = ApiClient().get_job(name, project)
    if as_json:
        output.print_json(doc)
        return
    spec = doc["spec"]
    lines = [
        ("name", doc["name"]), ("project", doc["project"]), ("owner", doc["owner"]),
        ("phase", doc["phase"]), ("reason", doc.get("reason")), ("message", doc.get("message")),
        ("hold", doc.get("hold")),
        # A job queued or running again: its last attempt's exit is not the job's own.
        (_exit_label(doc, "exit code"), doc.get("exit_code")),
        (_exit_label(doc, "signal"), doc.get("signal")), ("created", doc["created_at"]),
        ("started", doc.get("started_at")), ("ended", doc.get("ended_at")),
        ("files", f"removed by retention at {doc['collected_at']} (keep_ended)"
         if doc.get("collected_at") else None),
        ("ran for", output.duration(doc.get("duration_s"))),
        ("attempts", f"{doc['attempts']} (retries used {doc['retries_used']}/{doc['retries']})"),
        ("cost", f"{doc['cost']:.4f}" + (f" (max {spec['max_cost']:g})" if spec.get("max_cost")
                                         else "") if doc.get("cost") or spec.get("max_cost")
         else None),
        ("gpus", (f"{spec['gpu']['count']} x {spec['gpu']['type'] or 'GPU'}"
                  if spec.get("gpu") else None)),
        ("image", spec.get("image")),
        ("profile", spec.get("profile")),
        ("command", " ".join(spec["command"]) or ("(the image's)" if spec.get("image")
                                                  else None)),
        ("args", " ".join(spec["args"]) if spec.get("image") else None),
        ("network", spec.get("network")),
        ("cpu", spec["cpu"]),
        ("memory", fmt_bytes(spec["memory"]) if spec.get("memory") else None),
        ("disk", fmt_bytes(spec["disk"]) if spec.get("disk") else None),
        ("timeout", output.duration(spec["timeout"]) if spec.get("timeout") else None),
        ("expected", output.duration(spec["expected_duration"])
         if spec.get("expected_duration") else None),
        ("checkpoint", spec.get("checkpoint")),
        ("volumes", ", ".join(f"{name}:{path}" for path, name in
                              (spec.get("volumes") or {}).items())),
        ("labels", ", ".join(f"{k}={v}" for k, v in doc["labels"].items())),
        ("secrets", ", ".join(spec.get("secrets") or [])),
        ("gang", _gang_line(spec.get("distributed"))),
        ("after", ", ".join(_after_item(dep) for dep in spec.get("after") or [])),
    ]
    metrics = doc.get("metrics") or {}
    lines.append(("metrics", ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                       for k, v in metrics.items())))
    for key, value in lines:
        if value not in (None, ""):
            click.echo(f"{key + ':':<11} {value}")
    for rank in doc.get("ranks") or []:
        code = "" if rank["exit_code"] is None else f" (exit {rank['exit_code']})"
        gpus = ",".join(map(str, rank["gpus"])) or "-"
        click.echo(f"  rank {rank['rank']:<3} {rank['state']}{code}  GPUs {gpus}")
    if indexes := doc.get("indexes"):
        failed = f", failed {indexes['failed']}" if indexes["failed"] else ""
        click.echo(f"{'indexes:':<11} {indexes['succeeded']}/{indexes['completions']} "
                   f"succeeded, running {indexes['running'] or 'none'} (at most "
                   f"{indexes['parallelism']}){failed}")


def _exit_label(doc: dict[str, Any], what: str) -> str:
    if doc["phase"] in TERMINAL or doc["phase"] == Phase.SUSPENDED:
        return what
    return f"last attempt's {what}"


def _after_item(dep: dict[str, Any]) -> str:
    kind = "sweep:" if dep["kind"] == "sweep" else ""
    return f"{dep['condition']}:{kind}{dep['project']}/{dep['name']}"


def _gang_line(gang: dict[str, Any] | None) -> str | None:
    if not gang:
        return None
    return (f"{gang['nodes']} ranks x {gang['gpus_per_node']} GPUs, {gang['launcher']}, "
            f"transport {gang['transport']}")
