"""What a host job's mount namespace costs per task: N jobs of `true`, one after another,
through the spawner and each shim, with no namespace, with the common one (the workspace
bound at /workspace) and with a volume at a path missing on the host (/results: the shadow
of / that makes room for it). Needs root. Wall time per task, start to recorded exit.

    python scripts/bench/host_namespace.py [TASKS] [ROUNDS]
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import table

from noduslocal.daemon.runtime import compiled_shim
from noduslocal.daemon.runtime.host.namespace import HOST_ROOT, Namespaces
from noduslocal.daemon.runtime.host.spawner import Spawner

MODES = ("no namespace", "/workspace bound", "/workspace + /results (shadow of /)")


def request(base: Path, i: int, mode: int) -> dict[str, Any]:
    directory = base / f"a{mode}-{i}"
    directory.mkdir()
    req: dict[str, Any] = {"dir": str(directory), "argv": ["/bin/true"],
                           "env": {"PATH": "/usr/bin:/bin"}, "cwd": str(base), "uid": None}
    if mode:
        req["cwd"] = str(HOST_ROOT)
        req["mounts"] = [[str(base / "ws"), str(HOST_ROOT)]]
        if mode == 2:
            req["mounts"].append([str(base / "vol"), "/results"])
    return req


async def one_round(binary: Path | None, base: Path, tasks: int, mode: int) -> float:
    spawner = Spawner(binary)
    await spawner.start()
    try:
        start = time.perf_counter()
        for i in range(tasks):
            req = request(base, i, mode)
            pid = await spawner.launch(req)
            await spawner.watch(Path(req["dir"]), pid)
        return (time.perf_counter() - start) / tasks * 1000
    finally:
        await spawner.close()


def main() -> None:
    tasks = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        if not Namespaces.prepare(base).enabled:
            sys.exit("no mount namespaces here (needs root and an empty /workspace)")
        for name in ("ws", "vol"):
            (base / name).mkdir()
        compiled = compiled_shim.find(base / "shim-data")
        rows: list[dict[str, str]] = []
        for r in range(rounds):
            for shim, binary in (("compiled", compiled), ("python", None)):
                for mode, label in enumerate(MODES):
                    round_dir = base / f"r{r}-{shim}-{mode}"
                    round_dir.mkdir()
                    for name in ("ws", "vol"):
                        (round_dir / name).mkdir()
                    ms = asyncio.run(one_round(binary, round_dir, tasks, mode))
                    rows.append({"runner": f"{shim} shim, {label}", "tasks": str(tasks),
                                 "ms/task": f"{ms:.2f}"})
        print(table(rows))


if __name__ == "__main__":
    main()
