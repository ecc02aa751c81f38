"""The virtual device clock (issue 12): device time follows modelled progress only, so a
scheduling result is the same whatever the host's load.

The unit tests drive the clock's parties by hand; the end-to-end test runs a short BAND
scenario of two real guests twice, the second time beside a CPU-bound process, and
compares what the scheduler recorded (virtual device time), never wall timings."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from gpuvm.device.clock import DeviceClock, VirtualClock
from gpuvm.experiment.config import ConfigError, Experiment, ScenarioConfig, VmConfig, parse
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import rows_for, specs_for
from gpuvm.experiment.report import shares_in_window
from gpuvm.experiment.rundir import config_hash
from gpuvm.mediator.submission import Submissions, WatchdogLimits
from gpuvm.run import run_vms
from gpuvm.run.spec import RunError, RunOptions, VmSpec, device_clock
from gpuvm.vmm import vfio_attach
from gpuvm.vmm.guest_session import GuestSession
from gpuvm.vmm.kvm import kvm_usable
from scheduler import FifoPolicy

from waiting import wait_for


# ----------------------------------------------------------------------- the clock alone
def test_time_jumps_to_the_earliest_timer_when_no_guest_runs():
    clock = VirtualClock()
    woken = []
    engine = clock.timer("engine", lambda: woken.append("engine"))
    sched = clock.timer("scheduler", lambda: woken.append("scheduler"))
    sched.set_alarm(500_000)
    engine.set_alarm(2_000_000)
    assert clock.now_ns() == 500_000 and woken == ["scheduler"]
    sched.set_alarm(None)
    assert clock.now_ns() == 2_000_000 and woken[-1] == "engine"
    engine.set_alarm(None)
    assert clock.now_ns() == 2_000_000  # nothing left to wait for: time stands still


def test_a_running_guest_holds_time_back_until_its_exits_catch_up():
    clock = VirtualClock(exit_ns=10_000)
    engine = clock.timer("engine")
    guest = clock.guest("A")
    engine.set_alarm(25_000)
    assert clock.now_ns() == 0  # the guest may still ring a doorbell before 25 us
    guest.tick()
    guest.tick()
    assert clock.now_ns() == 20_000
    guest.tick()
    assert clock.now_ns() == 25_000  # past the engine's alarm: the engine goes first


def test_a_sleeping_guest_wakes_at_the_device_time_of_the_signal():
    clock = VirtualClock(exit_ns=1_000)
    engine = clock.timer("engine")
    guest = clock.guest("A")
    guest.tick()
    engine.set_alarm(2_000_000)  # its kernel ends at 2 ms
    guest.block(guest.generation())
    assert clock.now_ns() == 2_000_000  # nothing else can happen earlier
    clock.signal()
    engine.set_alarm(None)
    assert not guest.blocked and guest.v == 2_000_000
    assert clock.now_ns() == 2_000_000  # the woken guest holds time at its wake-up


def test_a_signal_between_looking_and_sleeping_is_not_lost():
    clock = VirtualClock()
    guest = clock.guest("A")
    generation = guest.generation()  # the guest reads the generation, looks: not done
    clock.signal()  # the GPU signals before the guest went to sleep
    guest.block(generation)
    assert not guest.blocked  # it looks again instead of sleeping through its event


def test_a_signal_wakes_the_thread_of_each_guest_it_wakes_and_no_other():
    """A woken guest's thread sleeps on its own device's interrupt, which another VM's
    completion does not raise: the clock must make it look, or the guest -- awake in
    virtual time -- holds device time back until its wait looks again by itself."""
    clock = VirtualClock()
    gpu, other_gpu = object(), object()
    looked: list[str] = []
    asleep, running, elsewhere = (clock.guest(name, scope=scope)
                                  for name, scope in (("asleep", gpu), ("running", gpu),
                                                      ("elsewhere", other_gpu)))
    for guest in (asleep, running, elsewhere):
        guest.waker = lambda name=guest.name: looked.append(name)
    asleep.block(asleep.generation())
    elsewhere.block(elsewhere.generation())
    clock.signal(gpu)
    assert looked == ["asleep"]
    assert not asleep.blocked and elsewhere.blocked


def test_a_wait_looks_again_when_told_without_an_interrupt(monkeypatch):
    """`look_again` (the clock's waker for a guest's wait) ends a device wait whose
    predicate came true without an interrupt.  The wait's own next look is an hour away
    and its timeout 30 s: without the nudge it would look again only then (a liveness
    bound with a 3x margin, not a speed target)."""
    monkeypatch.setattr(vfio_attach, "WAIT_SLICE_S", 3600.0)
    attached = vfio_attach.AttachedDevice(None, None, {}, {},
                                          irq_fd=os.eventfd(0, os.EFD_NONBLOCK))
    done = threading.Event()

    def finish() -> None:
        time.sleep(0.05)
        done.set()
        attached.look_again()
    threading.Thread(target=finish).start()
    started = time.monotonic()
    try:
        assert attached.wait_event(done.is_set, timeout=30.0)
        assert time.monotonic() - started < 10.0
    finally:
        os.close(attached.irq_fd)
        attached.irq_fd = -1
    attached.look_again()  # once detached: nothing to write to, no error


def test_a_guest_session_on_the_clock_has_its_waits_woken_by_the_clock():
    attached = vfio_attach.AttachedDevice(None, None, {}, {})
    session = GuestSession("A", None, attached, hostmem=object())
    clock = VirtualClock()
    party = clock.guest("A")
    session.use_clock(party)
    assert party.waker == attached.look_again


def test_a_pending_event_holds_time_until_it_is_handled():
    clock = VirtualClock()
    sched = clock.timer("scheduler")
    guest = clock.guest("A")
    for _ in range(5):
        guest.tick()
    sched.pending(guest.v)  # a doorbell rung at the guest's time
    guest.block(guest.generation())
    assert clock.now_ns() == 5 * clock.exit_ns
    sched.update([5 * clock.exit_ns], alarm=None)
    assert clock.now_ns() == 5 * clock.exit_ns  # handled; nothing else to do


def test_the_virtual_clock_is_the_default_isolated_vms_too():
    assert not DeviceClock().virtual
    assert device_clock(RunOptions()).virtual
    assert device_clock(RunOptions(isolated=True)).virtual
    assert not device_clock(RunOptions(isolated=True, clock="wall")).virtual


def test_an_unknown_clock_is_refused():
    with pytest.raises(RunError, match="clock: unknown device clock 'cpu'"):
        run_vms([VmSpec("A", "idle", [])], RunOptions(mode="fv-opt", clock="cpu"))


def test_experiment_files_choose_the_clock():
    base = '[experiment]\nname = "x"\nkind = "isolation"\n{extra}\n' \
           '[[scenario]]\nname = "s"\n[[scenario.vm]]\nname = "a"\nbenchmark = "idle"\n'
    virtual = parse(base.format(extra=""))
    wall = parse(base.format(extra='clock = "wall"'))
    assert wall.clock == "wall" and virtual.clock == "virtual"
    assert config_hash(wall) != config_hash(virtual)
    with pytest.raises(ConfigError, match="guest_exit_ns: unknown key"):
        parse(base.format(extra='guest_exit_ns = 5000'))
    with pytest.raises(ConfigError, match="experiment.clock: must be one of wall, virtual"):
        parse(base.format(extra='clock = "host"'))


# ------------------------------------------------------------------ real guests, BAND
SCENARIO = ScenarioConfig("2vm", (VmConfig("A", "loop", (2_000_000, 300)),
                            VmConfig("B", "loop", (20_000_000, 25), start_s=0.1)))
EXP = Experiment("t", "isolation", (SCENARIO,), clock="virtual")
BACKEND = "kvm" if kvm_usable()[0] else "inproc"


def band_run():
    options = RunOptions(mode="fv-opt", backend=BACKEND, clock="virtual",
                         scheduler={"policy": "band", "period_ms": 30, "band_wait_us": 500})
    results = run_vms(specs_for(SCENARIO), options)
    assert all(r.passed for r in results), [r.error() for r in results]
    rows = rows_for(EXP, SCENARIO, "fv-opt", "band", 0, results, load_costs("xen-2014"))
    return rows, shares_in_window(rows)


def test_band_shares_do_not_move_with_host_load():
    quiet_rows, (quiet_window, quiet) = band_run()
    hog = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        loaded_rows, (_, loaded) = band_run()
        assert hog.poll() is None  # it really ran beside the second run
    finally:
        hog.kill()
        hog.wait()
    assert quiet_window[1] - quiet_window[0] > 200_000_000  # both VMs competed a while
    for q, h in zip(quiet, loaded):
        assert abs(q.utilisation - h.utilisation) < 0.01, (q, h)
        assert abs(q.utilisation - q.share) < 0.15, q  # BAND holds both near their share
    for q, h in zip(quiet_rows, loaded_rows):  # the same work, charged the same GPU time
        assert q.sched["completions"] == h.sched["completions"]
        assert abs(q.sched["gpu_time_ns"] - h.sched["gpu_time_ns"]) <= \
            0.01 * q.sched["gpu_time_ns"]


# ------------------------------------------------------------- the watchdog, virtually
class StuckGpu:
    """A GPU port on a virtual clock whose rung work never completes."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.rung: list[int] = []

    def now_ns(self) -> int:
        return self.clock.now_ns()

    def ring(self, pchid: int, put: int) -> None:
        self.rung.append(pchid)

    def runnable(self, pchid: int) -> bool:
        return True


def watched(clock: VirtualClock, limits: WatchdogLimits):
    killed: list[tuple[int, str, float]] = []
    sub = Submissions(StuckGpu(clock), FifoPolicy(),
                      lambda pchid, reason: killed.append((pchid, reason, time.monotonic())),
                      limits, clock=clock)
    vm = object()
    sub.add_vm(vm, 1.0)
    return sub, vm, killed


def test_virtual_watchdog_cuts_off_at_exactly_its_device_time():
    clock = VirtualClock()
    sub, vm, killed = watched(clock, WatchdogLimits(submission_ns=50_000_000))
    try:
        sub.submit(vm, 3, 1)
        assert wait_for(lambda: killed)  # nothing else happens: time jumps to the limit
        assert killed[0][0] == 3 and "held the GPU 50 ms" in killed[0][1]
        assert sub.used(vm) == 50_000_000  # charged exactly the limit, on every host
    finally:
        sub.close()


def test_virtual_watchdog_catches_a_stopped_clock_in_wall_seconds_only_if_guests_sleep():
    clock = VirtualClock()
    guest = clock.guest("A")
    guest.block(guest.generation())
    sub, vm, killed = watched(clock, WatchdogLimits(submission_ns=300_000_000,
                                                    wall_floor_s=0.2))
    stuck = clock.timer("stuck")  # something that never lets device time past 1 ms
    stuck.set_alarm(1_000_000)
    try:
        t0 = time.monotonic()
        sub.submit(vm, 5, 1)
        assert wait_for(lambda: sub.dispatcher.running is not None)
        guest.unblock()
        time.sleep(0.8)
        assert not killed  # a running guest may be what holds time back: not a hang
        guest.block(guest.generation())
        assert wait_for(lambda: killed)
        assert "wall time with every guest asleep" in killed[0][1]
        assert killed[0][2] - t0 >= 0.3
        assert clock.now_ns() == 1_000_000
    finally:
        sub.close()
        stuck.leave()


