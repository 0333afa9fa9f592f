"""Launching and adopting every rank of an attempt, for any runtime: all ranks within the
gang's startup_timeout or none (those already started are killed), and after a restart one
Rank per rank, ended ones with their end, so the lifecycle judges the gang as a whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from noduslocal.daemon.runtime.base import (
    AttemptState,
    Launch,
    NotLaunched,
    Rank,
    Vanished,
    failed,
)
from noduslocal.domain.jobs import Handle

KILL_WAIT = 30.0  # seconds a killed rank of a failed launch may take to be gone


PORT_FILE = "gang.json"  # in the attempt directory: the port its ranks were given


def master_port(directory: Path) -> int:
    """The attempt's MASTER_PORT: one nobody listens on now on the host's loopback, where
    host ranks meet (a container gang has a network of its own), kept for the attempt so
    an exec after a restart is told the same."""
    path = directory / PORT_FILE
    with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
        return int(json.loads(path.read_text())["master_port"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    with contextlib.suppress(FileNotFoundError):  # no directory: nothing ran or will
        path.write_text(json.dumps({"master_port": port}))
    return port


async def launch_ranks(launch: Launch, start: Callable[[int], Awaitable[Rank]],
                       signal_rank: Callable[[Rank, int], Awaitable[bool]],
                       discard: Callable[[list[Rank]], Awaitable[None]] | None = None,
                       ) -> list[Rank]:
    """Start rank 0, 1, ... in order; if one fails or they take longer than the gang's
    startup_timeout, the started ones are killed and gone, and `discard` freed what the
    runtime kept for them (containers, the gang's network), before this raises. A start
    is never cancelled half way (a shim or container could start unseen): a late one is
    waited for, then killed."""
    gang = launch.ref.job.spec.gang
    loop = asyncio.get_running_loop()
    deadline = None if gang is None else loop.time() + gang.startup_timeout
    ranks: list[Rank] = []
    try:
        for rank in launch.ranks:
            starting = asyncio.ensure_future(start(rank))
            left = None if deadline is None else max(0.0, deadline - loop.time())
            if not (await asyncio.wait({starting}, timeout=left))[0]:
                assert gang is not None
                await asyncio.wait({starting}, timeout=KILL_WAIT)
                if starting.done() and starting.exception() is None:
                    ranks.append(starting.result())
                else:
                    starting.cancel()
                raise NotLaunched(Vanished(
                    f"rank {rank} of {gang.nodes} did not start within its startup_timeout "
                    f"of {gang.startup_timeout:g}s"))
            ranks.append(starting.result())
    except BaseException:
        for started in ranks:
            await signal_rank(started, signal.SIGKILL)
        if ranks:
            await asyncio.wait([r.ended for r in ranks], timeout=KILL_WAIT)
        if discard is not None:
            await discard(ranks)
        raise
    return ranks


def adopted(states: list[tuple[int, AttemptState, Rank | None]], kind: str,
            recorded: list[Handle]) -> list[Rank] | AttemptState:
    """The ranks found after a restart (a Rank for each one alive): every rank as a Rank
    while any lives (ended ones already resolved, with their recorded handle so what a
    lost one left can still be cleared), else the attempt's end."""
    if not any(rank is not None for _, _, rank in states):
        return next((state for _, state, _ in states if failed(state)), states[0][1])
    ranks = []
    started = min(rank.started_at for _, _, rank in states if rank is not None)
    for number, state, rank in states:
        if rank is None:
            ended: asyncio.Future[AttemptState] = asyncio.get_running_loop().create_future()
            ended.set_result(state)
            handle = next((h for h in recorded if h.rank == number), Handle(kind, "0", number))
            rank = Rank(handle, started, ended)
        ranks.append(rank)
    return ranks

