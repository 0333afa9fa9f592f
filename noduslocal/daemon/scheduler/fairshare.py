"""Fair share: each user's GPU-hours, decayed with a half-life, so who used the GPUs less
lately goes first. Ended attempts are charged once; running ones by the time so far.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class Ledger:
    half_life: float  # seconds
    _charged: dict[int, tuple[float, float]] = field(default_factory=dict)  # uid -> (v, at)

    def _decay(self, value: float, since: float, now: float) -> float:
        if self.half_life <= 0:
            return value
        return value * math.pow(0.5, max(0.0, now - since) / self.half_life)

    def charge(self, uid: int, gpu_hours: float, at: float) -> None:
        value, since = self._charged.get(uid, (0.0, at))
        if at < since:  # an older charge: decayed to the ledger's time, which stays
            self._charged[uid] = (value + self._decay(gpu_hours, at, since), since)
        else:
            self._charged[uid] = (self._decay(value, since, at) + gpu_hours, at)

    def value(self, uid: int, now: float) -> float:
        value, since = self._charged.get(uid, (0.0, now))
        return self._decay(value, since, now)
