"""Listings come a page at a time (at most 1,000 jobs or cells, a cursor to go on) and each
user's heavy reads have a lane of their own: a script that fans out listings is held to a
few in flight and then told, and never delays another user's lane."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from noduslocal import testing
from noduslocal.daemon.api.lanes import Lanes
from noduslocal.domain import errors

CELLS = 2500


@pytest.fixture(scope="module")
def swept() -> Iterator[testing.Daemon]:
    with testing.daemon(cpus=1, memory="4GiB") as d:
        d.client().create_sweep({"name": "wide", "canary": "none", "max_parallel": 1,
                                 "template": {"command": ["sleep", "3600"], "cpu": 0.1},
                                 "grid": {"I": [str(i) for i in range(CELLS)]}})
        yield d


def test_a_listing_is_paged_by_a_cursor_and_the_client_follows_it(
        swept: testing.Daemon) -> None:
    transport = swept.client().transport
    seen: list[int] = []
    before = None
    pages = 0
    while True:
        page = transport.request("GET", "/v1/jobs", query={"all": "1", "limit": 100_000,
                                                           "before": before})
        assert len(page["jobs"]) <= 1000
        ids = [int(j["name"].rsplit("-", 1)[1]) for j in page["jobs"]]  # cells by age
        assert ids == sorted(ids)  # each page oldest first
        assert not seen or max(ids) < min(seen)  # and older than the page before
        seen += ids
        pages += 1
        if not (before := page["next"]):
            break
    assert pages == 3 and len(set(seen)) == CELLS
    everything = swept.client().list_jobs(all=True, limit=100_000)
    assert [j["name"] for j in everything] == [f"wide-{i}" for i in range(CELLS)]
    newest = swept.client().list_jobs(all=True, limit=1500)
    assert [j["name"] for j in newest] == [f"wide-{i}" for i in range(CELLS - 1500, CELLS)]
    assert len(swept.client().list_jobs()) == 1000  # the default: one page, the newest


def test_a_sweeps_cells_are_paged_and_its_jobs_found_by_its_id(
        swept: testing.Daemon) -> None:
    client = swept.client()
    page = client.transport.request("GET", "/v1/sweeps/wide/cells",
                                    query={"limit": 100_000})
    assert len(page["cells"]) == 1000 and page["next"] == 1000
    cells = client.sweep_cells("wide")
    assert [c["index"] for c in cells] == list(range(CELLS))
    assert len(client.list_jobs(sweep="wide", limit=100_000)) == CELLS
    with pytest.raises(errors.NotFound, match="sweep 'nosuch' not found"):
        client.list_jobs(sweep="nosuch")


def test_bad_page_parameters_are_refused_naming_the_field(swept: testing.Daemon) -> None:
    transport = swept.client().transport
    for query, field in (({"limit": "many"}, "limit"), ({"limit": 0}, "limit"),
                         ({"before": "x"}, "before")):
        with pytest.raises(errors.InvalidArgument, match=f"^{field}: "):
            transport.request("GET", "/v1/jobs", query=query)


def test_a_users_lane_holds_its_own_reads_and_refuses_past_its_depth() -> None:
    async def scenario() -> None:
        lanes = Lanes(width=2, depth=1)
        release = asyncio.Event()
        inside: list[str] = []

        async def read(uid: int, tag: str) -> None:
            async with lanes.read(uid, f"user{uid}", "job list"):
                inside.append(tag)
                await release.wait()

        held = [asyncio.create_task(read(1, f"a{i}")) for i in range(3)]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert sorted(inside) == ["a0", "a1"]  # two in flight, the third waits its turn
        with pytest.raises(errors.ResourceExhausted, match="user1 already has 3 listings"):
            async with lanes.read(1, "user1", "job list"):
                pass
        other = asyncio.create_task(read(2, "b"))
        await asyncio.sleep(0)
        assert "b" in inside  # another user's lane is free whatever user 1 does
        release.set()
        await asyncio.gather(*held, other)
        assert sorted(inside) == ["a0", "a1", "a2", "b"]
        assert not lanes._lanes  # nothing kept once every read left

    asyncio.run(scenario())


def test_the_queue_answers_its_first_places_and_how_many_wait(
        swept: testing.Daemon) -> None:
    client = swept.client()
    for i in range(3):  # a whole CPU each, beside the cell that runs: they wait
        client.create_job({"name": f"big-{i}", "command": ["true"], "cpu": 1})
    testing.wait_until(lambda: client.queue()["total"] == 3, "three jobs waiting")
    page = client.transport.request("GET", "/v1/queue", query={"limit": 2})
    assert [e["name"] for e in page["pending"]] == ["big-0", "big-1"]
    assert page["total"] == 3
    for i in range(3):
        client.cancel_job(f"big-{i}")
