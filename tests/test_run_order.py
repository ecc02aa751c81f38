"""The order an experiment's runs are made in (`order`, rundir.plan): by rounds -- one run
of every point a round, the short points' further runs in further rounds -- or by
points, each point's runs back to back.  In-process guests."""

from __future__ import annotations

import pytest

from gpuvm.experiment.config import ConfigError, parse
from gpuvm.experiment.execute import execute
from gpuvm.experiment.report import write_report
from gpuvm.experiment.rundir import RunDir, complete_runs, plan

TWO_POINTS = """
[experiment]
name = "order"
kind = "benchmarks"
modes = ["pv"]
backend = "inproc"
output = "{out}"
repetitions = 2
{extra}

[[scenario]]
name = "a"
[[scenario.vm]]
name = "vm"
benchmark = "idle"

[[scenario]]
name = "b"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
"""


def _experiment(tmp_path, extra: str = ""):
    return parse(TWO_POINTS.format(out=tmp_path, extra=extra), "order.toml")


def _made(rows) -> list[tuple[str, int]]:
    """(scenario, repetition) of each run, in the order the rows were written."""
    return list(dict.fromkeys((r.scenario, r.rep) for r in rows))


def test_runs_are_made_in_rounds_by_default(tmp_path):
    exp = _experiment(tmp_path)
    assert exp.order == "rounds"
    assert [(k.scenario, k.rep) for k in plan(exp)] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    text = write_report(exp, execute(exp, RunDir.create(exp)), tmp_path).read_text()
    assert "made in rounds (one run of every point a round)" in text


def test_short_points_run_again_in_further_rounds(tmp_path):
    exp = _experiment(tmp_path, "repeat_until_s = 86400\nmax_repetitions = 4")
    done: list[tuple[str, int]] = []
    after: list[tuple[str, int]] = []
    events: list[object] = []
    rows = execute(exp, RunDir.create(exp),
                   after_run=lambda key: (after.append(key[::3]), events.append(key[::3])),
                   after_point=lambda key, runs: done.append((key.scenario, runs)),
                   before_round=events.append)
    rounds = [(s, r) for r in range(4) for s in "ab"]
    assert _made(rows) == rounds and after == rounds
    assert done == [("a", 4), ("b", 4)]  # each once, when it has all its runs
    # before_round comes before each planned round's first run (the lock's rounds go
    # there), not before the short points' further rounds
    assert events == [0, ("a", 0), ("b", 0), 1, ("a", 1), ("b", 1)] + rounds[4:]


def test_by_points_each_points_runs_are_back_to_back(tmp_path):
    exp = _experiment(tmp_path, 'order = "points"\nrepeat_until_s = 86400\n'
                                "max_repetitions = 3")
    assert [(k.scenario, k.rep) for k in plan(exp)] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    done: list[str] = []
    rows = execute(exp, RunDir.create(exp),
                   after_point=lambda key, runs: done.append(key.scenario))
    assert _made(rows) == [("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 1), ("b", 2)]
    assert done == ["a", "b"]
    began: list[int] = []
    execute(exp, RunDir.create(exp), before_round=began.append)
    assert began == []  # no rounds to be before: the lock's rounds all come after
    assert "made in rounds" not in write_report(exp, rows, tmp_path).read_text()


def test_a_resumed_run_in_rounds_makes_what_it_lacks_in_round_order(tmp_path):
    exp = _experiment(tmp_path, "repeat_until_s = 86400\nmax_repetitions = 3")
    run = RunDir.create(exp)
    execute(exp, run)
    loaded = run.read_rows()
    run.rewrite_rows([line for row, line in zip(loaded.rows, loaded.lines)
                      if (row["scenario"], row["rep"]) not in {("a", 1), ("b", 2)}])
    began: list[int] = []
    again = execute(exp, run, skip=complete_runs(run.read_rows().rows, exp),
                    before_round=began.append)
    assert _made(again) == [("a", 1), ("b", 2)]
    assert began == [1]  # round 0 was made before: nothing is run before it again


def test_an_unknown_order_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"experiment\.order: must be one of rounds, points"):
        _experiment(tmp_path, 'order = "shuffled"')
