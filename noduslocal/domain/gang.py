"""A gang (`distributed`) as the store keeps it and as a create body gives it: how many
ranks, GPUs per rank, the launcher, how ranks talk on one host, and how long every rank
may take to start. Stdlib only: the daemon, the client and the CLI share it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.gpu_request import MAX_GPUS, GpuRequest
from noduslocal.domain.units import parse_duration

LAUNCHERS = ("Plain", "Torchrun", "Ray", "Verl")
# How ranks talk (`transport`) on one box, and the NCCL settings each one means. Values
# that need more than one host (InfiniBand, EFA, RoCE) are refused.
TRANSPORTS: dict[str, dict[str, str]] = {
    "auto": {},
    "nvlink": {"NCCL_P2P_LEVEL": "NVL"},
    "pcie": {"NCCL_P2P_LEVEL": "SYS"},
    "shm": {"NCCL_P2P_DISABLE": "1"},
    "tcp": {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
}
NETWORKS = ("local",)  # the gang's own docker network, or the host's loopback
MAX_RANKS = 64
DEFAULT_STARTUP_TIMEOUT = 300.0
FIELDS = ("nodes", "total_gpus", "gpus_per_node", "launcher", "network", "transport",
          "startup_timeout")


@dataclass(frozen=True)
class Gang:
    nodes: int  # ranks: each one container or one host process group
    gpus_per_node: int  # GPUs each rank holds (0: a CPU gang)
    launcher: str = "Plain"
    transport: str = "auto"
    network: str = "local"
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def ranks_wait_for_head(self) -> bool:
        """Ray-like launchers: the other ranks serve rank 0 until it ends, so rank 0's end
        is the gang's."""
        return self.launcher in ("Ray", "Verl")

    def nccl_env(self) -> dict[str, str]:
        # One box: no InfiniBand between ranks, whatever the machine has.
        return {"NCCL_IB_DISABLE": "1", **TRANSPORTS[self.transport]}

    def to_wire(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "total_gpus": self.total_gpus, "launcher": self.launcher,
                "transport": self.transport, "network": self.network,
                "startup_timeout": self.startup_timeout}

    @classmethod
    def from_stored(cls, data: Mapping[str, Any] | None) -> Gang | None:
        if not data:
            return None
        return cls(int(data["nodes"]), int(data["gpus_per_node"]), data["launcher"],
                   data["transport"], data["network"], float(data["startup_timeout"]))


def _count(value: Any, name: str, least: int, most: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
        raise InvalidArgument(f"distributed.{name}: expected an integer from {least} to "
                              f"{most}", field=f"distributed.{name}")
    return value


def _choice(value: Any, name: str, allowed: tuple[str, ...], default: str,
            why: str = "") -> str:
    if value is None:
        return default
    if value not in allowed:
        raise InvalidArgument(f"distributed.{name}: {value!r} is not one of "
                              f"{', '.join(allowed)}{why}", field=f"distributed.{name}")
    return str(value)


def parse_gang(value: Any, gpu: GpuRequest | None,
               has_command: bool = True) -> tuple[Gang, GpuRequest | None] | None:
    """The gang, and the job's whole GPU request (every rank's GPUs together), from the
    body's `distributed` and `gpu`: `gpu` names the model and, with a count, the GPUs of
    one rank; `gpus_per_node` says the same (both must agree). `has_command`: a launcher
    other than Plain wraps the job's command, so an image's own will not do."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise InvalidArgument("distributed: expected an object with nodes or total_gpus",
                              field="distributed")
    if unknown := sorted(set(value) - set(FIELDS)):
        raise InvalidArgument(f"distributed.{unknown[0]}: unknown field; allowed: "
                              f"{', '.join(FIELDS)}", field=f"distributed.{unknown[0]}")
    nodes = _count(value.get("nodes"), "nodes", 1, MAX_RANKS)
    total = _count(value.get("total_gpus"), "total_gpus", 1, MAX_GPUS)
    per_node = _count(value.get("gpus_per_node"), "gpus_per_node", 0, MAX_GPUS)
    if per_node is None:
        per_node = gpu.count if gpu is not None else (1 if total else 0)
    elif gpu is not None and gpu.count not in (1, per_node):
        raise InvalidArgument(f"distributed.gpus_per_node: {per_node}, but gpu asks for "
                              f"{gpu.count} per rank; give one of them",
                              field="distributed.gpus_per_node")
    if total is not None:
        if per_node == 0 or total % per_node:
            raise InvalidArgument(f"distributed.total_gpus: {total} is not a multiple of "
                                  f"gpus_per_node ({per_node})", field="distributed.total_gpus")
        if nodes is not None and nodes * per_node != total:
            raise InvalidArgument(f"distributed.total_gpus: {total}, but {nodes} nodes of "
                                  f"{per_node} GPUs are {nodes * per_node}",
                                  field="distributed.total_gpus")
        nodes = total // per_node
    if nodes is None:
        raise InvalidArgument("distributed: give nodes or total_gpus", field="distributed.nodes")
    if nodes > MAX_RANKS or nodes * per_node > MAX_GPUS:
        raise InvalidArgument(f"distributed: at most {MAX_RANKS} ranks and {MAX_GPUS} GPUs",
                              field="distributed.nodes")
    single_host = "; on one host ranks talk over NVLink, PCIe, shared memory or TCP"
    gang = Gang(
        nodes=nodes,
        gpus_per_node=per_node,
        launcher=_choice(value.get("launcher"), "launcher", LAUNCHERS, "Plain"),
        transport=_choice(value.get("transport"), "transport", tuple(TRANSPORTS), "auto",
                          single_host),
        network=_choice(value.get("network"), "network", NETWORKS, "local",
                        " (ranks share the gang's own network on this host)"),
        startup_timeout=(DEFAULT_STARTUP_TIMEOUT if value.get("startup_timeout") is None
                         else parse_duration(value["startup_timeout"],
                                             "distributed.startup_timeout")),
    )
    if gang.launcher != "Plain" and not has_command:
        raise InvalidArgument(f"command: the {gang.launcher} launcher runs the job's command; "
                              "give one (the image's own cannot be wrapped)", field="command")
    whole = None if per_node == 0 else GpuRequest(
        nodes * per_node, gpu.model if gpu else None, gpu.min_memory if gpu else None)
    return gang, whole
