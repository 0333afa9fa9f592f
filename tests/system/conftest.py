"""The system tier: a daemon of each test's own (`daemon`), which the test may kill, restart
or starve; docker, root, other Unix users, the disk and the install are used for real."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from noduslocal import testing


@pytest.fixture
def daemon() -> Iterator[testing.Daemon]:
    """A started noduslocald with 2 CPUs of the test's own, that the SDK uses for the test."""
    with testing.daemon(cpus=2, memory="8GiB") as d:
        yield d
