"""The model predicts this emulator: from one VM's per-event trace, with the host cores
fitted on 2 VMs, it predicts the makespan of 4 VMs it never saw within a loose bound.

Each VM count runs right after the trace it is predicted from (gpuvm.calibrate.validation),
so the host's load changes less between them.  The bound is still loose (60%) because
the host is shared: on 2 cores at a load of 10-15 the 4-VM makespan moved by 40% between
two repetitions a minute apart, and runs here gave +9% to +65% for 4 VMs.  That is also
why it is a `timing` test, left out of the default suite.  It still fails if the model
loses its contention (4 VMs predicted like 1 VM: about -75%) or the fit breaks (costs of
0, or of 10x)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpuvm.calibrate import emulator, stats, validation

LOOSE_BOUND_PCT = 60.0


@pytest.mark.timing
def test_model_predicts_four_vms_from_one_and_two():
    measured = validation.measure("mmul", (64,), ["fv-opt"], (1, 2, 4), reps=2)
    kept = validation.fastest(measured)
    costs = emulator.fit_trace_costs([(m.mode, m.trace) for m in measured if m.vms == 1])
    assert costs["trap_ns"] > 1000  # a trap costs microseconds here, never nothing
    profile = validation.fit_cores(
        kept, replace(emulator.trace_profile(costs), recorded_times=1.0))
    (point,) = [p for p in validation.predict(kept, profile) if p.vms == 4]
    assert abs(point.error_pct) <= LOOSE_BOUND_PCT, point


def test_short_modes_get_more_repetitions():
    """Every mode gets the repetitions asked for; one whose repetitions were short gets
    more, up to MAX_REPS_FACTOR times as many."""
    short, cap = validation.SHORT_MODE_S, 2 * validation.MAX_REPS_FACTOR

    def taken(seconds_each: float) -> int:
        rep, spent = 0, 0.0
        while validation.repeats(rep, 2, spent, short):
            rep, spent = rep + 1, spent + seconds_each
        return rep
    assert taken(40.0) == 2  # fv: as asked
    assert taken(short / 3 + 0.1) == 3  # fv-opt: until the mode took SHORT_MODE_S
    assert taken(0.5) == cap  # pv: up to the cap


def test_short_single_vm_runs_are_taken_several_times_per_repetition():
    """A repetition's trace and 1-VM run are each the fastest of as many runs as fit the
    budget: a pv VM (a quarter second with its set-up) gets the most, fv (seconds) one."""
    budget, most = stats.RUN_SAMPLES_S, stats.MAX_RUN_SAMPLES
    assert stats.run_samples(0.25, budget) == most
    assert stats.run_samples(budget / 3 + 0.01, budget) == 2
    assert stats.run_samples(budget / 2, budget) == 2
    assert stats.run_samples(budget * 0.6, budget) == 1
    assert stats.run_samples(30.0, budget) == 1
    assert stats.run_samples(0.0, budget) == most  # a clock that did not move
    assert stats.run_samples(0.25, 0) == stats.run_samples(0.0, 0) == 1  # no budget


def test_the_fitted_vm_count_and_those_predicted_from_it_get_more_runs():
    """The 2-VM point anchors the cores and hand-off fit, so at fv's ~4 s a run it takes
    the most runs where one run of that length alone would take two; the 4- and 8-VM
    points predicted from it take as many for their length (fv at 4 VMs, ~9 s a run:
    four, not one); no budget: one each."""
    budget = stats.RUN_SAMPLES_S
    assert stats.run_samples(4.3, budget) == 2
    assert validation.runs_taken(validation.FIT_VMS, 4.3, budget) == stats.MAX_RUN_SAMPLES
    assert validation.runs_taken(4, 4.3, budget) == stats.MAX_RUN_SAMPLES
    assert validation.runs_taken(4, 9.0, budget) == 4 > stats.run_samples(9.0, budget) == 1
    assert validation.runs_taken(8, 20.0, budget) == 1
    assert validation.runs_taken(validation.FIT_VMS, 4.3, 0) == 1


def test_a_short_run_is_the_fastest_of_its_samples(tmp_path):
    """Each repetition keeps one point per VM count, the fastest of as many runs as fit
    the budget where a run is that short (1 VM: as many as the trace's recordings), and
    says how many it took.  The hook before each repetition runs."""
    before: list[int] = []  # what else is measured beside the runs goes before each rep
    measured = validation.measure("mmul", (16,), ["pv"], (1, 2), reps=1, short_mode_s=0,
                                  run_samples_s=60.0, trace_cache=tmp_path,
                                  before_rep=before.append)
    assert before == [0]
    one, two = sorted(measured, key=lambda m: m.vms)
    assert one.samples == two.samples == stats.MAX_RUN_SAMPLES
    assert one.trace is two.trace
    again = validation.measure("mmul", (16,), ["pv"], (1, 2), reps=1, short_mode_s=0,
                               run_samples_s=0, trace_cache=tmp_path)
    assert [m.samples for m in again] == [1, 1]


def test_the_title_says_how_many_runs_each_point_is_the_fastest_of():
    from gpuvm.calibrate.command import _reps_per_mode

    def run(mode: str, vms: int, rep: int, samples: int = 1) -> validation.Measured:
        return validation.Measured(mode, vms, rep, 1, {}, samples=samples)
    fv = [run("fv", n, rep) for rep in range(2) for n in (1, 2)]
    assert _reps_per_mode(fv) == "2"
    pv = [run("pv", 1, rep, 6) for rep in range(4)] + [run("pv", 2, rep, 3) for rep in range(4)]
    assert _reps_per_mode(fv + pv) == "fv 2, pv 4; runs per 1/2 VMs: pv 24/12"
