"""The README's tour, run as written, in order, against a test daemon with simulated GPUs
and docker (the quickstart's box): every shell line (twice: a rerun must pass too) and
every Python block must succeed, so an example that stops working fails here first.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from noduslocal import testing
from noduslocal.domain.sockets import SOCKET_ENV

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^```(sh|python)\n(.*?)^```", re.S | re.M)


def tour_blocks() -> list[tuple[str, str]]:
    """The tour's code blocks: from its heading to the next section."""
    text = README.read_text()
    start = text.index("## A one-minute tour")
    tour = text[start:text.index("\n## ", start)]
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(tour)]


def test_the_tour_has_shell_and_python() -> None:
    kinds = [kind for kind, _ in tour_blocks()]
    assert kinds.count("sh") >= 1 and kinds.count("python") >= 2, kinds


def test_the_readme_tour_runs_as_written(docker_client: Any, tmp_path: Path) -> None:
    del docker_client  # the tour runs a container from the image the quickstart builds
    blocks = tour_blocks()
    # The test starts its own daemon; the tour's first line is for a box without one.
    shell = "\n".join(line for kind, code in blocks if kind == "sh"
                      for line in code.splitlines() if not line.startswith("noduslocal daemon"))
    python = "\n".join(code for kind, code in blocks if kind == "python")
    where = tmp_path / "tour-dir"  # the directory the tour ended in, with its train.py
    shell += f'\npwd > "{where}"\n'
    with testing.daemon(cpus=2, memory="8GiB",
                        config='simulate_gpus = "4xH100-80GB,2xL4"\n') as d:
        env = {**os.environ, SOCKET_ENV: str(d.socket),
               "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}
        for _ in ("first", "again"):  # a second run of the tour must pass too
            ran = subprocess.run(["bash", "-euo", "pipefail", "-c", shell], cwd=tmp_path,
                                 env=env, capture_output=True, text=True, timeout=300)
            assert ran.returncode == 0, f"{ran.stdout[-4000:]}\n---\n{ran.stderr[-4000:]}"
        out = ran.stdout
        assert "hi" in out.splitlines() and "token: ***" in out, out
        assert "[r0] rank 0 of 2" in out and "index 7" in out, out
        # The Python blocks run where the tour left its user: beside its train.py.
        tour_dir = Path(where.read_text().strip())
        sdk = subprocess.run([sys.executable, "-c", python], cwd=tour_dir, env=env,
                             capture_output=True, text=True, timeout=300)
        assert sdk.returncode == 0, f"{sdk.stdout[-4000:]}\n---\n{sdk.stderr[-4000:]}"
        assert "3 hi" in sdk.stdout, sdk.stdout
        assert (tour_dir / "model.pt").read_text() == "weights"
        # The reference's /workspace and volume_mounts paths, as host jobs (issue 25): the
        # files are the job's and the volume's, none of them the host's.
        assert (tour_dir / "weights.pt").read_text() == "weights\n"
        assert "results: 0" in sdk.stdout, sdk.stdout
        files = [f["name"] for f in d.client().volume_files("results")]
        assert "model.pt" in files and "when.txt" in files, files
        assert not Path("/results").exists() and not Path("/workspace/model.pt").exists()
