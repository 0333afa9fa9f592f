"""A sweep as the store keeps it: its spec (what the sweeps row keeps of the plan it was
made from: the template, the grid or the map's tasks, the canary, webhook and budget) and
its record, the row the API shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from noduslocal.domain.jobs import JobSpec
from noduslocal.domain.map_args import Expansion, Group
from noduslocal.domain.sweep_grid import Grid
from noduslocal.domain.timefmt import iso


@dataclass(frozen=True)
class SweepSpec:
    """The definition a sweep's cells were made from (each cell keeps its own job spec)."""

    template: JobSpec
    canary: str  # "cell": cell 0 gates the rest; "smoke": the smoke command; "none"
    webhook: str | None = None  # POSTed the status on canary pass/failure and at the end
    smoke: list[str] | None = None  # canary "smoke": the cheap command that gates instead
    max_cost: float | None = None  # no cell starts once spent + running estimates pass it
    grid: Grid | None = None
    tasks: Expansion | None = None  # a `map` sweep's tasks (then `grid` is not read)
    smoke_job: int | None = None  # the smoke canary's job, once made (a copy after a retry)

    def cells_alike(self) -> bool:
        """Every cell asks for the template's resources: no grid over `gpu` (a map's
        tasks differ in their command only; a grid's `region` moves no resource)."""
        return (self.tasks is not None or self.grid is None
                or all(axis.key != "gpu" for axis in self.grid.axes))

    def params(self, index: int) -> dict[str, Any]:
        """What sets cell `index` apart: its `map` task's values, or its grid values."""
        if self.tasks is not None:
            return self.tasks.task(index).named(self.tasks.groups)
        return self.grid.params(index) if self.grid is not None else {}

    def to_wire(self) -> dict[str, Any]:
        """The row's JSON (the order of its keys is the order it was always written in)."""
        wire: dict[str, Any] = {
            "template": self.template.to_wire(), "canary": self.canary,
            "webhook": self.webhook, "smoke": self.smoke, "max_cost": self.max_cost,
            "grid": self.grid.to_wire() if self.grid is not None else None,
            "map": None if self.tasks is None else {
                "command": list(self.tasks.command),
                "groups": [[g.name, list(g.values)] for g in self.tasks.groups],
                "rows": None if self.tasks.rows is None
                else [list(row) for row in self.tasks.rows]}}
        if self.smoke_job is not None:
            wire["smoke_job"] = self.smoke_job
        return wire

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> SweepSpec:
        tasks = data.get("map")
        rows = None if not tasks else tasks.get("rows")
        return cls(
            template=JobSpec.from_stored(data["template"]),
            canary=data["canary"],
            webhook=data.get("webhook"),
            smoke=data.get("smoke"),
            max_cost=data.get("max_cost"),
            grid=Grid.from_wire(data["grid"]) if data.get("grid") else None,
            tasks=None if not tasks else Expansion(
                tuple(tasks["command"]),
                tuple(Group(name, tuple(values)) for name, values in tasks["groups"]),
                None if rows is None else tuple(tuple(row) for row in rows)),
            smoke_job=data.get("smoke_job"))


@dataclass
class SweepRecord:
    """One row of the sweeps table."""

    id: int
    project: str
    name: str
    owner_uid: int
    owner_gid: int
    owner: str
    phase: str
    spec: SweepSpec
    labels: dict[str, str]
    cells: int
    max_parallel: int
    created_at: float
    reason: str | None = None
    message: str | None = None
    ended_at: float | None = None
    freed_at: float | None = None  # its cells' workspaces were freed (`sweep gc`)

    def to_wire(self) -> dict[str, Any]:
        return {"kind": "Sweep", "name": self.name, "project": self.project,
                "owner": self.owner, "uid": self.owner_uid, "phase": self.phase,
                "reason": self.reason, "message": self.message, "cells": self.cells,
                "max_parallel": self.max_parallel, "created_at": iso(self.created_at),
                "ended_at": iso(self.ended_at), "freed_at": iso(self.freed_at),
                "labels": self.labels, "canary": self.spec.canary,
                "after": [dep.to_wire() for dep in self.spec.template.after]}
