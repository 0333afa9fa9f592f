"""The regions beyond this box: each `[regions.NAME]` table of the config names a Slurm
cluster (or one partition of it) that jobs and sweep cells reach with `region=NAME`, and how
they are submitted there (partition, account, qos, GPU types, the shared directory).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from noduslocal.domain.errors import InvalidArgument, Unsupported

RUNTIMES = ("slurm",)
# Slurm's own names (partition, account, qos, gres type): no spaces, commas or quotes, so a
# value never becomes a second option on sbatch's command line.
SLURM_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
REGION_NAME = re.compile(r"[a-z0-9][a-z0-9\-]{0,31}")
KEYS = ("runtime", "partition", "account", "qos", "gpu_types", "shared_dir",
        "max_submitted_per_user", "poll", "python")


@dataclass(frozen=True)
class SlurmRegion:
    """A Slurm cluster as a region: where its jobs go (partition, account, qos: None is
    Slurm's default), the gres type of each GPU model a job may ask for, the directory the
    compute nodes share with this host (None: the data dir, which must then be shared), the
    most jobs one user may have submitted there at once, and how often squeue is read."""

    name: str
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpu_types: dict[str, str] = field(default_factory=dict)  # model (upper case) -> type
    shared_dir: Path | None = None
    max_submitted_per_user: int = 1000
    poll: float = 1.0  # seconds between squeue reads
    python: str = "/usr/bin/python3"  # the nodes' interpreter that runs the shim

    def gres_type(self, model: str | None) -> str | None:
        """The gres type a GPU model maps to; None: any type (or no model asked for)."""
        if model is None:
            return None
        return self.gpu_types.get(model.upper(), model.lower())


def parse_regions(value: Any, local: str, data_dir: Path) -> dict[str, SlurmRegion]:
    """The `[regions.NAME]` tables, each checked whole; `local` is this box's region."""
    if not isinstance(value, dict):
        raise InvalidArgument("regions: expected [regions.NAME] tables", field="regions")
    return {name: _region(name, table, local, data_dir) for name, table in value.items()}


def _region(name: str, table: Any, local: str, data_dir: Path) -> SlurmRegion:
    where = f"regions.{name}"
    if not REGION_NAME.fullmatch(name):
        raise InvalidArgument(f"{where}: a region's name is 1-32 lower-case letters, digits "
                              f"and '-'", field=where)
    if name == local:
        raise InvalidArgument(f"{where}: {name!r} is this box's own region", field=where)
    if not isinstance(table, dict):
        raise InvalidArgument(f"{where}: expected a table with runtime = \"slurm\"",
                              field=where)
    if unknown := sorted(set(table) - set(KEYS)):
        raise InvalidArgument(f"{where}.{unknown[0]}: unknown key; allowed: "
                              f"{', '.join(KEYS)}", field=f"{where}.{unknown[0]}")
    if table.get("runtime") not in RUNTIMES:
        raise InvalidArgument(f"{where}.runtime: expected one of {', '.join(RUNTIMES)}",
                              field=f"{where}.runtime")
    names = {key: _slurm_name(table.get(key), f"{where}.{key}")
             for key in ("partition", "account", "qos")}
    types = table.get("gpu_types", {})
    if not isinstance(types, dict):
        raise InvalidArgument(f'{where}.gpu_types: expected a table of model = "gres type",'
                              f' e.g. {{"H100" = "h100"}}', field=f"{where}.gpu_types")
    gpu_types = {}
    for model, gres in types.items():
        checked = _slurm_name(gres, f"{where}.gpu_types.{model}")
        assert checked is not None
        gpu_types[str(model).upper()] = checked
    shared = table.get("shared_dir")
    if shared is not None and (not isinstance(shared, str) or not shared.startswith("/")):
        raise InvalidArgument(f"{where}.shared_dir: expected an absolute path",
                              field=f"{where}.shared_dir")
    if shared is not None and Path(shared) != data_dir:
        # The job directories live in the data dir: the nodes must see that one.
        raise Unsupported(f"{where}.shared_dir", message=f"{where}.shared_dir: only the data "
                          f"dir ({data_dir}) can be shared with the nodes yet; put data_dir "
                          f"on the shared file system instead")
    cap = table.get("max_submitted_per_user", 1000)
    if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
        raise InvalidArgument(f"{where}.max_submitted_per_user: expected a whole number "
                              f"from 1", field=f"{where}.max_submitted_per_user")
    poll = table.get("poll", 1.0)
    if isinstance(poll, bool) or not isinstance(poll, int | float) or not 0.1 <= poll <= 60:
        raise InvalidArgument(f"{where}.poll: expected seconds from 0.1 to 60",
                              field=f"{where}.poll")
    python = table.get("python", "/usr/bin/python3")
    if not isinstance(python, str) or not python.startswith("/") or any(
            c.isspace() or c in "'\"\\$`;&|<>" for c in python):
        raise InvalidArgument(f"{where}.python: expected the absolute path of the nodes' "
                              f"python3 (3.9 or newer)", field=f"{where}.python")
    return SlurmRegion(name, names["partition"], names["account"], names["qos"], gpu_types,
                       None if shared is None else Path(shared), cap, float(poll), python)


def _slurm_name(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not SLURM_NAME.fullmatch(value):
        raise InvalidArgument(f"{where}: expected a Slurm name (letters, digits, '_', '.', "
                              f"'-')", field=where)
    return value
