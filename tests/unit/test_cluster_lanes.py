"""The lanes where jobs bound for a cluster region wait, without a daemon: one lane per
(region, user), each capped at the region's max_submitted_per_user (read at each pass, so a
reloaded config applies at the next), served in turn so that one user's hundred jobs never
hold up another's, and a lane's place freed when a submitted job's attempt ends."""

from __future__ import annotations

from pathlib import Path

import pytest

from noduslocal.daemon.config.live import LiveSettings
from noduslocal.daemon.config.settings import load_settings
from noduslocal.daemon.coordinator import submit_cap
from noduslocal.daemon.scheduler.cluster_lanes import ClusterLanes

ALICE, BOB, CAROL = 1001, 1002, 1003


def capped(**caps: int | None) -> ClusterLanes:
    """Lanes with a cap per region; a region not named is not configured."""
    return ClusterLanes(lambda region: caps.get(region))


def test_a_lane_takes_up_to_its_cap_and_no_more() -> None:
    lanes = capped(cluster=2)
    for job in range(1, 6):
        lanes.push(job, "cluster", ALICE)
    assert lanes.take() == [1, 2]
    assert lanes.take() == []
    assert [lanes.waits(job) for job in range(1, 6)] == [False, False, True, True, True]
    assert "2 of your jobs are submitted to region 'cluster'" in lanes.wait_reason(3)
    assert "max_submitted_per_user = 2" in lanes.wait_reason(3)


def test_a_released_job_frees_its_place() -> None:
    lanes = capped(cluster=2)
    for job in range(1, 6):
        lanes.push(job, "cluster", ALICE)
    assert lanes.take() == [1, 2]
    lanes.give(1)
    assert lanes.take() == [3]
    assert lanes.take() == []
    lanes.give(2)
    lanes.give(3)
    assert lanes.take() == [4, 5]
    assert lanes.take() == []


def test_a_place_is_freed_once_however_often_it_is_given() -> None:
    lanes = capped(cluster=1)
    for job in (1, 2, 3):
        lanes.push(job, "cluster", ALICE)
    assert lanes.take() == [1]
    lanes.give(1)
    lanes.give(1)
    lanes.give(99)  # never submitted here
    assert lanes.take() == [2]
    assert lanes.take() == []


def test_the_cap_is_per_user() -> None:
    lanes = capped(cluster=1)
    for job, owner in ((1, ALICE), (2, ALICE), (3, BOB), (4, BOB), (5, CAROL)):
        lanes.push(job, "cluster", owner)
    assert sorted(lanes.take()) == [1, 3, 5]
    lanes.give(3)  # Bob's place, not Alice's
    assert lanes.take() == [4]
    assert lanes.waits(2)


def test_the_cap_is_per_region() -> None:
    lanes = capped(cluster=1, gpu=3)
    for job in (1, 2):
        lanes.push(job, "cluster", ALICE)
    for job in (11, 12, 13, 14):
        lanes.push(job, "gpu", ALICE)
    assert sorted(lanes.take()) == [1, 11, 12, 13]
    lanes.give(11)
    assert lanes.take() == [14]  # the cluster's lane is still full
    lanes.give(1)
    assert lanes.take() == [2]


def test_users_of_a_region_are_served_in_turn() -> None:
    lanes = capped(cluster=1000)
    for job in (1, 2, 3):
        lanes.push(job, "cluster", ALICE)
    for job in (11, 12, 13):
        lanes.push(job, "cluster", BOB)
    assert lanes.take() == [1, 11, 2, 12, 3, 13]


def test_a_hundred_queued_jobs_do_not_hold_up_another_user() -> None:
    lanes = capped(cluster=1000)
    for job in range(1, 101):
        lanes.push(job, "cluster", ALICE)
    lanes.push(500, "cluster", BOB)
    taken = lanes.take()
    assert len(taken) == 101
    assert taken.index(500) <= 1  # Bob's one job goes out with Alice's first, not last


def test_a_user_at_the_cap_does_not_hold_up_another_user() -> None:
    lanes = capped(cluster=3)
    for job in range(1, 101):
        lanes.push(job, "cluster", ALICE)
    assert lanes.take() == [1, 2, 3]
    lanes.push(500, "cluster", BOB)
    assert lanes.take() == [500]
    lanes.give(1)
    lanes.push(501, "cluster", BOB)
    assert sorted(lanes.take()) == [4, 501]


def test_within_a_lane_higher_priority_goes_first_then_the_older_job() -> None:
    lanes = capped(cluster=1000)
    lanes.push(1, "cluster", ALICE, priority=0)
    lanes.push(2, "cluster", ALICE, priority=10)
    lanes.push(3, "cluster", ALICE, priority=-5)
    lanes.push(4, "cluster", ALICE, priority=10)
    assert lanes.take() == [2, 4, 1, 3]


def test_priority_does_not_cross_lanes() -> None:
    """A user's high priority orders that user's own jobs, never another user's turn."""
    lanes = capped(cluster=1)
    lanes.push(1, "cluster", ALICE, priority=0)
    lanes.push(2, "cluster", BOB, priority=1000)
    assert sorted(lanes.take()) == [1, 2]


def test_a_waiting_job_is_removed() -> None:
    lanes = capped(cluster=1)
    for job in (1, 2, 3):
        lanes.push(job, "cluster", ALICE)
    assert lanes.remove(2)
    assert not lanes.waits(2) and lanes.wait_reason(2) is None
    assert not lanes.remove(2)
    assert lanes.take() == [1]
    lanes.give(1)
    assert lanes.take() == [3]


def test_only_waiting_jobs_are_removed() -> None:
    lanes = capped(cluster=5)
    lanes.push(1, "cluster", ALICE)
    assert lanes.take() == [1]
    assert not lanes.remove(1)  # submitted: its end frees the place, not a remove
    assert not lanes.remove(42)
    assert lanes.wait_reason(1) is None


def test_removing_a_lanes_last_job_leaves_the_others_in_turn() -> None:
    lanes = capped(cluster=1000)
    lanes.push(1, "cluster", ALICE)
    lanes.push(11, "cluster", BOB)
    lanes.push(12, "cluster", BOB)
    assert lanes.remove(1)
    assert lanes.take() == [11, 12]
    lanes.push(2, "cluster", ALICE)  # a new lane for Alice, served as before
    assert lanes.take() == [2]


def test_a_job_submitted_before_a_restart_holds_its_place() -> None:
    lanes = capped(cluster=2)
    lanes.hold(7, "cluster", ALICE)
    lanes.hold(8, "cluster", ALICE)
    lanes.push(9, "cluster", ALICE)
    assert lanes.take() == []
    assert "2 of your jobs" in lanes.wait_reason(9)
    lanes.give(8)
    assert lanes.take() == [9]


def test_a_cap_of_zero_holds_every_job() -> None:
    lanes = capped(cluster=0)
    lanes.push(1, "cluster", ALICE)
    assert lanes.take() == []
    assert "max_submitted_per_user = 0" in lanes.wait_reason(1)


def test_a_region_no_longer_configured_holds_its_jobs_until_it_is_again() -> None:
    caps: dict[str, int] = {}
    lanes = ClusterLanes(caps.get)
    lanes.push(1, "cluster", ALICE)
    lanes.push(2, "gone", ALICE)
    caps["cluster"] = 5
    assert lanes.take() == [1]
    assert lanes.waits(2)
    assert "region 'gone' is not configured any more" in lanes.wait_reason(2)
    caps["gone"] = 1
    assert lanes.wait_reason(2) == "being submitted to region 'gone'"
    assert lanes.take() == [2]


def test_a_cap_changed_in_the_config_applies_at_the_next_pass(tmp_path: Path) -> None:
    def settings(cap: int | None) -> object:
        path = tmp_path / "config.toml"
        path.write_text("" if cap is None else
                        f'[regions.cluster]\nruntime = "slurm"\nmax_submitted_per_user = {cap}\n')
        return load_settings(path, socket=tmp_path / "s", data_dir=tmp_path / "d")

    live = LiveSettings(settings(1))
    lanes = ClusterLanes(lambda region: submit_cap(live, region))
    for job in range(1, 11):
        lanes.push(job, "cluster", ALICE)
    assert lanes.take() == [1]
    live.replace(settings(3))
    assert lanes.take() == [2, 3]
    live.replace(settings(1))  # lowered below what is submitted: none more until under it
    lanes.give(1)
    lanes.give(2)
    assert lanes.take() == []
    lanes.give(3)
    assert lanes.take() == [4]
    live.replace(settings(None))  # the region is taken out of the config
    lanes.give(4)
    assert lanes.take() == []
    assert "not configured any more" in lanes.wait_reason(5)
    live.replace(settings(2))
    assert lanes.take() == [5, 6]


@pytest.mark.parametrize("cap", [1, 4])
def test_many_users_each_get_their_cap_in_one_pass(cap: int) -> None:
    lanes = capped(cluster=cap)
    owners = range(2000, 2010)
    for owner in owners:
        for n in range(20):
            lanes.push(owner * 100 + n, "cluster", owner)
    taken = lanes.take()
    assert len(taken) == cap * len(owners)
    assert {job // 100 for job in taken[:len(owners)]} == set(owners)  # one each, first
    assert lanes.take() == []


def test_a_job_pushed_twice_waits_once() -> None:
    """As this box's queue (scheduler/pending.py: add queues a job "unless its job is
    queued already"): a second push of a waiting job changes nothing, and the pass that
    takes it neither fails nor counts it twice."""
    lanes = capped(cluster=5)
    lanes.push(1, "cluster", ALICE)
    lanes.push(1, "cluster", ALICE)
    lanes.push(2, "cluster", ALICE)
    assert lanes.take() == [1, 2]
    lanes.give(1)
    lanes.give(2)
    for job in range(3, 8):
        lanes.push(job, "cluster", ALICE)
    assert lanes.take() == [3, 4, 5, 6, 7]  # all five places are free again


def test_an_admin_hold_keeps_that_users_cluster_jobs_back_and_says_so() -> None:
    """`admin hold USER` holds the user's whole queue: their cluster jobs too (they were
    submitted to Slurm all the same), while another user's go on."""
    holds: dict[int, str] = {ALICE: "your queue is held by admin root: quota"}
    lanes = ClusterLanes(lambda region: 10, holds.get)
    lanes.push(1, "cluster", ALICE)
    lanes.push(2, "cluster", BOB)
    assert lanes.take() == [2]
    assert lanes.wait_reason(1) == "your queue is held by admin root: quota"
    del holds[ALICE]
    assert lanes.take() == [1]


def test_a_new_priority_moves_a_waiting_job_within_its_own_lane() -> None:
    lanes = capped(cluster=1)
    for job in (1, 2, 3):
        lanes.push(job, "cluster", ALICE)
    lanes.push(4, "cluster", BOB)
    lanes.reprioritize(3, 50)
    lanes.reprioritize(99, 50)  # not waiting here: nothing happens
    assert lanes.take() == [3, 4]  # ALICE's 3 first now; BOB's turn is his all the same
