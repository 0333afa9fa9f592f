"""`noduslocal map`'s argument grammar against GNU parallel itself: the forms both accept
give the same commands in the same order as Debian's `parallel --dry-run` (our own forms and
the refusals are tested without it, in tests/unit/test_map_arguments.py)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest

from noduslocal.domain.map_args import parse

PARALLEL = shutil.which("parallel")


# (arguments after `--`, stdin or None): forms both accept.
SHARED_FORMS: list[tuple[list[str], str | None]] = [
    (["echo", "{}", ":::", "a", "b", "c"], None),
    (["echo", ":::", "a", "b", "c"], None),  # appended without a placeholder
    (["echo", "{1}", "{2}", ":::", "a", "b", ":::", "1", "2", "3"], None),
    (["echo", "{2}", "{1}", ":::", "a", "b", ":::", "1", "2"], None),  # any order
    (["echo", ":::", "a", "b", ":::", "1", "2", ":::", "x", "y"], None),  # three, appended
    (["echo", "{}", ":::", "a", "b", ":::", "1", "2"], None),  # {} alone: every value
    (["python3", "train.py", "--shard={1}", "--of", "{2}", ":::", "0", "1", ":::", "4"], None),
    (["echo", "pre{1}post", "{1}", ":::", "a", "b"], None),  # inside a word, twice
    (["echo", "{}"], "alpha\nbeta\ngamma\n"),  # one task per stdin line
    (["echo"], "one\ntwo\n"),  # stdin, appended
    (["echo", "{}"], "has space\nit's\n\n"),  # quoting, and an empty line
    (["cp", "{}", "{}.bak", ":::", "f1", "f2"], None),
]


def parallel_dry_run(args: list[str], stdin: str | None) -> list[str]:
    assert PARALLEL is not None
    done = subprocess.run([PARALLEL, "--will-cite", "-k", "--dry-run", *args],
                          input=stdin if stdin is not None else "", capture_output=True,
                          text=True, timeout=60, check=True,
                          env={**os.environ, "PARALLEL_HOME": "/tmp/.parallel-tests"})
    return done.stdout.splitlines()


def ours(args: list[str], stdin: str | None) -> list[str]:
    lines = stdin.splitlines(keepends=True) if stdin is not None else None
    return [shlex.join(task.argv) for task in parse(args, lines).tasks()]


@pytest.mark.skipif(PARALLEL is None and not os.environ.get("CI"),
                    reason="GNU parallel is not installed (scripts/test.sh installs it)")
@pytest.mark.parametrize(("args", "stdin"), SHARED_FORMS)
def test_same_commands_as_gnu_parallel(args: list[str], stdin: str | None) -> None:
    assert PARALLEL is not None, "CI must have GNU parallel (scripts/test.sh installs it)"
    assert ours(args, stdin) == parallel_dry_run(args, stdin)
