"""The isolation report measures each VM's utilisation in the window where every VM
competed; where there was no such time, it says n/a rather than an error of -share."""

from __future__ import annotations

from gpuvm.experiment.config import parse
from gpuvm.experiment.execute import VmRow
from gpuvm.experiment.report import isolation_report, shares_in_window

CONFIG = """
[experiment]
name = "iso"
kind = "isolation"
modes = ["fv-opt"]
policies = ["fifo"]

[[scenario]]
name = "pair"
[[scenario.vm]]
name = "A"
benchmark = "loop"
[[scenario.vm]]
name = "B"
benchmark = "loop"
"""
MS = 1_000_000


def _row(vm: str, busy: list[tuple[int, int]]) -> VmRow:
    return VmRow("iso", "pair", "fv-opt", "fifo", 0, vm, "loop", "kvm", True, None, 0.5,
                 0.0, {}, {}, {}, {}, {}, {}, sched={"dispatches": len(busy)}, busy=busy)


def _table_rows(md: list[str]) -> list[list[str]]:
    return [[c.strip() for c in line.strip("|").split("|")] for line in md
            if line.startswith("| fifo")]


def test_a_window_without_every_vm_competing_is_not_applicable(tmp_path) -> None:
    exp = parse(CONFIG, "iso.toml")
    apart = [_row("A", [(0, 10 * MS)]), _row("B", [(20 * MS, 30 * MS)])]  # never together
    _, shares = shares_in_window(apart)
    assert not any(s.measured for s in shares)
    md = isolation_report(exp, apart, tmp_path)
    rows = _table_rows(md)
    assert [(r[4], r[6], r[7]) for r in rows] == [("A", "n/a", "n/a"), ("B", "n/a", "n/a")]
    assert any("**FIFO**: n/a (no run had time with every VM competing" in m for m in md)


def test_a_window_with_both_vms_is_measured(tmp_path) -> None:
    exp = parse(CONFIG, "iso.toml")
    together = [_row("A", [(0, 10 * MS), (20 * MS, 30 * MS)]),
                _row("B", [(10 * MS, 20 * MS), (30 * MS, 40 * MS)])]  # both in 10-30 ms
    md = isolation_report(exp, together, tmp_path)
    rows = _table_rows(md)
    assert [(r[4], r[6], r[7]) for r in rows] == [("A", "50.0", "+0.0"), ("B", "50.0", "+0.0")]
    assert any("**FIFO**: mean |util − share| 0.0 pp" in m for m in md)
