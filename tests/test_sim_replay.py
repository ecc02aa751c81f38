"""The model of the whole system: traces from counts, contention for the mediator, the
engine and host cores; the cost model's PV zeroing and bounce copies; the emulator fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.calibrate import emulator
from gpuvm.device import regs
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import with_bounce_bytes
from gpuvm.sim import replay as replay_module
from gpuvm.sim.replay import (CPU, ENGINE, FREE, MEDIATOR, SLEEP, Step, VmTrace, phase_steps,
                              replay, replicate, trace_from_row)

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
    alone = replay([trace], cores=8)
    assert alone.makespan_ns == trace.alone_ns
    assert replay(replicate(trace, 4), cores=8) == replay(replicate(trace, 4), cores=8)


def test_mediator_work_serialises_and_private_work_does_not():
    private = VmTrace("p", (Step(CPU, 1000, "Init"),))
    locked = VmTrace("m", (Step(MEDIATOR, 1000, "Init"),))
    assert replay(replicate(private, 8), cores=8).makespan_ns == 1000
    assert replay(replicate(locked, 8), cores=8).makespan_ns == 8000
    assert replay(replicate(private, 8), cores=2).makespan_ns == 4000  # cores bound it
    engine = VmTrace("e", (Step(ENGINE, 1000, "Launch"),))
    assert replay(replicate(engine, 4), cores=8).makespan_ns == 4000  # one engine


@pytest.fixture
def steady_wakes(monkeypatch):
    """Every woken thread lands exactly the hand-off later (no jitter): the arithmetic
    below is then exact."""
    monkeypatch.setattr(replay_module, "WAKE_JITTER_CV", 0.0)


def test_the_replay_counts_the_exits_that_slept_for_the_interpreter_lock(steady_wakes):
    """Each VM's step of 3 exits holds the lock 1 us: alone it never waits; of four at
    once, three sleep for it (their 3 exits each count), and each drop wakes the next,
    which lands 100 ns later -- once a take, not once an exit."""
    step = VmTrace("t", (Step(CPU, 1000, "Init", events=3),))
    alone = replay([step], cores=8, interpreter_lock=True, lock_handoff_ns=100)
    assert alone.lock_sleeps == 0 and alone.makespan_ns == 1000
    four = replay(replicate(step, 4), cores=8, interpreter_lock=True, lock_handoff_ns=100)
    assert four.lock_sleeps == 3 * 3
    assert four.makespan_ns == 1000 + 3 * (1000 + 100)
    assert replay(replicate(step, 4), cores=8).lock_sleeps == 0  # no lock, no sleeps


def test_the_replay_adds_up_the_vms_time_on_host_cores(steady_wakes):
    """What a VM's vCPU thread would use: its guest's time, its work under the lock and
    the wake-ups it signalled -- not the engine's time, a wait's, nor a landing."""
    trace = VmTrace("t", (Step(FREE, 500, "Init"), Step(CPU, 1000, "Init", events=3),
                          Step(ENGINE, 2000, "Launch"), Step(SLEEP, 700, "Launch")))
    alone = replay([trace], cores=8, interpreter_lock=True, lock_handoff_ns=100,
                   lock_signal_ns=10)
    assert alone.core_ns == 1500  # it woke nobody
    four = replay(replicate(trace, 4), cores=8, interpreter_lock=True, lock_handoff_ns=100,
                  lock_signal_ns=10)
    assert four.lock_sleeps == 9 and four.core_ns == 4 * 1500 + 3 * 10


def test_a_thread_keeps_its_core_through_its_guest_stretch():
    """One core: a runs its handler, then its guest for 100 ns, then another handler; b
    waits for the core all along, since nothing preempts a running thread.  Without the
    interpreter lock each step takes the core for itself, and b's handler runs between
    a's."""
    a = VmTrace("a", (Step(CPU, 10, "Init", events=1), Step(FREE, 100, "Init"),
                      Step(CPU, 10, "Init", events=1)))
    b = VmTrace("b", (Step(CPU, 10, "Init", events=1),))
    locked = replay([a, b], cores=1, interpreter_lock=True, lock_handoff_ns=1000)
    assert locked.finish_ns == {"a": 120, "b": 130} and locked.lock_sleeps == 0
    apart = replay([a, b], cores=1)
    assert apart.finish_ns == {"a": 130, "b": 20}


def test_the_host_takes_a_guests_core_for_a_waiting_thread_at_the_rate_given():
    """One core, two guests of 1 ms each: run to the end, a finishes at 1 ms and b at 2;
    with their cores taken every 10 us on average each waits behind the other, so both
    end near 2 ms -- the makespan is the same, the draws are seeded (a replay repeats
    itself), and a core is taken only where another thread waits for one."""
    a = VmTrace("a", (Step(FREE, 1_000_000, "Init"),))
    b = VmTrace("b", (Step(FREE, 1_000_000, "Init"),))
    kept = replay([a, b], cores=1, interpreter_lock=True)
    assert kept.finish_ns == {"a": 1_000_000, "b": 2_000_000} and kept.cores_taken == 0
    taken = [replay([a, b], cores=1, interpreter_lock=True, guest_preempt_per_ns=1e-4)
             for _ in range(2)]
    assert taken[0] == taken[1] and taken[0].makespan_ns == 2_000_000
    assert min(taken[0].finish_ns.values()) > 1_900_000 and taken[0].cores_taken > 50
    alone = replay([a], cores=1, interpreter_lock=True, guest_preempt_per_ns=1e-4)
    assert alone.makespan_ns == 1_000_000 and alone.cores_taken == 0


def test_a_holder_that_loses_its_core_keeps_the_lock(steady_wakes):
    """One core: a holds the lock for 1 ms and loses its core now and then; b's guest
    stretch runs meanwhile, but b's handler waits for a's drop -- a core taken from a
    holder stalls every thread that wants the lock."""
    a = VmTrace("a", (Step(CPU, 1_000_000, "Init", events=1),))
    b = VmTrace("b", (Step(FREE, 200_000, "Init"), Step(CPU, 10, "Init", events=1)))
    result = replay([a, b], cores=1, interpreter_lock=True, held_preempt_per_ns=1e-4)
    assert result.finish_ns["a"] == 1_200_000  # b's guest ran on its core meanwhile
    assert result.finish_ns["b"] > result.finish_ns["a"] and result.lock_sleeps == 1
    assert result.cores_taken >= 1


def test_a_running_thread_takes_the_lock_before_the_one_woken_for_it(steady_wakes):
    """b sleeps for the lock a holds; a's drop wakes b, which lands 100 ns later.  a is
    back from a 10 ns guest stretch before that and takes the free lock (barging): if
    it holds it 50 ns, b lands on a free lock; if 200 ns, b finds it held, sleeps again,
    and lands 100 ns after a's next drop."""
    b = VmTrace("b", (Step(FREE, 1, "Init"), Step(CPU, 50, "Init", events=1)))

    def run(second: int):
        a = VmTrace("a", (Step(CPU, 50, "Init", events=1), Step(FREE, 10, "Init"),
                          Step(CPU, second, "Init", events=1)))
        return replay([a, b], cores=8, interpreter_lock=True, lock_handoff_ns=100)
    short, long = run(50), run(200)
    assert short.finish_ns == {"a": 110, "b": 200} and short.lock_sleeps == 1
    assert long.finish_ns == {"a": 260, "b": 410} and long.lock_sleeps == 2


def test_the_thread_letting_the_lock_go_pays_the_wake_up_off_the_lock(steady_wakes):
    """As above with a 30 ns signal: a pays it on its core after each drop that woke
    b (its guest stretch starts 30 ns later), while b's landing is timed from the
    drop; a's last drop wakes nobody and costs nothing."""
    a = VmTrace("a", (Step(CPU, 50, "Init", events=1), Step(FREE, 10, "Init"),
                      Step(CPU, 50, "Init", events=1)))
    b = VmTrace("b", (Step(FREE, 1, "Init"), Step(CPU, 50, "Init", events=1)))
    result = replay([a, b], cores=8, interpreter_lock=True, lock_handoff_ns=100,
                    lock_signal_ns=30)
    assert result.finish_ns == {"a": 140, "b": 200}
    assert result.core_ns == 50 + 10 + 50 + 30 + 1 + 50


def test_a_woken_thread_queues_for_a_core_where_none_is_idle(steady_wakes):
    """Two cores: a holds the lock, b sleeps for it, c's guest takes b's core.  a's drop
    wakes b, but a keeps its core for its guest and c has the other: b queues, gets c's
    core when c's guest ends, and takes the lock then -- no landing paid on top."""
    a = VmTrace("a", (Step(CPU, 100, "Init", events=1), Step(FREE, 1000, "Init")))
    b = VmTrace("b", (Step(FREE, 1, "Init"), Step(CPU, 10, "Init", events=1)))
    c = VmTrace("c", (Step(FREE, 550, "Init"),))
    result = replay([a, b, c], cores=2, interpreter_lock=True, lock_handoff_ns=1000)
    assert result.finish_ns == {"a": 1100, "b": 561, "c": 551}
    assert result.lock_sleeps == 1


def test_landings_vary_around_the_hand_off_and_replay_alike():
    """With the jitter (replay.WAKE_JITTER_CV) the landings differ from take to take,
    around the hand-off on average, and the same traces still replay to the same
    makespan (the jitter is seeded)."""
    step = VmTrace("t", (Step(CPU, 1000, "Init", events=1),))
    runs = [replay(replicate(step, 64), cores=64, interpreter_lock=True,
                   lock_handoff_ns=1000) for _ in range(2)]
    assert runs[0] == runs[1]
    landings = np.diff(sorted(runs[0].finish_ns.values())) - 1000
    assert landings.std() > 100 and abs(landings.mean() - 1000) < 150


def test_the_guests_stretches_grow_by_the_guest_work_factor():
    """A guest's stretch takes guest_work_factor times its traced time, on its core,
    with or without the interpreter lock; the work under the lock does not."""
    trace = VmTrace("t", (Step(FREE, 1000, "Init"), Step(CPU, 100, "Init", events=1)))
    for locked in (False, True):
        grown = replay([trace], cores=1, interpreter_lock=locked, guest_work_factor=1.5)
        assert grown.makespan_ns == 1500 + 100 and grown.core_ns == 1600


def test_fv_degrades_with_vms_and_pv_does_not_on_the_paper_profile():
    fv = trace_from_row({"vm": "fv", "phase_counters": {"Init": FV_INIT}}, XEN, True)
    pv_counts = {"exits.mmio.bar0.write": 40, "hcall.calls": 56, "hcall.entries": 2400,
                 "hcall.set_pgd": 3, "pv.pts_allocated": 3, "pfifo.doorbells": 2,
                 "engine.busy_ns": 10000}
    pv = trace_from_row({"vm": "pv", "phase_counters": {"Init": pv_counts}}, XEN, True)
    slow = {t.name: replay(replicate(t, 8), cores=8).makespan_ns / t.alone_ns for t in (fv, pv)}
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


def test_the_emulator_fit_recovers_known_costs():
    rng = np.random.default_rng(3)
    truth = {"trap_ns": 30000.0, "io_exit_ns": 50000.0, "pte_scanned_ns": 20.0,
             "mmio_native_ns": 25000.0}
    rows = []
    for i in range(12):
        for mode in ("fv", "native"):
            counts = {"exits.mmio.bar0.write": int(rng.integers(100, 5000)),
                      "exits.io": int(rng.integers(1, 40)),
                      "shadow.ptes_scanned": int(rng.integers(0, 400000)) if mode == "fv" else 0}
            mediated = mode == "fv"
            wall = (counts["exits.mmio.bar0.write"]
                    * truth["trap_ns" if mediated else "mmio_native_ns"]
                    + counts["exits.io"] * truth["io_exit_ns"]
                    + counts["shadow.ptes_scanned"] * truth["pte_scanned_ns"])
            rows.append({"scenario": f"s{i}", "mode": mode, "rep": 0, "vm": "vm",
                         "passed": True, "start_s": 0.0, "phase_counters": {"Init": counts},
                         "wall_ns": {"Init": int(wall)}})
    fit = emulator.fit_event_costs(rows)
    for key, value in truth.items():
        assert fit[key] == pytest.approx(value, rel=1e-3), key
    assert fit["hypercall_ns"] == 0.0  # nothing exercised it


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
    many = replay(replicate(trace, 64), cores=8)
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
    points = points_for(exp, (1, 3, 16), ("xen-2014",), cores=2)
    serial = run_sweep(exp, points, traces)
    assert len(serial) == 2 * 2 * 3
    assert run_sweep(exp, points, traces, dask="local") == serial
    slowdowns = {(r["mode"], r["vms"]): r["makespan_ns"] / r["alone_ns"] for r in serial}
    assert slowdowns[("pv", 16)] > slowdowns[("pv", 1)] == 1.0


def test_a_thread_that_slept_past_the_wake_curves_knee_lands_later(steady_wakes):
    """Four VMs each holding the lock 1 us: the second sleeps 1 us, inside the window
    where waking costs nothing extra (a measured curve: 0 ns more up to 2 us asleep, 50
    ns past it), and lands the plain hand-off later; the third and fourth sleep 2.1 and
    3.25 us, past it, and each lands 50 ns later still -- off their cores' count."""
    from dataclasses import replace

    from gpuvm.experiment.costs import load_costs
    step = VmTrace("t", (Step(CPU, 1000, "Init", events=3),))
    curve = replace(load_costs("emulator"), wake_slept_ns=(2_000.0, 2_001.0),
                    wake_latency_ns=(0.0, 50.0))
    plain = replay(replicate(step, 4), cores=8, interpreter_lock=True, lock_handoff_ns=100)
    late = replay(replicate(step, 4), cores=8, interpreter_lock=True, lock_handoff_ns=100,
                  wake_extra_ns=curve.wake_extra_ns)
    assert plain.makespan_ns == 1000 + 3 * (1000 + 100)
    assert late.makespan_ns == plain.makespan_ns + 2 * 50
    assert late.core_ns == plain.core_ns


def test_two_vms_replay_alike_on_two_cores_and_on_sixteen():
    """A VM's steps run one after another, each on at most one core, so N VMs never keep
    more than N busy: gpuvm.calibrate.validation.fit_cores replays its 2-VM points on
    one and two cores only.  One core is another matter."""
    trace = VmTrace("t", (Step(FREE, 700, "Init"), Step(CPU, 1000, "Init", events=2),
                          Step(ENGINE, 500, "Launch"), Step(FREE, 300, "Close")))
    runs = {c: replay(replicate(trace, 2), cores=c, interpreter_lock=True,
                      lock_handoff_ns=50) for c in (1, 2, 3, 16)}
    assert runs[2].makespan_ns == runs[3].makespan_ns == runs[16].makespan_ns
    assert runs[1].makespan_ns > runs[2].makespan_ns


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


class _ResourceHolders:
    """replay's holders as simpy.Resource itself: every take a Request, every give a
    release -- what the replay used before its own, event-free holders."""

    def __init__(self, env, capacity: int) -> None:
        self.resource = simpy.Resource(env, capacity=capacity)

    def take(self):
        return self.resource.request()

    @property
    def free(self) -> int:
        return self.resource.capacity - self.resource.count

    def give(self) -> None:
        self.resource.release(self.resource.users[0])


def test_recorded_traces_replay_as_they_did_on_simpy_resource():
    """fv-opt and pv traces of a lent-machine bundle behind the interpreter lock, 2 VMs
    on 2 cores and 8 on 8: the same makespans, finishes, sleeps and core time as with
    simpy.Resource.  (Only at one instant can the two differ: a free holder is taken at
    once, where a Resource's taker resumed a turn later -- replay._Holders.)  8 VMs on 2
    cores within 1.5%: there threads queue for cores all the time, and whether a woken
    one finds a core idle (and lands on it) or queues is read at that instant."""
    from dataclasses import replace

    from gpuvm.calibrate import validation
    from gpuvm.calibrate.emulator import replayed_from_traces

    measured, _, _ = validation.load(Path(__file__).parent / "data"
                                     / "validation-h200-own-handoff")
    profile = replace(load_costs("emulator"), interpreter_lock=True, lock_handoff_ns=12_000)
    traces = {m.mode: m.trace for m in validation.fastest(measured)}

    def runs(vms_on_cores):
        return [(r.makespan_ns, r.finish_ns, r.lock_sleeps, r.core_ns)
                for r in (replayed_from_traces(mode, n, trace,
                                               replace(profile, host_cores=float(cores)))
                          for mode, trace in sorted(traces.items())
                          for n, cores in vms_on_cores)]
    ours, ours_crowded = runs([(2, 2), (8, 8)]), runs([(8, 2)])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(replay_module, "_Holders", _ResourceHolders)
        assert runs([(2, 2), (8, 8)]) == ours
        for theirs, mine in zip(runs([(8, 2)]), ours_crowded):
            assert theirs[0] == pytest.approx(mine[0], rel=0.015)
