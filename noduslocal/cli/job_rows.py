"""The rows of `job list`'s table: one per job, and one per sweep for its cells (unless
`--cells`), so a 500-task sweep reads as a line, not 500."""

from __future__ import annotations

from noduslocal.cli import output

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs the fast path (cli/fast.py) an import
    from typing import Any

HEADER = ("NAME", "PROJECT", "OWNER", "PHASE", "WHY", "AGE", "RAN", "EXIT")
# The phase a sweep's line shows: the first of these any listed cell is in.
PHASE_ORDER = ("Running", "Starting", "Pending", "Suspended", "Failed", "Cancelled",
               "Succeeded")


def _job_row(j: dict[str, Any]) -> tuple[Any, ...]:
    return (j["name"], j["project"], j["owner"], j["phase"],
            j.get("hold") or j.get("message") or j.get("reason") or "",
            output.age(j["created_at"]), output.duration(j.get("duration_s")),
            "" if j.get("exit_code") is None else j["exit_code"])


def _sweep_of(j: dict[str, Any]) -> str | None:
    """The sweep a cell belongs to (its `sweep` label); None for any other job."""
    if j.get("cell") is None:
        return None
    sweep = (j.get("labels") or {}).get("sweep")
    return sweep if isinstance(sweep, str) else None


def rows(jobs: list[dict[str, Any]], cells: bool) -> list[tuple[Any, ...]]:
    """A row per job in the listing's order; without `cells`, a sweep's listed cells one
    row at the place of its first: its name, the busiest phase among them, and how many
    are in each phase."""
    if cells:
        return [_job_row(j) for j in jobs]
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    order: list[tuple[str, str] | dict[str, Any]] = []
    for j in jobs:
        sweep = _sweep_of(j)
        if sweep is None:
            order.append(j)
            continue
        key = (j["project"], sweep)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(j)
    out: list[tuple[Any, ...]] = []
    for item in order:
        if isinstance(item, dict):
            out.append(_job_row(item))
            continue
        mine = groups[item]
        counts: dict[str, int] = {}
        for j in mine:
            counts[j["phase"]] = counts.get(j["phase"], 0) + 1
        phase = next((p for p in PHASE_ORDER if p in counts), mine[0]["phase"])
        said = ", ".join(f"{counts[p]} {p.lower()}" for p in PHASE_ORDER if p in counts)
        out.append((item[1], item[0], mine[0]["owner"], phase,
                    f"sweep: {len(mine)} tasks listed ({said}); --cells lists them",
                    output.age(min(j["created_at"] for j in mine)), "", ""))
    return out
