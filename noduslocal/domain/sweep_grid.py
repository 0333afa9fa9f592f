"""The SDK's sweep grid: keys in order, each with a list of values (a string is a
comma-separated list); cells are the cartesian product, the last key varying fastest, each
repeated `repetitions` times. `gpu` and `region` set a cell's GPU request and region; any
other key becomes an environment variable of the cell.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.validation import ENV_KEY_RE

RESOURCE_KEYS = frozenset({"gpu", "region"})
MAX_CELLS = 100_000
MAX_REPETITIONS = 1000


@dataclass(frozen=True)
class Axis:
    key: str
    values: tuple[Any, ...]  # str for environment keys; as given for gpu and region


@dataclass(frozen=True)
class Grid:
    axes: tuple[Axis, ...]
    repetitions: int = 1

    def __len__(self) -> int:
        count = self.repetitions
        for axis in self.axes:
            count *= len(axis.values)
        return count

    def params(self, index: int) -> dict[str, Any]:
        """Cell `index`'s value of each key (repetitions of a combination are adjacent)."""
        if not 0 <= index < len(self):
            raise IndexError(index)
        combo = index // self.repetitions
        picked: dict[str, Any] = {}
        for axis in reversed(self.axes):
            combo, digit = divmod(combo, len(axis.values))
            picked[axis.key] = axis.values[digit]
        return {axis.key: picked[axis.key] for axis in self.axes}

    def to_wire(self) -> dict[str, Any]:
        return {"axes": [[a.key, list(a.values)] for a in self.axes],
                "repetitions": self.repetitions}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> Grid:
        return cls(tuple(Axis(k, tuple(v)) for k, v in data["axes"]), data["repetitions"])


def parse_grid(grid: Any, repetitions: Any = None) -> Grid:
    """Check a grid as sent (a mapping of key to values) and how often each cell repeats."""
    if repetitions is None:
        repetitions = 1
    if (not isinstance(repetitions, int) or isinstance(repetitions, bool)
            or not 1 <= repetitions <= MAX_REPETITIONS):
        raise InvalidArgument(f"repetitions: expected an integer from 1 to {MAX_REPETITIONS}",
                              field="repetitions")
    if grid is None:
        return Grid((), repetitions)
    if not isinstance(grid, Mapping):
        raise InvalidArgument("grid: expected a mapping of key to a list of values",
                              field="grid")
    axes = []
    for key, raw in grid.items():
        if not isinstance(key, str) or not (key in RESOURCE_KEYS or ENV_KEY_RE.fullmatch(key)):
            raise InvalidArgument(
                f"grid: {key!r} is neither gpu, region nor an environment variable name "
                "(letters, digits and '_', not starting with a digit)", field="grid")
        values = _values(key, raw)
        if key not in RESOURCE_KEYS:
            values = tuple(_env_value(key, v) for v in values)
        axes.append(Axis(key, values))
    parsed = Grid(tuple(axes), repetitions)
    if len(parsed) > MAX_CELLS:
        raise InvalidArgument(f"grid: {len(parsed)} cells; at most {MAX_CELLS} in one sweep",
                              field="grid")
    return parsed


def _values(key: str, raw: Any) -> tuple[Any, ...]:
    if isinstance(raw, str):
        values: tuple[Any, ...] = tuple(v.strip() for v in raw.split(",") if v.strip())
    elif isinstance(raw, Iterable) and not isinstance(raw, Mapping | bytes):
        values = tuple(raw)
    else:
        raise InvalidArgument(f"grid: {key}: expected a list of values or a comma-separated "
                              f"string, not {type(raw).__name__}", field="grid")
    if not values:
        raise InvalidArgument(f"grid: {key}: no values", field="grid")
    return values


def _env_value(key: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InvalidArgument(f"grid: {key}: {value!r} is not a string or a number",
                              field="grid")
    return str(value)
