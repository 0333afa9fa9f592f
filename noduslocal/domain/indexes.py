"""An indexed job as the store keeps it and a create body gives it: `completions` indexes
(0..N-1), at most `parallelism` of them at once. Stdlib only: shared by the daemon, the
client and the CLI.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from noduslocal.domain.errors import InvalidArgument

MAX_COMPLETIONS = 100_000
MAX_PARALLELISM = 256


@dataclass(frozen=True)
class Indexed:
    completions: int
    parallelism: int = 1

    def env(self, index: int) -> dict[str, str]:
        # JOB_COMPLETION_INDEX: what a Kubernetes indexed Job's pods read.
        return {"NODUS_INDEX": str(index), "JOB_COMPLETION_INDEX": str(index),
                "NODUS_COMPLETIONS": str(self.completions)}

    def to_wire(self) -> dict[str, int]:
        return {"completions": self.completions, "parallelism": self.parallelism}

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> Indexed | None:
        return None if not data else cls(int(data["completions"]), int(data["parallelism"]))


def _count(value: Any, name: str, most: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise InvalidArgument(f"{name}: expected an integer from 1 to {most}", field=name)
    return value


def parse_indexed(completions: Any, parallelism: Any, gang: bool) -> Indexed | None:
    """None for an ordinary job (completions unset or 1, parallelism unset or 1)."""
    n = _count(completions, "completions", MAX_COMPLETIONS)
    p = _count(parallelism, "parallelism", MAX_PARALLELISM)
    if (n or 1) == 1 and (p or 1) == 1:
        return None
    if n is None or n == 1:
        raise InvalidArgument("parallelism: only an indexed job (completions > 1) runs "
                              "indexes in parallel", field="parallelism")
    if p is not None and p > n:
        raise InvalidArgument(f"parallelism: {p} is more than its {n} completions",
                              field="parallelism")
    if gang:
        raise InvalidArgument("completions: a gang (distributed) cannot also be indexed",
                              field="completions")
    return Indexed(n, p or 1)


INDEX_FIELD = "{index}"  # in an indexed job's output path: the index that wrote it


def check_index_outputs(outputs: Mapping[str, str]) -> None:
    """Indexes share the workspace, so each output path names its index (collected from
    each index as it ends, downloaded by index)."""
    for name, path in outputs.items():
        if INDEX_FIELD not in path:
            raise InvalidArgument(
                f"outputs.{name}: an indexed job's output path names {INDEX_FIELD}, e.g. "
                f"out/model-{INDEX_FIELD}.pt, so indexes never overwrite each other's",
                field=f"outputs.{name}")


def output_path(path: str, index: int) -> str:
    return path.replace(INDEX_FIELD, str(index))
