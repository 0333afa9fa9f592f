"""The daemon tier: a real noduslocald for each test (`daemon`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from noduslocal import testing


@pytest.fixture
def daemon() -> Iterator[testing.Daemon]:
    """A started noduslocald with 2 CPUs that the SDK uses for the test."""
    with testing.daemon(cpus=2, memory="8GiB") as d:
        yield d
