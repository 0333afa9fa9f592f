"""The SDK's Sweep: one Job template run over a grid of GPUs, regions and parameters
(the reference `nodus.Sweep`): describe it, `run()` it, then `wait()`, `status()` and
`cells()` for the report.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from noduslocal.domain import errors
from noduslocal.sdk.job import (
    _wire,
    after_argument,
    default_client,
    text_argument,
    timeout_argument,
)
from noduslocal.sdk.view import View


class Sweep:
    def __init__(self, target: Mapping[str, Any] | None = None, *,
                 grid: Mapping[str, Iterable[Any] | str] | None = None,
                 repetitions: int | None = None, max_parallel: int | None = None,
                 max_cost: Any = None, name: str | None = None,
                 labels: dict[str, str] | None = None, project: str | None = None,
                 after: Any = None) -> None:
        if target is not None and not isinstance(target, Mapping):
            # A Function or a recipe: the daemon serves Job templates only.
            raise errors.Unsupported("target")
        self._target = dict(target or {})
        self._grid = None if grid is None else _grid(grid)
        self._repetitions = repetitions
        self._max_parallel = max_parallel
        self._max_cost = max_cost
        self._labels = labels
        self._project = project
        self._after = None if after is None else after_argument(after)
        self.name = name
        self._client = default_client()
        self._obj: View | None = None

    def __repr__(self) -> str:
        return f"Sweep({self.name!r}, project={self._project!r})"

    def _body(self) -> dict[str, Any]:
        source = self._target.get("source")
        body = {"name": self.name, "project": self._project, "labels": self._labels,
                "template": {k: _wire(v, f"template.{k}") for k, v in self._target.items()},
                "grid": self._grid, "repetitions": self._repetitions,
                "max_parallel": self._max_parallel, "max_cost": self._max_cost,
                "after": self._after}
        # Every argument checked before anything is uploaded.
        wired = {k: _wire(v, k) for k, v in body.items() if v is not None}
        if isinstance(source, str | os.PathLike):
            # A path is packed and uploaded once; every cell starts from the same bytes.
            template = wired["template"]
            template["source"] = self._client.upload_source(
                [Path(source)], contents_of_single_dir=True,
                allow_large=bool(template.pop("allow_large_source", False)))
        return wired

    def run(self, idempotency_key: str | None = None, replace: bool = False) -> Sweep:
        """Create the Sweep (every cell in one call) and return it; the same key gives
        the same sweep. A sweep of the same name already in the project is refused
        (AlreadyExists), even an ended one, until it is removed (`sweep rm`);
        `replace=True` removes it first (cancelled if it still runs, its cells waited
        for), as `map --replace` does; its history and cost stay."""
        if replace:
            self._client.replace_sweep(self._named(), self._project)
        doc = self._client.create_sweep(self._body(), idempotency_key=idempotency_key)
        self._take(doc)
        return self

    def _take(self, doc: Mapping[str, Any]) -> View:
        self._obj = View(doc)
        self.name, self._project = doc["name"], doc["project"]
        return self._obj

    def _named(self) -> str:
        if self.name is None:
            raise errors.NotFound("this Sweep has not been run yet; call run() first")
        return self.name

    @classmethod
    def from_name(cls, name: str, project: str | None = None) -> Sweep:
        sweep = cls(name=text_argument(name, "name"),
                    project=text_argument(project, "project", optional=True))
        sweep._take(sweep._client.get_sweep(name, project))
        return sweep

    def status(self) -> View:
        """Phase, counts per phase, cells done and the cost so far."""
        return self._take(self._client.get_sweep(self._named(), self._project))

    def wait(self, timeout: float | None = None) -> View:
        """Block until every cell is terminal and return the status. A sweep with failed
        cells ends Failed (reason CellsFailed) and still returns: only a timeout or a
        missing sweep raise."""
        return self._take(self._client.wait_sweep(self._named(), self._project,
                                                  timeout_argument(timeout)))

    def cells(self) -> list[View]:
        """One entry per cell, in index order: GPU, region, `parameters` (the cell's
        values; also under their first name `params`), phase, cost and wall time."""
        return [View(c) for c in self._client.sweep_cells(self._named(), self._project)]

    def jobs(self) -> list[View]:
        """The Jobs the Sweep created (found by the sweep's id), in cell order: a retried
        cell's jobs in the order they ran, the smoke canary's last."""
        jobs = self._client.list_jobs(sweep=self._named(), project=self._project,
                                      limit=1 << 62)
        return [View(j) for j in sorted(jobs, key=lambda j: (j["cell"] is None,
                                                               j["cell"] or 0))]

    def cancel(self) -> None:
        self._take(self._client.cancel_sweep(self._named(), self._project))

    def estimate(self) -> View:
        """The status's estimate: the cost of every cell (what is spent, what the rest
        should cost) and when the last should end, with the basis of each."""
        return View(self.status()["estimate"])

    def suspend(self) -> None:
        """Release no more cells and stop the running ones (each ends Suspended, its
        checkpoint kept) until resume()."""
        self._take(self._client.suspend_sweep(self._named(), self._project))

    def resume(self) -> None:
        """Go on: the suspended cells wait again in order, the canary first if it had
        not passed."""
        self._take(self._client.resume_sweep(self._named(), self._project))


def _grid(grid: Any) -> dict[str, Any]:
    """The grid as sent: each key's values a list, or a comma-separated string."""
    if not isinstance(grid, Mapping):
        raise errors.InvalidArgument("grid: expected a mapping of key to values, e.g. "
                                     '{"lr": [1e-4, 3e-4]}', field="grid")
    sent: dict[str, Any] = {}
    for key, values in grid.items():
        if isinstance(values, str):
            sent[key] = values
        elif isinstance(values, Iterable) and not isinstance(values, bytes | Mapping):
            sent[key] = list(values)
        else:
            raise errors.InvalidArgument(f"grid: the values of {key!r} are a list or a "
                                         "comma-separated string, not "
                                         f"{type(values).__name__}", field="grid")
    return sent
