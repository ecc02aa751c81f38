"""The order an experiment's runs are made in (`order`, rundir.plan): by rounds -- one run
of every point a round -- or by points, each point's runs back to back.  In-process
guests."""

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


def test_by_points_each_points_runs_are_back_to_back(tmp_path):
    exp = _experiment(tmp_path, 'order = "points"')
    assert [(k.scenario, k.rep) for k in plan(exp)] == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    rows = execute(exp, RunDir.create(exp))
    assert _made(rows) == [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert "made in rounds" not in write_report(exp, rows, tmp_path).read_text()


def test_a_resumed_run_in_rounds_makes_what_it_lacks_in_round_order(tmp_path):
    exp = _experiment(tmp_path)
    run = RunDir.create(exp)
    execute(exp, run)
    loaded = run.read_rows()
    run.rewrite_rows([line for row, line in zip(loaded.rows, loaded.lines)
                      if (row["scenario"], row["rep"]) not in {("a", 1), ("b", 0)}])
    again = execute(exp, run, skip=complete_runs(run.read_rows().rows, exp))
    assert _made(again) == [("b", 0), ("a", 1)]


def test_an_unknown_order_is_one_line_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"experiment\.order: must be one of rounds, points"):
        _experiment(tmp_path, 'order = "shuffled"')
