"""Issue 28: shell completion through click's protocol, as bash and zsh call the command:
commands and options, and the names of jobs and sweeps from the daemon."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import noduslocal as nodus
from noduslocal import testing

REPO = Path(__file__).resolve().parents[2]


def complete(daemon: testing.Daemon, words: str, shell: str = "bash") -> list[str]:
    """What the completion offers for the last word of WORDS (bash_complete's protocol)."""
    parts = words.split(" ")
    env = {**os.environ, "NODUSLOCAL_SOCKET": str(daemon.socket),
           "_NODUSLOCAL_COMPLETE": f"{shell}_complete", "COMP_WORDS": words,
           "COMP_CWORD": str(len(parts) - 1)}
    done = subprocess.run([sys.executable, "-m", "noduslocal.cli"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and not done.stderr, done.stderr
    if shell == "zsh":  # lines of three: type, value, help
        lines = done.stdout.splitlines()
        return lines[1::3]
    return [line.split(",", 1)[1] for line in done.stdout.splitlines() if "," in line]


def test_scripts_for_each_shell(daemon: testing.Daemon) -> None:
    for shell in ("bash", "zsh", "fish"):
        done = subprocess.run([sys.executable, "-m", "noduslocal.cli", "completion", shell],
                              capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0 and "_NODUSLOCAL_COMPLETE" in done.stdout, done.stderr


def test_commands_options_and_names_complete(daemon: testing.Daemon) -> None:
    with daemon.as_default():
        nodus.Job.run(name="complete-me", command=["true"]).wait(timeout=60)
        nodus.Job.run(name="complete-too", command=["true"]).wait(timeout=60)
        nodus.Sweep({"command": ["true"]}, grid={"x": ["1"]}, name="sweep-to-complete").run()
    assert "job" in complete(daemon, "noduslocal j")
    assert {"status", "logs"} <= set(complete(daemon, "noduslocal job "))
    assert "--follow" in complete(daemon, "noduslocal job logs --f")
    names = complete(daemon, "noduslocal job status complete-")
    assert {"complete-me", "complete-too"} <= set(names), names
    assert complete(daemon, "noduslocal sweep status sweep-to") == ["sweep-to-complete"]
    assert "complete-me" in complete(daemon, "noduslocal job logs complete-m", "zsh")


def test_no_daemon_completes_nothing_and_says_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "NODUSLOCAL_SOCKET": str(tmp_path / "none.sock"),
           "_NODUSLOCAL_COMPLETE": "bash_complete",
           "COMP_WORDS": "noduslocal job status x", "COMP_CWORD": "3"}
    done = subprocess.run([sys.executable, "-m", "noduslocal.cli"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip(), done.stderr) == (0, "", "")
