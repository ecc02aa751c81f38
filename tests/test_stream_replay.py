"""The model of the whole system on event streams: the mediator's lock granted in
virtual-time order, one engine through the shared scheduler classes, streams recorded
once and replayed at any scale, sweeps on Dask giving the serial rows; the cost model's
PV zeroing and bounce copies."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.device import regs
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import with_bounce_bytes
from gpuvm.sim.stream_replay import LockModel, VmStream, replay, replicate

XEN = load_costs("xen-2014")


def test_unlocked_work_runs_side_by_side_and_locked_work_queues():
    private = VmStream("p", (("x", 10, 1000, -1),))
    locked = VmStream("m", (("x", 10, 1000, 1000),))
    assert replay(replicate(private, 8)).makespan_ns == 10_000  # each VM's own vCPU
    assert replay(replicate(locked, 8)).makespan_ns == 80_000  # one mediator lock
    half = VmStream("h", (("x", 10, 1000, 500),))
    result = replay(replicate(half, 2))
    assert result.makespan_ns == 10_500 and sorted(result.lock_wait_ns.values()) == [0, 500]


def test_the_engine_is_shared_and_a_wait_lasts_until_the_vms_work_is_done():
    gpu = VmStream("g", (("d", 1000), ("w", 1000)))
    assert replay(replicate(gpu, 4)).makespan_ns == 4000  # one non-preemptive engine
    ahead = VmStream("a", (("d", 1000), ("x", 1, 300, -1), ("w", 700)))
    assert replay([ahead]).makespan_ns == 1000  # its own work overlaps its kernel


def test_a_coarse_grain_keeps_the_work_and_the_lock_time():
    fv = VmStream("fv", (("x", 40_000, 12_000, 200), ("x", 13, 700_000, 700_000)))
    exact, coarse = replay(replicate(fv, 8)), replay(replicate(fv, 8), grain_ns=1_000_000)
    assert coarse.events < exact.events / 10
    assert coarse.makespan_ns == pytest.approx(exact.makespan_ns, rel=0.02)


@settings(max_examples=60, deadline=None)
@given(asks=st.lists(st.tuples(st.integers(0, 30), st.integers(0, 20)), min_size=1,
                     max_size=10))
def test_lock_asks_are_granted_in_time_then_join_order_and_never_overlap(asks):
    """VMs asking at given times for given holds: a grant is never before its ask nor
    inside another hold, asks are served in (time, rank) order, and nobody waits while
    the lock is free."""
    env = simpy.Environment()
    lock = LockModel(env)
    grants: list[tuple[int, int, int, int]] = []  # (asked, rank, start, hold)

    def vm(rank: int, at: int, hold: int):
        yield env.timeout(at)
        start = yield lock.ask(rank, hold)
        grants.append((at, rank, start, hold))

    for rank, (at, hold) in enumerate(asks):
        env.process(vm(rank, at, hold))
    env.run()
    assert len(grants) == len(asks)
    free = 0
    for asked, _, start, hold in sorted(grants, key=lambda g: (g[0], g[1])):
        assert start == max(asked, free)
        free = max(free, start + hold)


def test_streams_are_recorded_once_and_replayed_at_any_scale(tmp_path):
    from gpuvm.sim.traces import TraceKey, load_trace

    key = TraceKey("idle", (), "pv")
    first = load_trace(key, cache=tmp_path)
    path = tmp_path / key.file_name
    stamp = path.stat().st_mtime_ns
    again = load_trace(key, cache=tmp_path)
    assert again == first and path.stat().st_mtime_ns == stamp  # from the cache
    assert key.driver == "pv" and any(e[0] == "x" for e in first.entries)
    many = replay(replicate(first, 64))
    assert len(many.end_ns) == 64 and many.makespan_ns >= first.alone_ns


def test_a_sweep_on_a_local_dask_cluster_gives_the_serial_rows(tmp_path):
    from gpuvm.experiment.config import parse
    from gpuvm.sim.sweep import points_for, run_sweep
    from gpuvm.sim.traces import TraceKey, load_trace

    exp = parse('[experiment]\nname = "s"\nmodes = ["pv", "fv-opt"]\n'
                'policies = ["fifo", "band"]\n[[scenario]]\nname = "idle"\n'
                '[[scenario.vm]]\nname = "vm"\nbenchmark = "idle"\n', "s.toml")
    traces = {TraceKey("idle", (), m).file_name: load_trace(TraceKey("idle", (), m),
                                                            cache=tmp_path)
              for m in exp.modes}
    points = points_for(exp, (1, 3, 64), ("xen-2014",))
    serial = run_sweep(exp, points, traces)
    assert len(serial) == 2 * 2 * 3
    assert run_sweep(exp, points, traces, dask="local") == serial
    slowdowns = {(r["mode"], r["vms"]): r["makespan_ns"] / r["alone_ns"] for r in serial}
    assert slowdowns[("fv-opt", 64)] > slowdowns[("fv-opt", 1)] == 1.0


def test_pv_pays_for_zeroing_whole_tables_and_pageable_copies_for_their_bounce():
    pv = {"hcall.set_pgd": 1, "pv.pts_allocated": 2}
    words = regs.PDE_COUNT + 2 * regs.SMALL_PTES_PER_PT
    assert XEN.modelled_ns(pv, True) == pytest.approx(
        2 * XEN.pt_alloc_ns + words * XEN.pt_zero_word_ns)
    prices = XEN.event_prices(True).counter_ns
    assert prices["hcall.set_pgd"] + 2 * prices["pv.pts_allocated"] == pytest.approx(
        XEN.modelled_ns(pv, True))
    pageable = with_bounce_bytes("HtoD", {"copy.bytes": 1 << 20}, {"pinned": "0"})
    pinned = with_bounce_bytes("HtoD", {"copy.bytes": 1 << 20}, {"pinned": "1"})
    assert pageable["copy.bounce_bytes"] == 1 << 20 and "copy.bounce_bytes" not in pinned
    assert XEN.modelled_ns(pageable, False) - XEN.modelled_ns(pinned, False) == \
        pytest.approx((1 << 20) * XEN.bounce_byte_ns)
