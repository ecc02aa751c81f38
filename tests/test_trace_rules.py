"""The trace-event format's rules (gpuvm.trace.rules) catch what Perfetto's importer
would reject, so the trace test can check a trace without downloading trace_processor."""

from __future__ import annotations

import copy

import pytest

from gpuvm.trace import rules

GOOD = {"displayTimeUnit": "ms", "traceEvents": [
    {"ph": "M", "name": "process_name", "pid": 2, "tid": 0, "args": {"name": "vm0"}},
    {"ph": "M", "name": "thread_name", "pid": 2, "tid": 1, "args": {"name": "vCPU"}},
    {"ph": "X", "name": "Init", "pid": 2, "tid": 1, "ts": 0.0, "dur": 10.0},
    {"ph": "X", "name": "inner", "pid": 2, "tid": 1, "ts": 2.0, "dur": 3.0},
    {"ph": "X", "name": "HtoD", "pid": 2, "tid": 1, "ts": 10.0, "dur": 5.0},
    {"ph": "X", "name": "submission", "pid": 2, "tid": 2, "ts": 3.0, "dur": 20.0},
    {"ph": "B", "name": "b", "pid": 3, "tid": 1, "ts": 1.0},
    {"ph": "E", "name": "b", "pid": 3, "tid": 1, "ts": 4.0},
    {"ph": "i", "s": "t", "name": "vm0", "pid": 1, "tid": 1, "ts": 3.0},
    {"ph": "C", "name": "hypercalls", "pid": 2, "ts": 5.0, "args": {"value": 3}},
]}


def test_a_well_formed_trace_has_no_problems() -> None:
    assert rules.problems(GOOD) == []


def _broken(n: int, **change) -> dict:
    trace = copy.deepcopy(GOOD)
    trace["traceEvents"][n].update(change)
    return trace


@pytest.mark.parametrize("trace, says", [
    ({"events": []}, "traceEvents"),
    ({**GOOD, "displayTimeUnit": "s"}, "displayTimeUnit"),
    (_broken(2, ph="Z"), "unknown phase"),
    (_broken(2, ts=-1.0), "ts must be"),
    (_broken(2, ts=float("nan")), "ts must be"),
    (_broken(2, pid="2"), "pid must be an integer"),
    (_broken(2, dur=None), "dur"),
    (_broken(3, dur=9.0), "overlaps"),  # starts inside Init, ends after it
    (_broken(7, tid=2), "without a begin"),
    (_broken(8, s="x"), "scope"),
    (_broken(9, args={"value": "3"}), "numbers"),
    (_broken(0, name="process_title"), "unknown metadata"),
    (_broken(1, args={"name": 1}), "args.name"),
])
def test_each_broken_rule_is_named(trace: dict, says: str) -> None:
    found = rules.problems(trace)
    assert found and any(says in p for p in found), found
