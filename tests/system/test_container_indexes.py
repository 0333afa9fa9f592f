"""Indexed jobs of containers through a real daemon and real docker: each index runs, and
its log and output are found by index. Host indexed jobs are in
tests/daemon/test_indexed_jobs.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from noduslocal import testing
from tests.conftest import BUSYBOX, PYTHON_IMAGE
from tests.daemon.test_indexed_jobs import journal, log_of


@pytest.mark.parametrize("image", [BUSYBOX, PYTHON_IMAGE])
def test_container_indexes_run_and_show_logs_and_outputs_by_index(
        docker_client: Any, image: str, tmp_path: Path) -> None:
    with testing.daemon(config=None) as d:
        c = d.client()
        c.create_job({"name": "ci", "image": image, "cpu": "100m", "completions": 4,
                      "parallelism": 2, "outputs": {"o": "out-{index}.txt"},
                      "command": ["sh", "-c", "echo i=$NODUS_INDEX of $NODUS_COMPLETIONS; "
                                  "echo c$NODUS_INDEX > /workspace/out-$NODUS_INDEX.txt"]})
        done = c.wait_job("ci", timeout=120)
        assert (done["phase"], done["exit_code"]) == ("Succeeded", 0), (done,
                                                                      d.log()[-3000:])
        assert done["indexes"]["succeeded"] == 4, done["indexes"]
        for index in range(4):
            assert log_of(c, "ci", index) == f"i={index} of 4\n"
            got = c.download_output("ci", None, "o", tmp_path / f"{index}.txt", index=index)
            assert got.read_text() == f"c{index}\n"
        assert journal(d)["ends"] == dict.fromkeys(range(4), 0)
