"""What a job asks of the GPUs, in every form the reference and the CLI accept:
2 | "H100" | "H100:2" | "2xH100" | "gpu_2x_h100" (a sku) | {"type", "count", "min_memory"}.
Stdlib only: validated the same way by the daemon and the CLI.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.units import parse_size

MAX_GPUS = 1024  # a sanity bound; what the box has is checked against the box (capacity)
_MODEL = r"[A-Za-z][A-Za-z0-9]*"
_FORMS = [
    re.compile(rf"^(?P<model>{_MODEL})(?::(?P<count>\d+))?$"),  # H100, H100:2
    re.compile(rf"^(?P<count>\d+)\s*x\s*(?P<model>{_MODEL})$", re.I),  # 2xH100
    re.compile(rf"^gpu_(?P<count>\d+)x_(?P<model>{_MODEL})$", re.I),  # gpu_2x_h100
]


@dataclass(frozen=True)
class GpuRequest:
    count: int
    model: str | None = None  # upper case, as Inventory models are
    min_memory: int | None = None

    def describe(self) -> str:
        what = f"{self.count} x {self.model or 'GPU'}"
        if self.min_memory:
            what += f" with at least {self.min_memory / 2**30:g} GiB"
        return what

    def to_wire(self) -> dict[str, Any]:
        return {"count": self.count, "type": self.model, "min_memory": self.min_memory}

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> GpuRequest | None:
        if not data:
            return None
        return cls(int(data["count"]), data.get("type"), data.get("min_memory"))


def parse_gpu(value: Any, field: str = "gpu") -> GpuRequest | None:
    """None for no GPUs (None or 0)."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value == 0):
        return None
    if isinstance(value, bool):
        raise _bad(value, field)
    if isinstance(value, int):
        return _checked(GpuRequest(value), field)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return parse_gpu(int(text), field)
        for form in _FORMS:
            if match := form.match(text):
                count = int(match.group("count") or 1)
                return _checked(GpuRequest(count, match.group("model").upper()), field)
        raise _bad(value, field)
    if isinstance(value, Mapping):
        if set(value) - {"type", "count", "min_memory"}:
            raise InvalidArgument(f'{field}: a mapping takes "type", "count" and '
                                  '"min_memory"', field=field)
        count = value.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int):
            raise InvalidArgument(f"{field}: count must be an integer", field=field)
        model = value.get("type")
        if model is not None and (not isinstance(model, str)
                                  or not re.fullmatch(_MODEL, model)):
            raise InvalidArgument(f"{field}: type {model!r} is not a GPU model, e.g. H100",
                                  field=field)
        memory = value.get("min_memory")
        min_memory = None if memory is None else parse_size(memory, f"{field}.min_memory")
        if count == 0:
            return None
        return _checked(GpuRequest(count, model.upper() if model else None, min_memory),
                        field)
    raise _bad(value, field)


def _checked(req: GpuRequest, field: str) -> GpuRequest:
    if not 1 <= req.count <= MAX_GPUS:
        raise InvalidArgument(f"{field}: count must be from 1 to {MAX_GPUS}", field=field)
    return req


def _bad(value: Any, field: str) -> InvalidArgument:
    return InvalidArgument(
        f"{field}: {value!r} is not a GPU request; use a count (2), a model (\"H100\"), "
        "\"H100:2\", \"2xH100\", a sku (\"gpu_2x_h100\") or {\"type\", \"count\", "
        "\"min_memory\"}", field=field)
