"""The coarse timer (daemon/coarse_timer.py): callbacks run once, a delay to twice it after
they were added, by one loop timer; a cancelled one never runs, a failing one keeps no
other from running."""

from __future__ import annotations

import asyncio

from noduslocal.daemon.coarse_timer import CoarseTimer


def test_callbacks_run_once_after_the_delay_and_cancelled_ones_never() -> None:
    async def body() -> tuple[list[str], list[float], int]:
        loop = asyncio.get_running_loop()
        timer = CoarseTimer(0.05)
        ran: list[str] = []
        at: list[float] = []
        start = loop.time()

        def note(name: str) -> None:
            ran.append(name)
            at.append(loop.time() - start)

        timer.add(lambda: note("first"))
        handle = timer._timer
        gone = timer.add(lambda: note("cancelled"))
        timer.add(lambda: 1 / 0)  # raises: the next one runs all the same
        timer.add(lambda: note("after a failure"))
        assert timer._timer is handle  # one loop timer for all of them
        timer.cancel(gone)
        await asyncio.sleep(0.08)
        timer.add(lambda: note("later"))
        await asyncio.sleep(0.25)
        timers_left = 0 if timer._timer is None else 1
        timer.close()
        return ran, at, timers_left

    ran, at, timers_left = asyncio.run(body())
    assert ran == ["first", "after a failure", "later"]
    assert 0.05 <= at[0] < 0.2 and at[2] >= 0.08 + 0.05
    assert timers_left == 0  # nothing due: no timer kept armed
