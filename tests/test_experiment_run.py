"""A small experiment end to end (in-process guests): rows written as runs finish, a
failing VM does not lose the others' results, the report can be rebuilt from the rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuvm.experiment.config import parse
from gpuvm.experiment.execute import execute, row_from_dict
from gpuvm.experiment.report import isolation_window, write_report
from gpuvm.experiment.rundir import RunDir

REPO = Path(__file__).resolve().parents[1]

SMALL = """
[experiment]
name = "small"
kind = "benchmarks"
modes = ["native", "fv", "pv"]
backend = "inproc"
output = "{out}"

[[scenario]]
name = "idle"
[[scenario.vm]]
name = "vm"
benchmark = "idle"

[[scenario]]
name = "two"
[[scenario.vm]]
name = "good"
benchmark = "madd"
params = [64]
[[scenario.vm]]
name = "bad"
benchmark = "madd"
params = [64]
inject = "bad-method"
"""


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("exp")
    exp = parse(SMALL.format(out=out), "small.toml")
    rundir = RunDir.create(exp)
    lines: list[str] = []
    rows = execute(exp, rundir, progress=lines.append)
    report = write_report(exp, rows, rundir.path)
    rundir.mark_complete(len(rows))
    rundir.point_latest()
    return exp, rundir.path, rows, report, lines


def test_rows_report_and_figures(finished):
    exp, run, rows, report, lines = finished
    # idle in 3 modes + two VMs in 3 modes (native: a GPU each)
    assert len(rows) == 3 + 6
    assert len((run / "runs.jsonl").read_text().splitlines()) == len(rows)
    assert (run / "results.csv").read_text().count("\n") == len(rows) + 1
    assert (run / "modes-idle.png").stat().st_size > 0
    text = report.read_text()
    assert "| native | 1/1 |" in text and "| fv | 1/1 |" in text and "| pv | 1/1 |" in text
    assert (run.parent / "latest").resolve() == run.resolve()


def test_a_failing_vm_keeps_the_others(finished):
    exp, run, rows, report, lines = finished
    two = [r for r in rows if r.scenario == "two"]
    assert {(r.vm, r.passed) for r in two} == {("good", True), ("bad", False)}
    bad = next(r for r in two if r.vm == "bad")
    assert "bad method header" in bad.error and "\n" not in bad.error
    assert "Failed VMs" in report.read_text()


def test_report_rebuilds_from_rows(finished):
    exp, run, rows, report, _ = finished
    before = report.read_text()
    again = write_report(exp, [row_from_dict(d) for d in RunDir.open(run).read_rows().rows],
                         run)
    assert again.read_text() == before


def test_counts_in_rows_are_exact_and_modelled_time_follows(finished):
    _, run, rows, _, _ = finished
    idle = {r.mode: r for r in rows if r.scenario == "idle"}
    assert idle["native"].counters.get("trap.bar0.channel.write", 0) == 0
    assert idle["fv"].counters["shadow.syncs"] > 0
    assert idle["pv"].counters["hcall.calls"] > 0 and "shadow.ptes_scanned" not in idle["pv"].counters
    assert idle["fv"].total_modelled_ns > idle["native"].total_modelled_ns


def test_isolation_window_ends_when_the_first_vm_is_done():
    from gpuvm.experiment.execute import VmRow
    def row(name, added, busy):
        return VmRow("e", "s", "fv", "band", 0, name, "loop", "inproc", True, None, 0.5, 0,
                     {}, {}, {}, {}, {}, {}, {"added_at": added}, busy)
    a = row("a", 0, [(0, 10), (20, 100)])
    b = row("b", 15, [(10, 20), (30, 60)])
    assert isolation_window([a, b]) == (10, 60)  # b's first GPU work .. b's last


def test_cli_bad_config_is_one_line(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(SMALL.format(out=tmp_path).replace('kind = "benchmarks"', 'kind = "x"'))
    proc = subprocess.run([sys.executable, "-m", "gpuvm", "experiment", str(bad)],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"gpuvm: error: {bad}: experiment.kind: must be one of benchmarks, isolation, hostmem, "
        "scaling, oversubscription, suite"]
