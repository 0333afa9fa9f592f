"""The `noduslocal` command's entry: `job run`, `job list`, `map` and `sweep wait` take the
fast path (cli/fast.py), everything else, and anything the fast path leaves, goes to click
(cli/root.py)."""

from __future__ import annotations

import os
import sys


def main() -> None:
    from noduslocal.cli import fast

    try:
        code = fast.run(sys.argv[1:])
    except BrokenPipeError:  # `| head` stopped reading: quietly, as SIGPIPE would end it
        os._exit(141)
    if code is None:
        from noduslocal.cli.root import main as full

        full()
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # `| head` stopped reading: what it read is all that matters
        pass
    # Out without the interpreter's teardown, a tenth of a submit's time: the fast path
    # leaves nothing that needs more closing than the kernel gives it.
    os._exit(code)


if __name__ == "__main__":
    main()
