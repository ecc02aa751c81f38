"""A short point runs again: `repeat_until_s` / `max_repetitions` (rundir.wants_another).

The scaling validation keeps each point's fastest run, and a short run is noisier than a
long one, so a point whose runs took less than `repeat_until_s` together runs again, up
to `max_repetitions` runs -- decided on the makespans the rows keep, so a resumed run
decides as the first did.  In-process guests; the budgets are set so the outcome does
not depend on how fast this host runs them (a day, or a microsecond)."""

from __future__ import annotations

import pytest

from gpuvm.experiment.config import ConfigError, parse
from gpuvm.experiment.execute import execute
from gpuvm.experiment.report import write_report
from gpuvm.experiment.rundir import (RunDir, RunKey, complete_runs, fingerprint,
                                     further_runs, wants_another, why_another)
from gpuvm.experiment import run_traces
from gpuvm.sim import traces

SHORT = """
[experiment]
name = "short"
kind = "benchmarks"
modes = ["pv"]
backend = "inproc"
output = "{out}"
repetitions = 2
{budget}

[[scenario]]
name = "idle"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
{inject}
"""


def _experiment(tmp_path, budget: str, inject: str = ""):
    return parse(SHORT.format(out=tmp_path, budget=budget, inject=inject), "short.toml")


def _reps(rows) -> list[int]:
    return sorted(r.rep for r in rows)


def test_a_short_point_runs_up_to_the_most_and_the_report_says_so(tmp_path):
    exp = _experiment(tmp_path, "repeat_until_s = 86400\nmax_repetitions = 5")
    run = RunDir.create(exp)
    lines: list[str] = []
    more: list[None] = []
    points: list[tuple] = []
    rows = execute(exp, run, progress=lines.append, unplanned=lambda: more.append(None),
                   after_point=lambda key, runs: points.append((key[:3], runs)))
    assert _reps(rows) == [0, 1, 2, 3, 4]
    assert points == [(("idle", "pv", "fifo"), 5)]  # once, when the point has them all
    assert len(more) == 3 and sum("(short: " in line for line in lines) == 3
    text = write_report(exp, rows, run.path).read_text()
    assert "repetitions: 2 (up to 5 where a point's runs took under 86400 s together)" in text
    assert "Runs: 2 of 2 planned VM runs and 3 more of points run again" in text


def test_a_point_over_the_budget_runs_its_repetitions_only(tmp_path):
    exp = _experiment(tmp_path, "repeat_until_s = 0.000001\nmax_repetitions = 5")
    points: list[int] = []
    rows = execute(exp, RunDir.create(exp), after_point=lambda key, runs: points.append(runs))
    assert _reps(rows) == [0, 1] and points == [2]


def test_a_failing_point_is_not_run_again(tmp_path):
    exp = _experiment(tmp_path, "repeat_until_s = 86400\nmax_repetitions = 5",
                      inject='inject = "bad-method"')
    rows = execute(exp, RunDir.create(exp))
    assert _reps(rows) == [0, 1] and not any(r.passed for r in rows)


def test_a_resumed_run_makes_only_the_further_runs_it_lacks(tmp_path):
    exp = _experiment(tmp_path, "repeat_until_s = 86400\nmax_repetitions = 5")
    run = RunDir.create(exp)
    execute(exp, run)
    loaded = run.read_rows()
    run.rewrite_rows([line for row, line in zip(loaded.rows, loaded.lines) if row["rep"] < 3])
    done = complete_runs(run.read_rows().rows, exp)
    assert _reps(execute(exp, run, skip=done)) == [3, 4]
    # and once it has them all, nothing more
    assert execute(exp, run, skip=complete_runs(run.read_rows().rows, exp)) == []


def test_wants_another_counts_runs_and_their_time(tmp_path):
    exp = _experiment(tmp_path, "repeat_until_s = 1.0\nmax_repetitions = 4")
    assert wants_another(exp, [100_000_000] * 2)
    assert not wants_another(exp, [100_000_000] * 4)  # the most runs
    assert not wants_another(exp, [600_000_000] * 2)  # 1.2 s: long enough
    fixed = _experiment(tmp_path, "")
    assert fixed.max_repetitions == 2 and not wants_another(fixed, [1] * 2)


def test_a_point_whose_runs_disagree_runs_again_within_its_time(tmp_path):
    """`repeat_while_spread`: past `repeat_until_s`, a point whose slowest run took more
    than that times its fastest runs again while its runs took under `spread_until_s`
    together, up to max_repetitions -- and its further run's label says why."""
    exp = _experiment(tmp_path, "repeat_until_s = 1.0\nmax_repetitions = 5\n"
                                "repeat_while_spread = 1.15\nspread_until_s = 10.0")
    s = 1_000_000_000
    assert why_another(exp, [2 * s, int(2.6 * s)]) == \
        "spread: the slowest of 2 runs 1.30x the fastest"
    assert not wants_another(exp, [2 * s, int(2.2 * s)])  # 1.10x: they agree
    assert not wants_another(exp, [5 * s, int(6.5 * s)])  # 11.5 s: out of time
    assert not wants_another(exp, [s, 2 * s, s, s, s])  # the most runs
    assert why_another(exp, [s // 10]) == "short: 0.10 s in 1 runs"
    assert "or under 10 s with the slowest over 1.15x the fastest" in further_runs(exp)
    # off unless asked: the same runs of a point without the keys stop at once
    plain = _experiment(tmp_path, "repeat_until_s = 1.0\nmax_repetitions = 5")
    assert not wants_another(plain, [2 * s, int(2.6 * s)])
    # and the plan's hash is the one it had before the keys existed
    assert "repeat_while_spread" not in fingerprint(plain)
    assert fingerprint(exp)["repeat_while_spread"] == 1.15


@pytest.mark.parametrize("budget, culprit", [
    ("max_repetitions = 1", "experiment.max_repetitions: must be >= repetitions (2)"),
    ("repeat_until_s = 2.0", "experiment.repeat_until_s: has no effect unless "
                             "max_repetitions is above repetitions (2)"),
    ("repeat_until_s = -1.0\nmax_repetitions = 3", "experiment.repeat_until_s: must be >= 0"),
    ("repeat_while_spread = 0.9\nspread_until_s = 5.0\nmax_repetitions = 3",
     "experiment.repeat_while_spread: must be 0 (off) or above 1"),
    ("repeat_while_spread = 1.2\nspread_until_s = 5.0",
     "experiment.repeat_while_spread: has no effect unless max_repetitions is above "
     "repetitions (2)"),
    ("repeat_while_spread = 1.2\nmax_repetitions = 3",
     "experiment.repeat_while_spread: has no effect without both repeat_while_spread and "
     "spread_until_s above 0"),
    ("spread_until_s = 5.0\nmax_repetitions = 3",
     "experiment.spread_until_s: has no effect without both"),
    ("spread_until_s = -1.0\nmax_repetitions = 3", "experiment.spread_until_s: must be >= 0"),
])
def test_bad_budgets_are_one_line_naming_the_key(tmp_path, budget, culprit):
    with pytest.raises(ConfigError, match=culprit.replace("(", r"\(").replace(")", r"\)")):
        _experiment(tmp_path, budget)


SCALING = """
[experiment]
name = "scaling"
kind = "scaling"
modes = ["fv-opt", "pv"]
backend = "inproc"
repetitions = 3
repeat_until_s = 3.0
max_repetitions = 12
{scenarios}
"""


def test_a_trace_is_the_fastest_of_a_recording_beside_each_run_of_its_point(monkeypatch,
                                                                            tmp_path):
    """One recording right after each run of a mode's 1-VM point (not of the 2-VM one,
    listed first), the fastest kept once the point has all its runs: pv's 1-VM point
    is short and gets 12 runs, fv-opt's (a budget it exceeds at once) 3."""
    scenarios = "".join(
        f'\n[[scenario]]\nname = "{n}vm"\n[[scenario.vm]]\nname = "vm"\n'
        f'benchmark = "idle"\ncount = {n}\n' for n in (2, 1))
    exp = parse(SCALING.format(scenarios=scenarios), "scaling.toml")
    real = traces.record_run(run_traces.keys(exp)[("pv", "1vm")], "inproc")
    made: list[tuple[str, int]] = []

    def record(key, backend, count_lock_releases=False):
        made.append((key.mode, 50 - len(made) % 7))  # the fastest: a middle recording
        return real | {"wall_ns": {"all": made[-1][1]}}
    monkeypatch.setattr(run_traces, "record_run", record)
    monkeypatch.setattr(traces, "record_run", record)
    beside = run_traces.BesideRuns(exp, tmp_path, "inproc")
    for rep in range(12):
        for scenario, mode in (("2vm", "pv"), ("1vm", "pv")) + \
                ((("2vm", "fv-opt"), ("1vm", "fv-opt")) if rep < 3 else ()):
            beside.after_run(RunKey(scenario, mode, "fifo", rep))
    for scenario, mode, runs in (("2vm", "pv", 9), ("1vm", "pv", 12), ("2vm", "fv-opt", 3),
                                 ("1vm", "fv-opt", 3)):
        beside.after_point(RunKey(scenario, mode, "fifo", runs), runs)
    assert [m for m, _ in made].count("pv") == 12 and [m for m, _ in made].count("fv-opt") == 3
    counts = run_traces._counts(tmp_path / run_traces.TRACES)
    assert counts == {"idle_default_pv_pv.npz": 12, "idle_default_fv-opt_direct.npz": 3}
    kept = traces.read_trace(tmp_path / run_traces.TRACES / "idle_default_pv_pv.npz")
    assert kept["wall_ns"] == {"all": min(w for m, w in made if m == "pv")}
    # a resumed run that lost its recordings makes the rest once its point is done
    resumed = run_traces.BesideRuns(exp, tmp_path / "resumed", "inproc")
    (tmp_path / "resumed").mkdir()
    resumed.after_run(RunKey("1vm", "pv", "fifo", 11))
    resumed.after_point(RunKey("1vm", "pv", "fifo", 12), 12)
    assert run_traces._counts(tmp_path / "resumed" / run_traces.TRACES) == \
        {"idle_default_pv_pv.npz": 12} and len(made) == 15 + 12
