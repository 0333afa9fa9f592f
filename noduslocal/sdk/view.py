"""View: read-only attribute and item access over a JSON document from the API."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any


def wrap(value: Any) -> Any:
    if isinstance(value, Mapping):
        return View(value)
    if isinstance(value, list):
        return [wrap(item) for item in value]
    return value


class View(Mapping[str, Any]):
    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_data", dict(data))

    def __getitem__(self, key: str) -> Any:
        return wrap(self._data[key])

    def __getattr__(self, name: str) -> Any:
        try:
            return wrap(self._data[name])
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a View is read-only")

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"View({json.dumps(self._data, default=str)})"

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._data))
