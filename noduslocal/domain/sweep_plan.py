"""A sweep create, checked whole before anything is written, and the plan it makes: the
template every cell starts from, and each cell's own job spec (its grid values or its
`map` task, and the task environment NODUS_* and SUPERCOMPUTER_*), computed by index.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit

from noduslocal.domain import map_args as expand
from noduslocal.domain.errors import InvalidArgument, Unsupported
from noduslocal.domain.gpu_request import GpuRequest, parse_gpu
from noduslocal.domain.jobs import CreateRequest, JobSpec
from noduslocal.domain.profiles import with_profile
from noduslocal.domain.sweep_grid import RESOURCE_KEYS, Grid, parse_grid
from noduslocal.domain.sweeps import SweepSpec
from noduslocal.domain.validation import (
    check_cluster_fields,
    check_exec,
    parse_create,
    parse_max_cost,
    validate_name,
)

SWEEP_FIELDS = frozenset({"name", "project", "labels", "template", "grid", "repetitions",
                          "map", "max_parallel", "canary", "canary_smoke", "webhook",
                          "max_cost", "after"})
NOT_YET = {"code": None}
SMOKE_SUFFIX = "canary"  # the smoke command's job is <sweep>-canary
MAX_URL = 2048
TEMPLATE_OWN = frozenset({"name", "project", "labels"})  # the sweep's, not the template's
DEFAULT_MAX_PARALLEL = 8
MAX_PARALLEL = 10_000
CANARY_MODES = ("cell", "none")
MAX_SMOKE = 16 * 1024  # bytes of a smoke canary's shell command: a line, not a program


@dataclass(frozen=True)
class Plan:
    name: str | None
    project: str | None
    labels: dict[str, str]
    template: CreateRequest
    grid: Grid | None
    tasks: expand.Expansion | None
    max_parallel: int
    canary: str  # "cell": cell 0 gates the rest; "smoke": the smoke command; "none"
    gpus: Mapping[str, GpuRequest | None]  # each grid gpu value (gpu_key), parsed once
    webhook: str | None = None  # POSTed the status on canary pass/failure and at the end
    smoke: list[str] | None = None  # canary "smoke": the cheap command that gates instead
    max_cost: float | None = None  # no cell starts once spent + running estimates pass it
    local_region: str = "local"  # this box's region: a grid's cell in it runs here

    def cell_regions(self) -> set[str | None]:
        """The regions its cells run in (None: this box)."""
        axis = next((a for a in self.grid.axes if a.key == "region"), None) \
            if self.grid is not None else None
        if axis is None:
            return {self.template.spec.region}
        return {None if v == self.local_region else str(v) for v in axis.values}

    def smoke_spec(self) -> JobSpec | None:
        """The smoke canary's job: the template (image, GPUs, code) with that command."""
        if self.smoke is None:
            return None
        return replace(self.template.spec, command=self.smoke, args=[], retry_errors=False)

    def __len__(self) -> int:
        return len(self.tasks) if self.tasks is not None else len(self.grid or Grid(()))

    def cell_spec(self, index: int, sweep: str) -> JobSpec:
        env, changes = self._cell(index, sweep)
        return replace(self.template.spec, env=env, **changes)

    def cell_wire(self, index: int, sweep: str, template: dict[str, Any]) -> dict[str, Any]:
        """cell_spec(index, sweep).to_wire(), made from TEMPLATE, the template's own
        to_wire() (once a sweep): key for key the same, without a JobSpec built and turned
        to wire for each cell (a fifth of a 1,000-cell creation, issue 25 part 5)."""
        env, changes = self._cell(index, sweep)
        wire = dict(template)
        wire["env"] = env
        for name, value in changes.items():  # each a JobSpec field of the same wire name
            wire[name] = value.to_wire() if isinstance(value, GpuRequest) else value
        return wire

    def _cell(self, index: int, sweep: str) -> tuple[dict[str, str], dict[str, Any]]:
        """The cell's environment, and its other fields that differ from the template's."""
        base = self.template.spec
        env = dict(base.env)
        changes: dict[str, Any] = {}
        if self.tasks is not None:  # a map task: a failed one is retried too
            changes.update(command=self.tasks.task(index).argv, args=[],
                           retry_errors=bool(base.retries))
        elif self.grid is not None:
            for key, value in self.grid.params(index).items():
                if key == "gpu":
                    changes["gpu"] = self.gpus[gpu_key(value)]
                elif key == "region":
                    changes["region"] = None if value == self.local_region else value
                else:
                    env[key] = value
        total = str(len(self))
        env.update(NODUS_TASK_ID=str(index), NODUS_WORLD_SIZE=total, NODUS_SWEEP=sweep,
                   SUPERCOMPUTER_TASK_ID=str(index), SUPERCOMPUTER_WORLD_SIZE=total,
                   SUPERCOMPUTER_JOB=sweep)
        return env, changes

    def stored(self) -> SweepSpec:
        """What the sweeps row keeps of the plan (the cells keep their own specs)."""
        return SweepSpec(self.template.spec, self.canary, self.webhook, self.smoke,
                         self.max_cost, self.grid, self.tasks)


def parse_sweep(body: Any, *, regions: tuple[str, ...],
                profiles: Mapping[str, Mapping[str, Any]] | None = None) -> Plan:
    if not isinstance(body, Mapping):
        raise InvalidArgument("body: expected a JSON object", field="body")
    for key in NOT_YET:
        if body.get(key) is not None:
            raise Unsupported(key)
    unknown = sorted(set(body) - SWEEP_FIELDS - set(NOT_YET))
    if unknown:
        raise InvalidArgument(f"{unknown[0]}: unknown field; allowed: "
                              f"{', '.join(sorted(SWEEP_FIELDS))}", field=unknown[0])
    name = None if body.get("name") is None else validate_name(body["name"], "name")
    project = None if body.get("project") is None else validate_name(body["project"],
                                                                      "project")
    template_body = body.get("template")
    if not isinstance(template_body, Mapping):
        raise InvalidArgument("template: expected the keyword arguments of Job.create",
                              field="template")
    if own := sorted(TEMPLATE_OWN & set(template_body)):
        raise InvalidArgument(f"template.{own[0]}: set it on the sweep, not its template",
                              field=f"template.{own[0]}")
    if body.get("map") is not None and body.get("grid") is not None:
        raise InvalidArgument("map: a sweep has a grid or map tasks, not both", field="map")
    tasks = _tasks(body.get("map"))
    with_command = dict(template_body)
    if body.get("after") is not None:  # the whole sweep waits: each cell, and its canary
        with_command["after"] = body["after"]
    if tasks is not None:
        with_command["command"] = list(tasks.command)  # checked like any command
    template = parse_create({**with_command, "labels": body.get("labels")}, regions=regions,
                            profiles=profiles)
    if tasks is not None:
        template = replace(template, spec=replace(template.spec, args=[]))
    grid = parse_grid(body.get("grid"), body.get("repetitions")) if tasks is None else None
    if tasks is not None and body.get("repetitions") is not None:
        raise InvalidArgument("repetitions: only for a grid; repeat a map's values instead",
                              field="repetitions")
    gpus = _grid_gpus(grid, regions)
    grid_regions = [value for axis in (grid.axes if grid is not None else ())
                    if axis.key == "region" for value in axis.values]
    clusters = {value for value in grid_regions if value != regions[0]}
    if not grid_regions and template.spec.region is not None:
        clusters.add(template.spec.region)
    # What a cluster's cells may not ask for: the template as its profile fills it, and
    # every GPU of the grid (each is paired with every region of the grid).
    merged, _ = with_profile(with_command, profiles or {})
    if clusters and body.get("max_cost") is not None:
        region = sorted(clusters)[0]
        raise Unsupported("max_cost", message=f"max_cost: not with cells in region {region!r} "
                          f"(a Slurm cluster): their cost is not metered here, so the budget "
                          f"would never see them")
    for region in sorted(clusters):
        check_cluster_fields(merged, region)
        for gpu in gpus.values():
            if gpu is not None and gpu.min_memory is not None:
                raise Unsupported("grid.gpu", message=f"grid.gpu: a GPU's memory cannot be "
                                  f"asked for in region {region!r} (a Slurm cluster): name "
                                  f"a GPU model, whose gres type the region's gpu_types maps")
    max_parallel = body.get("max_parallel", DEFAULT_MAX_PARALLEL)
    if (isinstance(max_parallel, bool) or not isinstance(max_parallel, int)
            or not 1 <= max_parallel <= MAX_PARALLEL):
        raise InvalidArgument(f"max_parallel: expected an integer from 1 to {MAX_PARALLEL}",
                              field="max_parallel")
    canary = body.get("canary", "cell")
    if canary not in CANARY_MODES:
        raise InvalidArgument(f"canary: use one of {', '.join(CANARY_MODES)}", field="canary")
    smoke = body.get("canary_smoke")
    if smoke is not None:
        if not isinstance(smoke, str) or not smoke.strip() or "\0" in smoke:
            raise InvalidArgument("canary_smoke: expected a shell command", field="canary_smoke")
        size = len(smoke.encode(errors="surrogatepass"))
        if size > MAX_SMOKE:
            raise InvalidArgument(f"canary_smoke: a command of {size} bytes; at most "
                                  f"{MAX_SMOKE} (put a longer one in a script)",
                                  field="canary_smoke")
        # It runs as `sh -c SMOKE` with the template's environment: what no process could
        # start with is refused now, not as an exit 126 later.
        check_exec(["sh", "-c", smoke], [], template.spec.env, "canary_smoke")
        if body.get("canary") is not None:
            raise InvalidArgument("canary: give canary or canary_smoke, not both",
                                  field="canary")
        canary = "smoke"
    plan = Plan(name, project, template.labels, template, grid, tasks, max_parallel, canary,
                gpus, _webhook(body.get("webhook")),
                None if smoke is None else ["sh", "-c", smoke],
                parse_max_cost(body.get("max_cost")), regions[0])
    _check_cells(plan)
    if name is not None and len(f"{name}-{len(plan) - 1}") > 63:
        raise InvalidArgument(f"name: {name!r} is too long for cell names like "
                              f"{name}-{len(plan) - 1} (63 characters at most)", field="name")
    return plan


def _check_cells(plan: Plan) -> None:
    """Refuse at create what no cell's process could be started with (each would end Lost):
    a NUL in any value, or the cell with the longest values over what a process takes."""
    if plan.tasks is not None:
        field_name = "map"
        columns = [g.values for g in plan.tasks.groups] if plan.tasks.rows is None else \
            [tuple(col) for col in zip(*plan.tasks.rows, strict=True)]
    elif plan.grid is not None:
        field_name = "grid"
        columns = [tuple(str(v) for v in a.values) for a in plan.grid.axes
                   if a.key not in RESOURCE_KEYS]
    else:
        return
    if any("\0" in value for column in columns for value in column):
        raise InvalidArgument(f"{field_name}: a value contains a NUL byte, which no "
                              "argument or variable can hold", field=field_name)
    spec = plan.cell_spec(_longest_cell(plan), "x" * 63)
    check_exec(spec.command, spec.args, spec.env, field_name)


def _longest_cell(plan: Plan) -> int:
    """The cell whose values are the longest: a cell's command and environment only grow
    with its values, so if it fits every cell does (for rows, the longest row)."""
    def size(value: Any) -> int:
        return len(str(value).encode(errors="surrogatepass"))

    if plan.tasks is not None and plan.tasks.rows is not None:
        rows = plan.tasks.rows
        return max(range(len(rows)), key=lambda i: sum(map(size, rows[i])), default=0)
    columns = [g.values for g in plan.tasks.groups] if plan.tasks is not None else \
        [a.values for a in plan.grid.axes] if plan.grid is not None else []
    index = 0
    for column in columns:
        index = index * len(column) + max(range(len(column)), key=lambda i: size(column[i]))
    return index * (plan.grid.repetitions if plan.tasks is None and plan.grid else 1)


def _webhook(value: Any) -> str | None:
    if value is None:
        return None
    try:
        parsed = urlsplit(value) if isinstance(value, str) else None
    except ValueError:  # "Invalid IPv6 URL" and the like
        parsed = None
    if (parsed is None or parsed.scheme not in ("http", "https") or not parsed.hostname
            or len(value) > MAX_URL):
        raise InvalidArgument("webhook: expected an http:// or https:// URL", field="webhook")
    return str(value)


def gpu_key(value: Any) -> str:
    """A grid's GPU value as a key: requests may be numbers, strings or mappings."""
    return json.dumps(value, sort_keys=True)


def _tasks(value: Any) -> expand.Expansion | None:
    if value is None:
        return None
    if isinstance(value, Mapping) and "command" in value:
        return _structured(value)
    if not isinstance(value, Mapping) or set(value) - {"args", "lines"}:
        raise InvalidArgument('map: expected {"args": [...], "lines": [...]} or {"command": '
                              '[...], "groups": [[NAME, [VALUES]], ...]} or {"command": '
                              '[...], "rows": {"names": [...], "values": [[...], ...]}}',
                              field="map")
    args, lines = value.get("args"), value.get("lines")
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise InvalidArgument("map.args: expected a list of strings", field="map.args")
    if lines is not None and (not isinstance(lines, list)
                              or not all(isinstance(x, str) for x in lines)):
        raise InvalidArgument("map.lines: expected a list of strings", field="map.lines")
    return expand.parse(args, lines)


def _structured(value: Mapping[str, Any]) -> expand.Expansion:
    """The SDK's map: values as they are, as a product of groups or one row per task."""
    if set(value) - {"command", "groups", "rows"} or ("groups" in value) == ("rows" in value):
        raise InvalidArgument('map: {"command": [...]} with "groups" or "rows"', field="map")
    command = value["command"]
    if not isinstance(command, list) or not all(isinstance(c, str) for c in command):
        raise InvalidArgument("map.command: expected a list of strings", field="map.command")
    try:
        if "rows" in value:
            rows = value["rows"]
            names = [str(n) for n in rows["names"]]
            return expand.structured(command, rows=(names, [[str(v) for v in row]
                                                            for row in rows["values"]]))
        return expand.structured(command, groups=[
            (None if name is None else str(name), [str(v) for v in values])
            for name, values in value["groups"]])
    except (KeyError, TypeError, ValueError):
        raise InvalidArgument("map: groups are [[NAME or null, [VALUES]], ...]; rows are "
                              '{"names": [...], "values": [[...], ...]}', field="map") from None


def _grid_gpus(grid: Grid | None, regions: tuple[str, ...]) -> dict[str, GpuRequest | None]:
    gpus: dict[str, GpuRequest | None] = {}
    for axis in grid.axes if grid is not None else ():
        for value in axis.values:
            if axis.key == "gpu":
                gpus[gpu_key(value)] = parse_gpu(value, "grid.gpu")
            elif axis.key == "region" and value not in regions:
                raise InvalidArgument(f"grid.region: {value!r} is not a region of this host; "
                                      f"valid: {', '.join(regions)}", field="grid.region")
    return gpus
