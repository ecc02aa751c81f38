"""The fuzzer proves itself: each fault the mediator has had, put back behind the
test-only switch GPUVM_PLANT (gpuvm/mediator/planted.py), is reported by the random
campaign of `gpuvm bench fuzz` -- as a reference-monitor escape or a violation of the
world's checks -- within the stated number of operations of the stated seed.

The campaign stops at its first failure, so each test takes about a second (the bound is
the worst case: a few seconds on two busy cores).  Where the fault shows only when the
device's threads run at the right moment (a cached context walked, a freed space used),
the bound is ten times what was measured (2026-12-02: cached-context at operation 315-321
of seed 4 in three runs, free-bound-pgd at 304), over several seeds in turn; the others
are deterministic.  The same
campaigns without a plant find nothing (tests/test_fuzz.py).
"""

from __future__ import annotations

import argparse

import pytest
from hypothesis import HealthCheck, Phase, given, settings

from gpuvm.bench.fuzz import fuzz, main_fuzz
from gpuvm.mediator import planted

from test_fuzz import never_fails, sequences

# fault -> (seeds, operations within which a campaign of one of them must report it,
# what it reports).  The timing-dependent faults get several seeds, tried in turn until
# one reports it: one seed's campaign missed cached-context in 3,000 operations once in
# a full suite run, where the device's threads ran at other moments.
CAUGHT = {
    "cached-context": ((4, 0, 1, 2, 3, 5), 3000, "a walk of freed shadow memory"),
    "free-bound-pgd": ((4, 0, 1, 2, 3, 5), 3000, "a walk of freed shadow memory"),
    "unscrubbed-slice": ((0,), 1000, "its new slice holds what an earlier tenant left"),
    "shared-pcopy-next": ((5,), 1000, "reads at BAR0 0x10"),
    "runlist-drop": ((5,), 1000, "are not on the physical runlist"),
    "raw-bar0": ((0,), 100, "forwarded at its raw offset"),
}


def test_every_planted_fault_has_a_test():
    assert set(CAUGHT) == set(planted.FAULTS)


@pytest.mark.parametrize("fault", sorted(CAUGHT))
def test_the_campaign_reports_a_planted_fault(fault, monkeypatch):
    seeds, bound, what = CAUGHT[fault]
    monkeypatch.setenv(planted.SWITCH, fault)
    for seed in seeds:
        r = fuzz(bound, seed=seed, stop=True)
        assert r.tracebacks == []
        if r.first_failure is not None:
            break
    assert r.first_failure is not None, \
        f"{fault}: nothing found in {bound} operations of seeds {seeds}"
    assert r.first_failure <= bound
    assert any(what in text for text in r.escapes + r.violations), \
        (r.escapes + r.violations)[:1]


def test_an_unknown_plant_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setenv(planted.SWITCH, "no-such-fault")
    args = argparse.Namespace(operations=1, seed=0, world_ops=1)
    assert main_fuzz(args) == 2
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and out[0].startswith("gpuvm: error: GPUVM_PLANT=")


def test_the_hypothesis_test_is_falsified_by_a_planted_fault(monkeypatch):
    """tests/test_fuzz.py's property, its 20 sequences drawn as in the suite, is falsified
    with raw-bar0 planted.  (Shrinking is left out: a world per try made it take minutes.
    The faults that need several operations in order, and unscrubbed-slice, which needs
    a removal, were not reached by 150 of its short sequences when tried: the campaign
    above is what catches those.)"""
    monkeypatch.setenv(planted.SWITCH, "raw-bar0")
    falsifiable = settings(max_examples=20, deadline=None, database=None,
                           phases=[Phase.generate],
                           suppress_health_check=[HealthCheck.too_slow])(
        given(sequences)(never_fails))
    with pytest.raises(AssertionError):
        falsifiable()
