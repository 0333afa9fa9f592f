"""The SDK's sweep grid: order, repetitions, comma strings, and refusals naming the key."""

from __future__ import annotations

import pytest

from noduslocal.domain.errors import InvalidArgument
from noduslocal.domain.states import (
    SWEEP_TERMINAL,
    SWEEP_TRANSITIONS,
    IllegalTransition,
    SweepPhase,
    check_sweep_transition,
)
from noduslocal.domain.sweep_grid import Grid, parse_grid


def test_cartesian_product_in_key_order_last_key_fastest() -> None:
    grid = parse_grid({"gpu": ["H100", "L4"], "BATCH_SIZE": [8, 16]})
    assert [grid.params(i) for i in range(len(grid))] == [
        {"gpu": "H100", "BATCH_SIZE": "8"}, {"gpu": "H100", "BATCH_SIZE": "16"},
        {"gpu": "L4", "BATCH_SIZE": "8"}, {"gpu": "L4", "BATCH_SIZE": "16"}]


def test_repetitions_of_a_cell_are_adjacent_and_strings_are_lists() -> None:
    grid = parse_grid({"LR": "1e-4, 3e-4"}, repetitions=3)
    assert len(grid) == 6
    assert [grid.params(i)["LR"] for i in range(6)] == ["1e-4"] * 3 + ["3e-4"] * 3


def test_no_grid_is_one_cell_per_repetition() -> None:
    grid = parse_grid(None, 2)
    assert len(grid) == 2 and grid.params(1) == {}


def test_wire_round_trip() -> None:
    grid = parse_grid({"gpu": [1, "H100:2"], "X": ["a"]}, 2)
    assert Grid.from_wire(grid.to_wire()) == grid


@pytest.mark.parametrize(("grid", "repetitions", "message"), [
    ({"lr rate": [1]}, None, "'lr rate' is neither gpu, region nor"),
    ({"LR": []}, None, "LR: no values"),
    ({"LR": 3}, None, "LR: expected a list of values"),
    ({"LR": [{"a": 1}]}, None, "is not a string or a number"),
    ({"LR": [True]}, None, "is not a string or a number"),
    ([1, 2], None, "grid: expected a mapping"),
    (None, 0, "repetitions: expected an integer from 1"),
    ({"A": list(range(1000)), "B": list(range(1000))}, None, "at most 100000"),
])
def test_refusals_name_the_field(grid: object, repetitions: object, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        parse_grid(grid, repetitions)


def test_sweep_phases() -> None:
    assert {SweepPhase.SUCCEEDED, SweepPhase.FAILED, SweepPhase.CANCELLED} == SWEEP_TERMINAL
    check_sweep_transition("Canary", "Running")
    check_sweep_transition("Failed", "Canary")  # sweep retry
    for end in (SweepPhase.SUCCEEDED, SweepPhase.CANCELLED):
        assert not SWEEP_TRANSITIONS[end]
        with pytest.raises(IllegalTransition):
            check_sweep_transition(end, "Running")


def test_errors_are_made_alike_for_clustering() -> None:
    from noduslocal.daemon.sweeps.reports import normalise

    assert normalise("FileNotFoundError: [Errno 2] No such file: /data/shard-0042.jsonl") \
        == "FileNotFoundError: [Errno N] No such file: PATH"
    assert normalise("CUDA out of memory. Tried to allocate 2.50 GiB (GPU 3; 79.1 GiB)") \
        == "CUDA out of memory. Tried to allocate N GiB (GPU N; N GiB)"
    assert normalise("  KeyError: 0xdeadbeef at step 1e-3  ") == "KeyError: HEX at step N"
    # A search path is one thing: it read `(PATH:PATH:PATH:...)` (issue 28).
    assert normalise("cannot execute 'python': not found in PATH (/home/u/.venv/bin:/usr/bin:"
                     "/bin); give the job yours") \
        == "cannot execute 'python': not found in PATH (SEARCHPATH); give the job yours"
    assert normalise("/src/train.py:12: error: x") == "PATH:N: error: x"
    assert normalise("at 12:30:01, a:b") == "at N:N:N, a:b"


def test_what_a_max_cost_affords() -> None:
    from noduslocal.daemon.sweeps.state import affordable

    # Nothing ended yet (typical 0): as many as there is room for, while under the limit.
    assert affordable(0.0, [], 0.0, 1.6, room=2, held=10) == 2
    # Spent 1.02 with a typical cell at 0.51: one more fits (1.53), a second would not.
    assert affordable(1.02, [], 0.51, 1.6, room=4, held=10) == 1
    # A running cell counts at least as a typical one, even if it cost less so far.
    assert affordable(0.51, [0.1], 0.51, 1.6, room=4, held=10) == 1
    assert affordable(1.6, [], 0.0, 1.6, room=4, held=10) == 0
    assert affordable(0.0, [], 0.2, 10.0, room=4, held=3) == 3
