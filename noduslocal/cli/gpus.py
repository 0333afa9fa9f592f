"""`noduslocal gpus`: the box's GPUs, who holds each, and what else runs on them;
`--watch` redraws it live."""

from __future__ import annotations

import time
from typing import Any

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option
from noduslocal.domain.units import fmt_bytes
from noduslocal.sdk.api_client import ApiClient


def _rows(doc: dict[str, Any]) -> list[tuple[Any, ...]]:
    rows = []
    for g in doc["gpus"]:
        holder = g.get("job")
        state = ("unhealthy" if not g["healthy"] else "drained" if g.get("drained")
                 else "busy" if g.get("busy") else "in use" if holder else "free")
        foreign = ", ".join(f"{p['pid']} ({p.get('user') or '?'}"
                            + (f", {fmt_bytes(p['used_memory'])})" if p.get("used_memory")
                               else ")") for p in g["processes"]) if not holder else ""
        rows.append((
            g["index"], g["model"], f"{fmt_bytes(g['memory_used'])} / "
            f"{fmt_bytes(g['memory_total'])}",
            "-" if g.get("utilization") is None else f"{g['utilization']}%",
            "-" if g.get("power_w") is None else f"{g['power_w']:.0f} W", state,
            f"{holder['project']}/{holder['name']}"
            + (f" rank {holder['rank']}" if holder.get("rank") is not None else "")
            + f" ({holder['owner']})" if holder else "",
            foreign or (g.get("problem") or "")))
    return rows


def _draw(doc: dict[str, Any]) -> None:
    if doc.get("simulated"):
        click.echo(f"SIMULATED GPUs ({doc.get('note')})")
    if not doc["gpus"]:
        click.echo(f"no GPUs: {doc.get('note') or 'none found'}")
        return
    output.print_table(("GPU", "MODEL", "MEMORY", "UTIL", "POWER", "STATE", "JOB",
                        "OTHER PROCESSES / PROBLEM"), _rows(doc))


@click.group(invoke_without_command=True)
@click.option("--watch", "-w", is_flag=True, help="Redraw every 2 seconds.")
@json_option
@click.pass_context
def gpus(ctx: click.Context, watch: bool, as_json: bool) -> None:
    """The GPUs: model, memory, load, power, health, the job and user holding each, and
    processes noduslocal did not start. Admins: `gpus drain IDX`, `gpus undrain IDX`."""
    if ctx.invoked_subcommand is not None:
        return
    client = ApiClient()
    if as_json:
        output.print_json(client.gpus())
        return
    if not watch:
        _draw(client.gpus())
        return
    from rich.live import Live  # only the live view pays for rich

    try:
        with Live(_live_table(client.gpus()), refresh_per_second=2, screen=False) as live:
            while True:
                time.sleep(2)
                live.update(_live_table(client.gpus()))
    except KeyboardInterrupt:
        pass


def _live_table(doc: dict[str, Any]) -> Any:
    from rich.table import Table

    title = time.strftime("%H:%M:%S") + "  noduslocal gpus (Ctrl-C to stop)"
    if doc.get("simulated"):
        title += f"  SIMULATED ({doc.get('note')})"
    table = Table(title=title, title_justify="left")
    for column in ("GPU", "MODEL", "MEMORY", "UTIL", "POWER", "STATE", "JOB",
                   "OTHER PROCESSES / PROBLEM"):
        table.add_column(column)
    styles = {"free": "green", "in use": "cyan", "busy": "yellow", "drained": "magenta",
              "unhealthy": "bold red"}
    for row in _rows(doc):
        table.add_row(*(str(v) for v in row), style=styles.get(str(row[5]), ""))
    if not doc["gpus"]:
        table.caption = f"no GPUs: {doc.get('note') or 'none found'}"
    return table


@gpus.command()
@click.argument("index")
def drain(index: str) -> None:
    """Let the work on GPU INDEX (or UUID) finish and place nothing new there (admins)."""
    done = ApiClient().drain_gpu(index, True)
    click.echo(f"GPU {done['index']} drained: what runs there finishes, nothing new lands")


@gpus.command()
@click.argument("index")
def undrain(index: str) -> None:
    """Place work on GPU INDEX (or UUID) again (admins)."""
    done = ApiClient().drain_gpu(index, False)
    click.echo(f"GPU {done['index']} back in service")
