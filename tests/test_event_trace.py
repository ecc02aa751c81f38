"""Per-event traces: what the recorder keeps of a real run, how the model replays them
(the interpreter lock, off-lock time, blocked handlers), and the fits made from them."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpuvm.calibrate import emulator, validation
from gpuvm.experiment.config import Scenario, VmConfig
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import specs_for
from gpuvm.run import run_vms
from gpuvm.run.spec import RunOptions
from gpuvm.sim.replay import (CPU, FREE, SLEEP, Step, VmTrace, event_steps, replay,
                              replicate)
from gpuvm.vmm import abi
from gpuvm.vmm.event_trace import PORT_BASE, EventTrace, class_name

XEN = load_costs("xen-2014")


def _run(mode: str, record: bool):
    scenario = Scenario("t", (VmConfig("vm", "mmul", (64,)),))
    (result,) = run_vms(specs_for(scenario), RunOptions(mode=mode, record_events=record))
    assert result.passed, result.error()
    return result


@pytest.mark.parametrize("mode", ["fv-opt", "pv"])
def test_a_recorded_trace_accounts_for_every_counted_event_in_its_phase(mode):
    result = _run(mode, record=True)
    trace = result.session.recorder.trace()
    assert len(trace) > 10 and (trace.handler_ns >= 0).all() and (trace.gap_ns >= 0).all()
    for phase in result.session.phases:
        index = abi.PHASE_NAMES.index(phase.name)
        in_phase = trace.phase == index
        for name, count in phase.counters.items():
            if name.startswith(("exits.", "shadow.syncs", "shadow.ptes_scanned", "hcall.calls",
                                "hcall.entries", "pfifo.doorbells")):
                # the phase mark itself is the one port exit recorded in the phase before
                slack = 1 if name == "exits.io" else 0
                got = int(trace.counter(name)[in_phase].sum())
                assert abs(got - count) <= slack, (phase.name, name, got, count)
    # each run is one class of event, and MMIO runs hold exactly their exits
    bar = trace.code < PORT_BASE
    mmio = sum(trace.counter(n) for n in trace.names if n.startswith("exits.mmio."))
    assert (mmio[bar] == trace.events[bar]).all()
    # the engine thread's time on the VM's channels is recorded beside its counters
    # (VMs as threads: the model puts it on the interpreter lock)
    from gpuvm.vfio.user.protocol import SERVER_ENGINE_COUNTER
    assert trace.counter(SERVER_ENGINE_COUNTER).sum() > 0
    assert {class_name(int(c)) for c in trace.code} >= {"port.wait", "port.phase", "bar0.write"}


class _Clocked:
    """A session whose time is a counter: handlers, counter reads and the guest between
    events each take a known number of ns."""

    def __init__(self) -> None:
        self.now = 0
        self.cpu = 0  # the recording thread's CPU time
        self.counts = {"exits.mmio.bar0.write": 0, "exits.mmio.bar0.read": 0, "exits.io": 0}
        self.device, self.port_out = self, self._port_out

    def clock(self) -> int:
        return self.now

    def cpu_clock(self) -> int:
        return self.cpu

    def snapshot(self) -> dict[str, int]:
        self.now += 7 + self.lock_wait  # reading the counters: 7 ns of work, and a wait
        self.cpu += 7
        return dict(self.counts)

    lock_wait = 0

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        self.now += 100
        self.counts["exits.mmio.bar0.write"] += 1

    def read(self, region: int, offset: int, size: int) -> int:
        self.now += 50
        return 0

    def _port_out(self, port: int, value: int) -> bool:
        self.now += 1000
        return False


GUEST = [300, 20, 5000, 1, 80, 4000, 60, 900]  # the guest's time before each event
HANDLERS = 3 * 100 + 3 * 50 + 2 * 1000  # its events' handlers: writes, reads, phase marks


def _play(session: _Clocked, recorder) -> EventTrace:
    """Run the guest of GUEST through `recorder` installed on `session`: writes and
    reads in turn, a phase mark at the 4th and 7th event."""
    recorder.install(session)
    recorder.begin()
    for i, ns in enumerate(GUEST):
        session.now += ns
        if i in (3, 6):
            session.port_out(abi.PORT_PHASE, 1)
        elif i % 2:
            session.device.read(0, 0, 4)
        else:
            session.device.write(0, 0, 4, 1)
    return recorder.trace()


@pytest.mark.parametrize("lock_wait", [0, 30])
def test_the_recorded_runs_account_for_every_ns_between_the_first_and_last_event(lock_wait):
    """...but for the recorder's own work: a counter read's CPU time (a wait in it
    stays, as the handler's)."""
    from gpuvm.vmm.event_trace import EventRecorder
    session = _Clocked()
    session.lock_wait = lock_wait
    recorder = EventRecorder(session.snapshot, clock=session.clock,
                             cpu_clock=session.cpu_clock)
    trace = _play(session, recorder)
    assert int(trace.gap_ns.sum()) == sum(GUEST)  # the guest's time, whatever class follows
    # each run's close read the counters once: its 7 ns of work left out, its wait kept
    assert int(trace.handler_ns.sum()) == HANDLERS + lock_wait * len(trace)


def test_a_remote_counter_read_adds_only_its_wait_for_the_vms_own_channels():
    """Over vfio-user a counter read is a round trip the unrecorded run never makes:
    only a read slower than the run's median can be a wait, and only for as long as the
    server ran the VM's channels meanwhile (what the guest's next access would have
    waited for); the rest is wake-up jitter."""
    from gpuvm.vfio.user.protocol import SERVER_ENGINE_COUNTER
    from gpuvm.vmm.event_trace import EventRecorder
    session = _Clocked()
    waits = iter([40, 0, 900, 0, 0, 10, 0, 0])  # one per run: 8 runs
    channels = iter([1000, 0, 500, 0, 0, 0, 0, 0])  # the server on the VM's channels
    engine = 0

    def remote_snapshot() -> dict[str, int]:
        nonlocal engine
        session.now += 300 + next(waits)  # a round trip, and what the server kept it
        engine += next(channels)
        return dict(session.counts) | {SERVER_ENGINE_COUNTER: engine}
    recorder = EventRecorder(remote_snapshot, clock=session.clock,
                             cpu_clock=session.cpu_clock, remote_counters=True)
    trace = _play(session, recorder)
    assert int(trace.gap_ns.sum()) == sum(GUEST)
    # the median read waited 0: 40 more (channels ran 1000) is a wait; of 900, the
    # channels' 500; 10 with no channels running is jitter
    assert int(trace.handler_ns.sum()) == HANDLERS + 40 + 500


def test_nothing_is_recorded_unless_asked():
    assert _run("pv", record=False).session.recorder is None


def _trace(rows: list[tuple[int, int, int, int, dict[str, int]]],
           in_kvm_run: float = 1.0) -> EventTrace:
    """(code, events, handler_ns, gap_ns, deltas) per run, all in Init; `in_kvm_run` of
    each gap spent inside KVM_RUN."""
    names = tuple(sorted({k for *_, d in rows for k in d}))
    return EventTrace(np.array([r[0] for r in rows]), np.zeros(len(rows), dtype=np.int64),
                      np.array([r[1] for r in rows]), np.array([r[2] for r in rows]),
                      np.array([r[3] for r in rows]),
                      np.array([int(r[3] * in_kvm_run) for r in rows]), names,
                      np.array([[d.get(n, 0) for n in names] for *_, d in rows],
                               dtype=np.int64).reshape(len(rows), len(names)))


def test_the_interpreter_lock_serialises_python_work_but_not_the_guests_time():
    python = VmTrace("p", (Step(CPU, 1000, "Init"),))
    guest = VmTrace("g", (Step(FREE, 1000, "Init"),))
    asleep = VmTrace("s", (Step(SLEEP, 1000, "Init"),))
    assert replay(replicate(python, 4), cores=8).makespan_ns == 1000
    assert replay(replicate(python, 4), cores=8, interpreter_lock=True).makespan_ns == 4000
    assert replay(replicate(guest, 4), cores=8, interpreter_lock=True).makespan_ns == 1000
    assert replay(replicate(guest, 4), cores=2, interpreter_lock=True).makespan_ns == 2000
    assert replay(replicate(asleep, 4), cores=1, interpreter_lock=True).makespan_ns == 1000


def test_recorded_times_replay_the_trace_and_a_blocked_handler_holds_nothing():
    costs = replace(XEN, trap_ns=10_000.0, trap_mediator_ns=0.0, exit_free_ns=0.0,
                    recorded_times=1.0, interpreter_lock=1.0)
    # 100 traps that took 1 ms in their handlers (priced at 10 us each) and 2 ms between
    # them, then one trap whose handler waited 5 ms on another thread
    trace = _trace([(1, 100, 1_000_000, 2_000_000, {"exits.mmio.bar0.write": 100}),
                    (1, 1, 5_000_000, 0, {"exits.mmio.bar0.write": 1})])
    steps = event_steps(trace, costs, mediated=True)
    total = {r: sum(s.ns for s in steps if s.resource == r) for r in (CPU, FREE, SLEEP)}
    assert total == {CPU: 1_010_000, FREE: 2_000_000, SLEEP: 4_990_000}
    one = VmTrace("vm", tuple(steps))
    assert replay([one], cores=2, interpreter_lock=True).makespan_ns == one.alone_ns


def test_the_engine_running_a_threaded_vms_channels_holds_the_lock_it_waited_on():
    """VMs as threads of one process: the engine thread's time on a VM's channels
    (recorded as server.engine_ns) holds the interpreter lock every VM needs -- taken from
    the time the VM's handler waited, then from its time between events."""
    from gpuvm.vfio.user.protocol import SERVER_ENGINE_COUNTER
    costs = replace(XEN, trap_ns=10_000.0, trap_mediator_ns=0.0, exit_free_ns=0.0,
                    recorded_times=1.0, interpreter_lock=1.0)
    # the handler waited 5 ms, of which the engine ran the VM's channels 3 ms; then
    # 2 ms of channels while the guest ran 1 ms between events: 1 ms of it from there
    rows = [(1, 1, 5_000_000, 0, {"exits.mmio.bar0.write": 1, SERVER_ENGINE_COUNTER: 3_000_000}),
            (1, 1, 10_000, 1_000_000, {"exits.mmio.bar0.write": 1,
                                        SERVER_ENGINE_COUNTER: 2_000_000})]
    steps = event_steps(_trace(rows), costs, mediated=True)
    total = {r: sum(s.ns for s in steps if s.resource == r) for r in (CPU, FREE, SLEEP)}
    assert total == {CPU: 20_000 + 3_000_000 + 1_000_000, FREE: 0, SLEEP: 1_990_000}
    untold = event_steps(_trace([(c, n, h, g, {k: v for k, v in d.items()
                                              if k != SERVER_ENGINE_COUNTER})
                                 for c, n, h, g, d in rows]), costs, mediated=True)
    two = [replay(replicate(VmTrace("vm", tuple(s)), 2), cores=8, interpreter_lock=True)
           for s in (steps, untold)]
    # alone the same time; two VMs wait for each other's channels
    assert VmTrace("a", tuple(steps)).alone_ns == VmTrace("b", tuple(untold)).alone_ns
    assert two[0].makespan_ns > two[1].makespan_ns


def test_the_exit_loop_between_handlers_holds_the_lock_and_kvm_run_does_not():
    costs = replace(XEN, trap_ns=10_000.0, trap_mediator_ns=0.0, exit_free_ns=0.0,
                    recorded_times=1.0, interpreter_lock=1.0)
    # 1 ms of handlers, 2 ms between them of which a quarter was Python around KVM_RUN
    trace = _trace([(1, 100, 1_000_000, 2_000_000, {"exits.mmio.bar0.write": 100})],
                   in_kvm_run=0.75)
    steps = event_steps(trace, costs, mediated=True)
    total = {r: sum(s.ns for s in steps if s.resource == r) for r in (CPU, FREE, SLEEP)}
    assert total == {CPU: 1_500_000, FREE: 1_500_000, SLEEP: 0}
    in_kvm = event_steps(_trace([(1, 100, 1_000_000, 2_000_000,
                                  {"exits.mmio.bar0.write": 100})]), costs, mediated=True)

    def two(s):
        return replay(replicate(VmTrace("vm", tuple(s)), 2), cores=8,
                      interpreter_lock=True).makespan_ns
    # the lock serialises 1.5 ms of each VM's 3 ms instead of 1 ms
    assert two(steps) - 3_000_000 > two(in_kvm) - 3_000_000 > 0


def test_a_kvm_run_records_its_time_inside_kvm_run():
    trace = _run("fv-opt", record=True).session.recorder.trace()
    if trace.guest_ns.sum() == 0:  # the in-process backend has no KVM_RUN
        pytest.skip("in-process backend: no time inside KVM_RUN")
    assert (trace.guest_ns >= 0).all() and (trace.guest_ns <= trace.gap_ns).all()
    assert 0 < trace.guest_ns.sum() < trace.gap_ns.sum()


def test_the_trace_fit_recovers_known_costs():
    rng = np.random.default_rng(5)
    truth = {"trap": 20_000, "entry": 300, "pte": 40, "wait": 700_000, "free": 30_000}
    rows = []
    for _ in range(60):
        traps, entries, ptes = (int(x) for x in rng.integers([1, 0, 0], [500, 600, 90_000]))
        counts = {"exits.mmio.bar3.write": traps, "hcall.entries": entries,
                  "shadow.ptes_scanned": ptes}
        handler = traps * truth["trap"] + entries * truth["entry"] + ptes * truth["pte"]
        rows.append((7, traps, handler, traps * truth["free"], counts))
    rows.append((PORT_BASE + abi.PORT_WAIT, 1, truth["wait"] + 5000, 0,
                 {"port.wait": 1, "exits.io": 1, "engine.busy_ns": 5000}))
    costs = emulator.fit_trace_costs([("fv", {"events": _trace(rows)})])
    assert costs["exit_free_ns"] == pytest.approx(truth["free"])
    assert costs["trap_ns"] == pytest.approx(truth["trap"] + truth["free"], rel=1e-6)
    assert costs["hcall_entry_ns"] == pytest.approx(truth["entry"], rel=1e-6)
    assert costs["pte_scanned_ns"] == pytest.approx(truth["pte"], rel=1e-6)
    assert costs["wait_ns"] + costs["io_exit_ns"] - costs["exit_free_ns"] == \
        pytest.approx(truth["wait"], rel=1e-6)


def _measured(makespan_2vm_ms: float) -> list[validation.Measured]:
    # one VM: 10 ms of handler (lock) and 30 ms of guest time, in 40 runs
    trace = {"events": _trace([(1, 1, 250_000, 750_000, {"exits.mmio.bar0.write": 1})] * 40)}
    return [validation.Measured("fv", 1, 0, 40_000_000, trace),
            validation.Measured("fv", 2, 0, int(makespan_2vm_ms * 1e6), trace)]


def test_host_cores_come_from_the_two_vm_runs_and_ties_keep_the_most():
    profile = replace(XEN, recorded_times=1.0, interpreter_lock=1.0, trap_ns=1e9)
    serial = validation.fit_cores(_measured(80.0), profile, most=8)
    assert serial.host_cores == 1  # two VMs took twice one: they shared one core
    parallel = validation.fit_cores(_measured(50.0), profile, most=8)
    assert parallel.host_cores == 8  # 2..8 predict alike for 2 VMs: the most is kept


def test_the_recorders_own_time_comes_off_the_exit_loop_and_no_more():
    """CostProfile.record_event_ns: what recording cost per event, which an unrecorded
    run does not spend, is taken off each run's exit-loop time (gap less KVM_RUN): the
    lock-held part; never below zero, and nothing with none measured."""
    costs = replace(XEN, trap_ns=10_000.0, trap_mediator_ns=0.0, exit_free_ns=0.0,
                    recorded_times=1.0, interpreter_lock=1.0)
    # 100 traps: 1 ms of handlers, 2 ms between them of which 0.5 ms around KVM_RUN
    trace = _trace([(1, 100, 1_000_000, 2_000_000, {"exits.mmio.bar0.write": 100})],
                   in_kvm_run=0.75)

    def totals(record_event_ns: float) -> dict[str, int]:
        steps = event_steps(trace, replace(costs, record_event_ns=record_event_ns),
                            mediated=True)
        return {r: sum(s.ns for s in steps if s.resource == r) for r in (CPU, FREE, SLEEP)}
    assert totals(0.0) == {CPU: 1_500_000, FREE: 1_500_000, SLEEP: 0}
    assert totals(3_000.0) == {CPU: 1_200_000, FREE: 1_500_000, SLEEP: 0}
    # more than the loop took: the loop's time, not the handlers' or the guest's
    assert totals(50_000.0) == {CPU: 1_000_000, FREE: 1_500_000, SLEEP: 0}


def test_the_recorders_cost_is_timed_on_its_own_hot_path():
    """gpuvm.calibrate.record_cost times the recorder as the vCPU loop runs it: a
    recorder whose clock is slower costs that much more per event (four reads)."""
    import time

    from gpuvm.calibrate import record_cost

    def slow_clock() -> int:
        until = time.perf_counter_ns() + 5_000
        while time.perf_counter_ns() < until:
            pass
        return time.perf_counter_ns()

    plain = record_cost.measure(events=2_000, rounds=3)
    slow = record_cost.measure(events=2_000, rounds=3, clock=slow_clock)
    assert plain > 0
    assert slow - plain > 3 * 5_000
    assert record_cost.from_about({}) == 0.0
    assert record_cost.from_about({record_cost.ABOUT_KEY: 2500.0}) == 2500.0
    with pytest.raises(ValueError, match=record_cost.ABOUT_KEY):
        record_cost.from_about({record_cost.ABOUT_KEY: -1})


def test_each_mode_replays_less_its_own_recorder_cost():
    """Measured in place per mode (record_cost.in_situ), the recorder's cost is taken
    off a trace by its key's mode: fv-opt's by fv-opt's, pv-naive's by pv's, any other
    by record_event_ns -- which is also what a mode measured as 0 falls back to."""
    from gpuvm.sim.replay import trace_from_events

    costs = replace(XEN, trap_ns=10_000.0, trap_mediator_ns=0.0, exit_free_ns=0.0,
                    recorded_times=1.0, interpreter_lock=1.0, record_event_ns=1_000.0)
    measured = costs.with_record_costs({"fv": 500.0, "fv-opt": 2_000.0, "pv": 4_000.0})
    assert [measured.record_event_ns_of(m) for m in ("fv", "fv+lazy", "fv-opt", "pv",
                                                     "pv-naive", None)] == \
        [500.0, 500.0, 2_000.0, 4_000.0, 4_000.0, 500.0]
    assert costs.with_record_costs({"pv": 0.0}).record_event_ns_of("pv") == 1_000.0
    # modes sharing a field: the field's own mode is kept, whichever comes last
    shared = costs.with_record_costs({"pv": 3_000.0, "pv-naive": 9_000.0,
                                      "fv+lazy": 7_000.0, "fv": 2_000.0})
    assert (shared.record_event_ns_of("pv"), shared.record_event_ns_of("fv")) == \
        (3_000.0, 2_000.0)
    assert costs.with_record_costs({"pv-naive": 9_000.0}).record_event_ns_of("pv") == 9_000.0
    events = _trace([(1, 100, 1_000_000, 2_000_000, {"exits.mmio.bar0.write": 100})],
                    in_kvm_run=0.75)

    def cpu(mode: str) -> int:
        vm = trace_from_events("vm", {"key": {"mode": mode}, "events": events}, measured,
                               mediated=True)
        return sum(s.ns for s in vm.steps if s.resource == CPU)
    # 1.5 ms of handlers and exit loop, less 100 events' recorder cost
    assert (cpu("fv"), cpu("fv-opt"), cpu("pv")) == (1_450_000, 1_300_000, 1_100_000)


def test_the_recorders_cost_is_measured_in_place(monkeypatch):
    """record_cost.in_situ times recorded against plain runs of real VMs: a recorder
    whose every event costs 100 us more comes out ~100 us an event dearer (on either
    backend: the events are the device accesses it times)."""
    import time

    from gpuvm.calibrate import record_cost
    from gpuvm.vmm.event_trace import EventRecorder

    plain = record_cost.in_situ(["fv-opt"], budget_s=0.0)["fv-opt"]
    add = EventRecorder._add

    def slower(self, t0: int, t1: int) -> None:
        until = time.perf_counter_ns() + 100_000
        while time.perf_counter_ns() < until:
            pass
        add(self, t0, t1)
    monkeypatch.setattr(EventRecorder, "_add", slower)
    slow = record_cost.in_situ(["fv-opt"], budget_s=0.0)["fv-opt"]
    assert slow - plain > 50_000
    assert record_cost.in_situ_from_about({}) == {}
    about = {record_cost.IN_SITU_KEY: {"fv": 2_000.0, "pv": 8_000}}
    assert record_cost.in_situ_from_about(about) == {"fv": 2_000.0, "pv": 8_000.0}
    with pytest.raises(ValueError, match=record_cost.IN_SITU_KEY):
        record_cost.in_situ_from_about({record_cost.IN_SITU_KEY: {"fv": -1}})


def test_the_in_place_recorder_cost_is_taken_only_when_asked(monkeypatch):
    """A bundle's in-place recorder costs reach the analysis only with in_place (the
    `--recorder-cost in-place` choice); by default the timed-apart cost alone."""
    from gpuvm.calibrate import record_cost

    seen = []
    monkeypatch.setattr(validation, "analyse",
                        lambda *a, **kw: seen.append(kw["record_event_in_situ"]))
    aside = validation.AsideMeasures.from_about(
        {record_cost.ABOUT_KEY: 700.0, record_cost.IN_SITU_KEY: {"fv": 2_000.0}})
    aside.analyse([], [], None)
    aside.analyse([], [], None, in_place=True)
    assert seen == [None, {"fv": 2_000.0}]
