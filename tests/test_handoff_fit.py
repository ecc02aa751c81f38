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
