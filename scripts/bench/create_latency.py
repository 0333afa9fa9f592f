"""API create latency over the socket: N sequential creates from one client while the
jobs stay queued (one long job holds the only CPU), so only the create path is measured.

    python scripts/bench/create_latency.py [N]        target: p50 <= 5 ms
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, table

from noduslocal import testing


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    d = testing.Daemon(cpus=1, log_level="WARNING")
    try:
        d.start()
        client = d.client()
        client.create_job({"name": "blocker", "command": ["sleep", "600"]}, retry=False)
        for i in range(20):  # warm the connection and the daemon
            client.create_job({"name": f"warm-{i}", "command": ["true"]})
        with_key, without_key = [], []
        for i in range(n):
            body = {"name": f"bench-{i}", "command": ["true"], "labels": {"bench": "create"}}
            start = time.perf_counter()
            client.create_job(body, retry=(i % 2 == 0))
            (with_key if i % 2 == 0 else without_key).append(time.perf_counter() - start)
        rows = [
            {"what": "create, idempotency key (SDK default)", **summary_ms(with_key)},
            {"what": "create, no key", **summary_ms(without_key)},
            {"what": "create, all", **summary_ms(with_key + without_key)},
        ]
        print(table(rows))
    finally:
        d.close()


if __name__ == "__main__":
    main()
