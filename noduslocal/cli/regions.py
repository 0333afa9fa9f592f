"""`noduslocal regions`: where jobs may run (`--region NAME`): this box, and each cluster
region the daemon's config names, with its partitions, nodes and GPUs free now."""

from __future__ import annotations

from typing import Any

import click

from noduslocal.cli import output
from noduslocal.cli.job import json_option
from noduslocal.domain.units import fmt_bytes
from noduslocal.sdk.api_client import ApiClient


def _gpus(gpus: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{g['free']}/{g['total']} {kind}" for kind, g in sorted(gpus.items())) \
        or "-"


def _rows(regions: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = []
    for region in regions:
        if region.get("this_box"):
            rows.append((region["name"], "this box", "-",
                         f"{region['cpus'] - region['cpus_used']:g}/{region['cpus']:g}",
                         f"{fmt_bytes(region['memory'] - region['memory_used'])}/"
                         f"{fmt_bytes(region['memory'])}", _gpus(region["gpus"]), "up"))
            continue
        if not region["reachable"]:
            rows.append((region["name"], region["runtime"], region.get("partition") or "-",
                         "-", "-", "-", f"unreachable: {region['error']}"))
            continue
        for part in region["partitions"]:
            nodes = part["nodes"]
            usable = [n for n in nodes if n["usable"]]
            cpus = sum(n["cpus"] - n["cpus_used"] for n in usable)
            memory = sum(n["memory"] - n["memory_used"] for n in usable)
            rows.append((region["name"], region["runtime"],
                         part["name"] + ("*" if part["default"] else ""),
                         f"{cpus}/{sum(n['cpus'] for n in nodes)}",
                         f"{fmt_bytes(memory)}/{fmt_bytes(sum(n['memory'] for n in nodes))}",
                         _gpus(part["gpus"]),
                         f"{part['state'].lower()}, {len(usable)}/{len(nodes)} nodes usable"))
    return rows


@click.command("regions")
@click.option("--nodes", "show_nodes", is_flag=True, help="A line per node of each cluster.")
@json_option
def regions(show_nodes: bool, as_json: bool) -> None:
    """Where jobs may run: this box and each cluster region (`job run --region NAME`),
    with the CPUs, memory and GPUs free now (free/total; * marks Slurm's default
    partition)."""
    found = ApiClient().transport.request("GET", "/v1/regions")["regions"]
    if as_json:
        output.print_json(found)
        return
    output.print_table(("REGION", "RUNTIME", "PARTITION", "CPUS FREE", "MEMORY FREE",
                        "GPUS FREE", "STATE"), _rows(found))
    if show_nodes:
        rows = [(region["name"], part["name"], node["name"], node["state"].lower(),
                 f"{node['cpus'] - node['cpus_used']}/{node['cpus']}", _gpus(node["gpus"]),
                 node.get("reason") or "")
                for region in found for part in region.get("partitions", [])
                for node in part["nodes"]]
        click.echo()
        output.print_table(("REGION", "PARTITION", "NODE", "STATE", "CPUS FREE", "GPUS FREE",
                            "REASON"), rows)
