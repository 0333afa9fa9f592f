"""Job dependencies (`after`): the one grammar the CLI, the SDK and the API share, the
conditions (Slurm's afterok, afterany, afternotok) and what an ended job or sweep means
for each. Stdlib only; the daemon resolves names to ids when the job is stored.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.states import SWEEP_TERMINAL, TERMINAL, Phase, SweepPhase

AFTER_OK, AFTER_ANY, AFTER_NOT_OK = "afterok", "afterany", "afternotok"
CONDITIONS = (AFTER_OK, AFTER_ANY, AFTER_NOT_OK)
MAX_AFTER = 100  # dependencies of one job
_NAME = r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?"
ITEM_RE = re.compile(rf"(?:(?P<condition>{'|'.join(CONDITIONS)}):)?(?P<sweep>sweep:)?"
                     rf"(?:(?P<project>{_NAME})/)?(?P<name>{_NAME})\Z")
GRAMMAR = ("[afterok:|afterany:|afternotok:][sweep:][PROJECT/]NAME, e.g. pre, "
           "afterany:prep, sweep:lr-sweep, afternotok:team/train")


@dataclass(frozen=True)
class Dependency:
    """One entry of a job's `after`: the job (or sweep) it waits for and on what
    condition. `id` is set once the daemon has resolved the name (a name can be freed by
    `job rm` and taken by another job; the dependency stays on the one named at create)."""

    name: str
    project: str | None = None
    condition: str = AFTER_OK
    sweep: bool = False
    id: int | None = None

    @property
    def label(self) -> str:
        """`job pre` or `sweep team/lr`, as messages name it."""
        where = f"{self.project}/" if self.project else ""
        return f"{'sweep' if self.sweep else 'job'} {where}{self.name}"

    def to_wire(self) -> dict[str, Any]:
        return {"kind": "sweep" if self.sweep else "job", "name": self.name,
                "project": self.project, "condition": self.condition, "id": self.id}

    @classmethod
    def from_stored(cls, data: Mapping[str, Any]) -> Dependency:
        return cls(data["name"], data.get("project"), data.get("condition") or AFTER_OK,
                   data.get("kind") == "sweep", data.get("id"))

    def resolved(self, project: str, id_: int) -> Dependency:
        return replace(self, project=project, id=id_)


def parse_item(text: str) -> Dependency:
    match = ITEM_RE.fullmatch(text)
    if match is None:
        raise InvalidArgument(f"after: {text[:80]!r} is not a dependency; use {GRAMMAR}",
                              field="after")
    return Dependency(match["name"], match["project"], match["condition"] or AFTER_OK,
                      bool(match["sweep"]))


def parse_after(value: Any) -> list[Dependency]:
    """The create body's `after`: a list of strings in the grammar above (a comma-separated
    string is taken as that list), or of {"job"|"sweep": "[PROJECT/]NAME", "condition": C}."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list):
        raise InvalidArgument(f"after: expected a list of dependencies ({GRAMMAR})",
                              field="after")
    found: list[Dependency] = []
    for item in value:
        if isinstance(item, Mapping):
            item = _from_mapping(item)
        if not isinstance(item, str):
            raise InvalidArgument(f"after: each dependency is a string ({GRAMMAR})",
                                  field="after")
        dep = parse_item(item.strip())
        if any(d.sweep == dep.sweep and d.name == dep.name and d.project == dep.project
               for d in found):
            raise InvalidArgument(f"after: {dep.label} is named twice", field="after")
        found.append(dep)
    if len(found) > MAX_AFTER:
        raise InvalidArgument(f"after: at most {MAX_AFTER} dependencies", field="after")
    return found


def _from_mapping(item: Mapping[str, Any]) -> str:
    kinds = [k for k in ("job", "sweep") if k in item]
    if len(kinds) != 1 or set(item) - {"job", "sweep", "condition"}:
        raise InvalidArgument('after: an object is {"job": NAME} or {"sweep": NAME}, with '
                              'an optional "condition"', field="after")
    name = item[kinds[0]]
    condition = item.get("condition") or AFTER_OK
    if not isinstance(name, str) or condition not in CONDITIONS:
        raise InvalidArgument(f"after: a name and a condition of {', '.join(CONDITIONS)}",
                              field="after")
    return f"{condition}:{'sweep:' if kinds[0] == 'sweep' else ''}{name}"


def verdict(dep: Dependency, phase: str) -> bool | None:
    """True: `phase` (of the job or sweep depended on) meets the condition; False: it
    never will (it ended otherwise); None: not yet (it has not ended)."""
    ended = SWEEP_TERMINAL if dep.sweep else TERMINAL
    if phase not in {p.value for p in ended}:
        return None
    succeeded = phase == (SweepPhase.SUCCEEDED if dep.sweep else Phase.SUCCEEDED)
    if dep.condition == AFTER_ANY:
        return True
    return succeeded if dep.condition == AFTER_OK else not succeeded


def needs(dep: Dependency) -> str:
    """What the condition waits for, in words."""
    return {AFTER_OK: "to succeed", AFTER_ANY: "to end",
            AFTER_NOT_OK: "to fail or be cancelled"}[dep.condition]
