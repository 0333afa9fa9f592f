"""The daemon's settings as they are now: one holder that every part reads at the moment it
needs a value, swapped whole when a reloaded config changes a live setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

from noduslocal.daemon.config.settings import LIVE, Settings


class LiveSettings:
    """Holds the current Settings. A part that reads settings is given this holder and reads
    `.current` each time, never a copy, so a reload reaches it with no code of its own.
    A part that keeps state derived from a live setting (the queue's per-user limits, the
    GPU pool's busy memory, the disk watch's reserve, the host spawner's log cap) subscribes
    a callback that recomputes it; callbacks run in the order they subscribed.

    Only the settings in config.LIVE ever change here (replace() refuses the others): what
    a part takes from the settings once, when it is built, is a start-time value by that
    rule: the socket and data_dir, cpus and memory (the capacity), commit_batch, max_body
    and idle_timeout (the HTTP server), docker_host, image_pull and local_registries (the
    docker engine), simulate_gpus and nvml_library, host_shim, overlay_workspaces (the
    job layout), disk_poll, the outputs' limits, region, fair_share_half_life (the ledger)
    and metrics_port."""

    def __init__(self, settings: Settings) -> None:
        self._current = settings
        self._subscribers: list[Callable[[Settings], None]] = []

    @property
    def current(self) -> Settings:
        return self._current

    def subscribe(self, on_change: Callable[[Settings], None]) -> None:
        """Call `on_change(new)` after each replace()."""
        self._subscribers.append(on_change)

    def replace(self, new: Settings) -> None:
        """A reloaded config's settings, in force from now on for every part."""
        fixed = [f.name for f in fields(Settings) if f.name not in LIVE
                 and getattr(new, f.name) != getattr(self._current, f.name)]
        if fixed:
            # The parts that took these at start would not follow: a restart applies them.
            raise ValueError(f"not live settings, applied at the next start: {fixed}")
        self._current = new
        for on_change in self._subscribers:
            on_change(new)
