"""The model of the whole system: traces from counts, contention for the mediator and the
engine; the cost model's PV zeroing and bounce copies."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.device import regs
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import with_bounce_bytes
from gpuvm.sim import replay as replay_module
from gpuvm.sim.replay import (CPU, ENGINE, MEDIATOR, Step, VmTrace, phase_steps, replay,
                              replicate, trace_from_row)

XEN = load_costs("xen-2014")
FV_INIT = {"exits.mmio.bar3.write": 40000, "exits.mmio.bar0.write": 5000,
           "shadow.syncs": 13, "shadow.bar_syncs": 13, "shadow.ptes_scanned": 400000,
           "pfifo.doorbells": 2, "engine.busy_ns": 10000}


def test_phase_steps_add_up_to_the_modelled_time():
    steps = phase_steps("Init", FV_INIT, XEN, mediated=True)
    assert sum(s.ns for s in steps) == pytest.approx(XEN.modelled_ns(FV_INIT, True), abs=3)
    assert sum(s.ns for s in steps if s.resource == MEDIATOR) == \
        pytest.approx(XEN.mediator_ns(FV_INIT, True), abs=2)
    assert sum(s.ns for s in steps if s.resource == ENGINE) == 10000
    assert {s.resource for s in steps} == {CPU, MEDIATOR, ENGINE}


def test_one_vm_alone_takes_its_own_time_and_replay_is_deterministic():
    row = {"vm": "a", "phase_counters": {"Init": FV_INIT}, "start_s": 0.0, "share": 1.0}
    trace = trace_from_row(row, XEN, mediated=True)
    alone = replay([trace])
    assert alone.makespan_ns == trace.alone_ns
    assert replay(replicate(trace, 4)) == replay(replicate(trace, 4))


def test_mediator_work_serialises_and_private_work_does_not():
    private = VmTrace("p", (Step(CPU, 1000, "Init"),))
    locked = VmTrace("m", (Step(MEDIATOR, 1000, "Init"),))
    assert replay(replicate(private, 8)).makespan_ns == 1000  # each VM's own vCPU
    assert replay(replicate(locked, 8)).makespan_ns == 8000  # one mediator lock
    engine = VmTrace("e", (Step(ENGINE, 1000, "Launch"),))
    assert replay(replicate(engine, 4)).makespan_ns == 4000  # one engine


def test_fv_degrades_with_vms_and_pv_does_not_on_the_paper_profile():
    fv = trace_from_row({"vm": "fv", "phase_counters": {"Init": FV_INIT}}, XEN, True)
    pv_counts = {"exits.mmio.bar0.write": 40, "hcall.calls": 56, "hcall.entries": 2400,
                 "hcall.set_pgd": 3, "pv.pts_allocated": 3, "pfifo.doorbells": 2,
                 "engine.busy_ns": 10000}
    pv = trace_from_row({"vm": "pv", "phase_counters": {"Init": pv_counts}}, XEN, True)
    slow = {t.name: replay(replicate(t, 8)).makespan_ns / t.alone_ns for t in (fv, pv)}
    assert slow["fv"] > 1.5 and slow["pv"] < 1.3


def test_pv_pays_for_zeroing_whole_tables_and_pageable_copies_for_their_bounce():
    pv = {"hcall.set_pgd": 1, "pv.pts_allocated": 2}
    words = regs.PDE_COUNT + 2 * regs.SMALL_PTES_PER_PT
    assert XEN.modelled_ns(pv, True) == pytest.approx(
        2 * XEN.pt_alloc_ns + words * XEN.pt_zero_word_ns)
    pageable = with_bounce_bytes("HtoD", {"copy.bytes": 1 << 20}, {"pinned": "0"})
    pinned = with_bounce_bytes("HtoD", {"copy.bytes": 1 << 20}, {"pinned": "1"})
    assert pageable["copy.bounce_bytes"] == 1 << 20 and "copy.bounce_bytes" not in pinned
    assert XEN.modelled_ns(pageable, False) - XEN.modelled_ns(pinned, False) == \
        pytest.approx((1 << 20) * XEN.bounce_byte_ns)
    assert "copy.bounce_bytes" not in with_bounce_bytes("Init", {"copy.bytes": 8},
                                                        {"pinned": "0"})


def test_traces_are_recorded_once_and_replayed_at_any_scale(tmp_path):
    from gpuvm.sim.traces import TraceKey, load_trace

    key = TraceKey("idle", (), "pv")
    first = load_trace(key, cache=tmp_path)
    path = tmp_path / key.file_name
    stamp = path.stat().st_mtime_ns
    again = load_trace(key, cache=tmp_path)
    assert again == first and path.stat().st_mtime_ns == stamp  # from the cache
    assert first["key"]["driver"] == "pv" and first["phase_counters"]["Init"]["hcall.calls"] > 0
    trace = trace_from_row({"vm": "idle", **first}, XEN, mediated=True)
    many = replay(replicate(trace, 64))
    assert len(many.finish_ns) == 64 and many.makespan_ns >= trace.alone_ns


def test_a_sweep_on_a_local_dask_cluster_gives_the_serial_rows(tmp_path):
    from gpuvm.experiment.config import parse
    from gpuvm.sim.sweep import points_for, run_sweep
    from gpuvm.sim.traces import TraceKey, load_trace

    exp = parse('[experiment]\nname = "s"\nmodes = ["pv", "pv-naive"]\n'
                'policies = ["fifo", "band"]\n[[scenario]]\nname = "idle"\n'
                '[[scenario.vm]]\nname = "vm"\nbenchmark = "idle"\n', "s.toml")
    traces = {TraceKey("idle", (), m).file_name: load_trace(TraceKey("idle", (), m),
                                                            cache=tmp_path)
              for m in exp.modes}
    points = points_for(exp, (1, 3, 16), ("xen-2014",))
    serial = run_sweep(exp, points, traces)
    assert len(serial) == 2 * 2 * 3
    assert run_sweep(exp, points, traces, dask="local") == serial
    slowdowns = {(r["mode"], r["vms"]): r["makespan_ns"] / r["alone_ns"] for r in serial}
    assert slowdowns[("pv", 16)] > slowdowns[("pv", 1)] == 1.0


@settings(max_examples=80, deadline=None)
@given(capacity=st.integers(1, 3),
       takers=st.lists(st.tuples(st.integers(0, 50), st.integers(1, 40)), min_size=1,
                       max_size=12))
def test_the_replays_holders_serve_first_come_first_served_never_over_capacity(capacity,
                                                                                 takers):
    """Processes asking at given times and holding for given times: never more holders
    than the capacity, none waits while one is free, and the waiting are served in the
    order they asked."""
    env = simpy.Environment()
    holders = replay_module._Holders(env, capacity)
    held, asked, served = [0], [], []

    def taker(i: int, at: int, hold: int):
        yield env.timeout(at)
        asked.append(i)
        wait = holders.take()
        if wait is not None:
            assert held[0] == capacity  # waits only while every one is held
            yield wait
        served.append(i)
        held[0] += 1
        assert held[0] <= capacity
        yield env.timeout(hold)
        held[0] -= 1
        holders.give()
    for i, (at, hold) in enumerate(takers):
        env.process(taker(i, at, hold))
    env.run()
    assert served == asked and held == [0] and holders.free == capacity
