"""Where a lock cost makes a prediction right (gpuvm.calibrate.validation
._cost_where_zero: the cost a bundle from before it was measured has fitted, and each
point's needed hand-off): every call there is a replay of seconds, so how many it takes
matters as much as where it lands."""

from __future__ import annotations

import pytest

from gpuvm.calibrate.validation import (HANDOFF_MAX_NS, HANDOFF_RESOLUTION_NS,
                                        _cost_where_zero)


def _counted(f):
    calls = []

    def error(x: float) -> float:
        calls.append(x)
        return f(x)
    return error, calls


@pytest.mark.parametrize("root", [700.0, 13_337.0, 99_999.0, 199_000.0])
def test_a_nearly_linear_error_is_solved_in_a_few_replays(root):
    error, calls = _counted(lambda x: (x - root) / 40_000 + 0.002 * ((x // 3_000) % 2))
    found = _cost_where_zero(error)
    assert abs(found - root) <= HANDOFF_RESOLUTION_NS + 3_000 * 0.002 * 40_000
    assert len(calls) <= 8, calls


@pytest.mark.parametrize("root", [2_500.0, 31_000.0, 150_000.0])
def test_a_far_from_linear_error_still_lands_within_the_resolution(root):
    """Steep near the root and flat elsewhere, or a step: bisection's guarantee holds
    (at most three replays per halving)."""
    for f in (lambda x: (x - root) ** 3, lambda x: -1.0 if x < root else 1.0):
        error, calls = _counted(f)
        assert abs(_cost_where_zero(error) - root) <= HANDOFF_RESOLUTION_NS
        assert len(calls) <= 2 + 3 * 20, len(calls)


def test_none_too_much_or_the_most_too_little():
    assert _cost_where_zero(lambda x: 0.5) == 0.0
    assert _cost_where_zero(lambda x: -0.5) == HANDOFF_MAX_NS


def test_the_most_is_the_callers():
    assert _cost_where_zero(lambda x: -0.5, most=50_000) == 50_000
    found = _cost_where_zero(lambda x: (x - 7_000) / 40_000, most=50_000)
    assert abs(found - 7_000) <= HANDOFF_RESOLUTION_NS
