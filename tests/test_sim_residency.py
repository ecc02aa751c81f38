"""VRAM oversubscription in the model: residency switches priced by the cost profile,
thrashing under fine-grained fair share (BAND), one switch per turn under an exclusive
time quantum (QUANTUM)."""

from __future__ import annotations

import pytest

from gpuvm.device import regs
from gpuvm.experiment.costs import load_costs
from gpuvm.sim.stream_replay import VmStream, replay
from gpuvm.sim.residency import (COUNTER_NAMES, ResidencyCosts, ResidencyError,
                                 ResidencyModel, residency_for)
from scheduler import SchedulerConfig, SchedulerParams

MiB = regs.MiB
PAGE = regs.SMALL_PAGE
XEN = load_costs("xen-2014")


def test_a_switch_evicts_the_least_recently_run_and_brings_back_only_evicted_pages():
    r = ResidencyModel(100 * MiB, ResidencyCosts(switch_ns=1000, page_ns=10, byte_ns=0.5))
    for vm in "ABC":
        r.add_vm(vm, 40 * MiB)
    assert r.make_resident("A") == 0 and r.make_resident("B") == 0  # fresh pages, room
    # C needs 40 MiB, 20 are free: 20 MiB of A (run least recently) go out
    out = 20 * MiB // PAGE
    assert r.make_resident("C") == 1000 + out * 10 + int(20 * MiB * 0.5)
    assert r.counters["A"].residency_pages_out == out and r.resident_pages("B") == 40 * MiB // PAGE
    assert r.make_resident("C") == 0  # already resident: no switch
    # A comes back: its 20 evicted MiB are copied in, B (older than C) makes room
    r.make_resident("A")
    assert r.counters["A"].residency_pages_in == out
    assert r.counters["B"].residency_pages_out == out and r.counters["C"].residency_pages_out == 0
    for c in r.counters.values():
        assert c.residency_bytes == (c.residency_pages_in + c.residency_pages_out) * PAGE
    assert sum(c.residency_switches for c in r.counters.values()) == 2
    r.remove_vm("A")
    assert r.free_frames == r.frames - r.resident_pages("B") - r.resident_pages("C")


def test_a_working_set_larger_than_the_gpu_is_one_clear_error():
    r = residency_for(XEN, 64 * MiB)
    with pytest.raises(ResidencyError, match=r"^big: working set of 65.0 MiB exceeds the "
                                             r"GPU's 64.0 MiB of VRAM$"):
        r.add_vm("big", 65 * MiB)
    stream = VmStream("big", (("d", 1000), ("w", 1000)), working_set_bytes=65 * MiB)
    with pytest.raises(ResidencyError, match="big: working set"):
        replay([stream], residency=residency_for(XEN, 64 * MiB))


def gpu_bound(name: str, kernels: int = 200, kernel_ns: int = 2_000_000,
              gap_ns: int = 20_000, working_set: int = 75 * MiB) -> VmStream:
    """Launch and synchronise: a short host step, then a kernel, `kernels` times."""
    entries = (("x", 1, gap_ns, -1), ("d", kernel_ns), ("w", kernel_ns)) * kernels
    return VmStream(name, entries, working_set_bytes=working_set)


def run(policy: str, vram: int = 100 * MiB, working_set: int = 75 * MiB):
    config = SchedulerConfig(policy, SchedulerParams(quantum_ns=100_000_000))
    streams = [gpu_bound("A", working_set=working_set), gpu_bound("B", working_set=working_set)]
    return replay(streams, scheduler=config, residency=residency_for(XEN, vram))


def totals(result) -> dict[str, int]:
    return {k: sum(c[k] for c in result.residency.values()) for k in COUNTER_NAMES}


def test_band_thrashes_an_oversubscribed_gpu_and_the_quantum_does_not():
    band, quantum = run("band"), run("quantum")
    b, q = totals(band), totals(quantum)
    # BAND alternates the two VMs kernel by kernel: nearly every dispatch is a switch
    assert b["residency_switches"] > 100
    # the quantum (100 ms = 50 kernels) hands over at most once a quantum
    assert 1 <= q["residency_switches"] <= quantum.makespan_ns // 100_000_000 + 1
    assert q["residency_pages_in"] * 10 < b["residency_pages_in"]
    assert q["residency_pages_out"] * 10 < b["residency_pages_out"]
    for t in (b, q):
        assert t["residency_bytes"] == (t["residency_pages_in"] + t["residency_pages_out"]) * PAGE
    # ...and the pages moved are time on the engine
    assert quantum.makespan_ns < band.makespan_ns
    engine_ns = 2 * 200 * 2_000_000
    assert band.makespan_ns >= engine_ns + b["residency_switch_ns"]
    assert quantum.makespan_ns >= engine_ns + q["residency_switch_ns"]


def test_with_room_for_both_nothing_moves_and_both_policies_take_the_engine_time():
    for policy in ("band", "quantum"):
        result = run(policy, vram=160 * MiB)
        assert totals(result)["residency_switches"] == 0
        assert totals(result)["residency_pages_in"] == 0
        assert result.makespan_ns == pytest.approx(2 * 200 * 2_000_000, rel=0.01)


def test_the_oversubscribed_replay_is_deterministic():
    assert run("band") == run("band")
    assert run("quantum") == run("quantum")
