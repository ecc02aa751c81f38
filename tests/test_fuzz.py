"""Hostile guest operation sequences against two vGPUs, the reference monitor on: no
escape and no host-side exception.  Hypothesis shrinks a failing sequence to the few
operations that matter (each printed as Op(kind, vm, a, b, c)); `gpuvm bench fuzz` runs
the same operations by the million."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuvm.bench.fuzz import KINDS, FuzzResult, Op, World, fuzz, run_ops

ops = st.builds(Op, st.sampled_from(KINDS), st.integers(0, 1), st.integers(0, 2**32 - 1),
                st.integers(0, 2**48 - 1), st.integers(0, 2**32 - 1))
sequences = st.lists(ops, min_size=1, max_size=60)


def never_fails(sequence: list[Op]) -> None:
    """The property: a sequence run in a fresh world, nothing found."""
    world = World()
    result = FuzzResult()
    try:
        run_ops(world, sequence, result)
    finally:
        world.close()
    assert result.tracebacks == []
    assert result.escapes == []
    assert result.violations == []


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sequences)
def test_operation_sequences_never_escape(sequence):
    never_fails(sequence)


def test_a_random_campaign():
    r = fuzz(3000, seed=7, world_ops=1000)
    assert r.operations == 3000
    assert r.escapes == [] and r.violations == [] and r.tracebacks == []
    assert len(r.per_kind) >= len(KINDS) - 1  # every kind ran (removal is rare)
