"""Where the lock's hand-off makes a prediction right (gpuvm.calibrate.validation
._handoff_where_zero): every call there is a replay of seconds, so how many it takes
matters as much as where it lands."""

from __future__ import annotations

import pytest

from gpuvm.calibrate.validation import (HANDOFF_MAX_NS, HANDOFF_RESOLUTION_NS,
                                        _handoff_where_zero)


def _counted(f):
    calls = []

    def error(x: float) -> float:
        calls.append(x)
        return f(x)
    return error, calls


@pytest.mark.parametrize("root", [700.0, 13_337.0, 99_999.0, 199_000.0])
def test_a_nearly_linear_error_is_solved_in_a_few_replays(root):
    error, calls = _counted(lambda x: (x - root) / 40_000 + 0.002 * ((x // 3_000) % 2))
    found = _handoff_where_zero(error)
    assert abs(found - root) <= HANDOFF_RESOLUTION_NS + 3_000 * 0.002 * 40_000
    assert len(calls) <= 8, calls


@pytest.mark.parametrize("root", [2_500.0, 31_000.0, 150_000.0])
def test_a_far_from_linear_error_still_lands_within_the_resolution(root):
    """Steep near the root and flat elsewhere, or a step: bisection's guarantee holds
    (at most three replays per halving)."""
    for f in (lambda x: (x - root) ** 3, lambda x: -1.0 if x < root else 1.0):
        error, calls = _counted(f)
        assert abs(_handoff_where_zero(error) - root) <= HANDOFF_RESOLUTION_NS
        assert len(calls) <= 2 + 3 * 20, len(calls)


def test_none_too_much_or_the_most_too_little():
    assert _handoff_where_zero(lambda x: 0.5) == 0.0
    assert _handoff_where_zero(lambda x: -0.5) == HANDOFF_MAX_NS


@pytest.mark.parametrize("near", [13_337.0, 13_000.0, 150.0, 120_000.0, 199_900.0])
def test_a_guess_near_the_crossing_spares_the_far_ends_and_a_wrong_one_costs_two(near):
    """`near` (the fit a turn before) is tried a resolution either side first: where
    the crossing is there, the bracket's far ends -- the slowest replays, and the ones
    whose error is least linear -- are never replayed; where it is not, the answer is as
    good and two replays more at most."""
    root = 13_337.0
    f = lambda x: (x - root) / 40_000 + 0.002 * ((x // 3_000) % 2)  # noqa: E731
    cold, cold_calls = _counted(f)
    _handoff_where_zero(cold)
    warm, calls = _counted(f)
    found = _handoff_where_zero(warm, near=near)
    assert abs(found - root) <= HANDOFF_RESOLUTION_NS + 3_000 * 0.002 * 40_000
    if abs(near - root) < HANDOFF_RESOLUTION_NS:
        assert len(calls) <= 4 and 1.0 not in calls and HANDOFF_MAX_NS not in calls, calls
    assert len(calls) <= len(cold_calls) + 2, (calls, cold_calls)


def test_a_guess_keeps_the_ends_none_too_much_or_the_most_too_little():
    assert _handoff_where_zero(lambda x: 0.5, near=10_000.0) == 0.0
    assert _handoff_where_zero(lambda x: -0.5, near=10_000.0) == HANDOFF_MAX_NS
