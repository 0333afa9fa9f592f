"""The cost of a fresh connection through the daemon's own accept loop and connection guard
(issue 10): N sequential connect + GET /v1/health + close, as a CLI call makes one, the
first 500 left out as warm-up.

    python scripts/bench/connections.py [N]
    PYTHONPATH=OLD_CHECKOUT python scripts/bench/connections.py [N]   # the code before it
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import summary_ms, table

import noduslocal
from noduslocal import testing

REQUEST = b"GET /v1/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
WARM_UP = 500


def one(path: str) -> float:
    start = time.perf_counter()
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    sock.sendall(REQUEST)
    while sock.recv(65536):
        pass
    sock.close()
    return time.perf_counter() - start


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    with testing.daemon(cpus=2, log_level="WARNING") as d:
        times = [one(str(d.socket)) for _ in range(count + WARM_UP)][WARM_UP:]
    where = Path(noduslocal.__file__).resolve().parent.parent
    print(table([{"what": f"fresh connection + GET /v1/health ({where})",
                  **summary_ms(times)}]))


if __name__ == "__main__":
    main()
