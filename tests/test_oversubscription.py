"""Oversubscribed vGPUs: two VMs each given 75% of the usable VRAM finish every benchmark
with correct results while the mediator moves their pages in and out of the shared pool
at each dispatch; a VM whose working set alone is larger than the pool gets one error and
the other VM finishes; BAND, which interleaves the two, moves more pages than QUANTUM,
which lets one keep the GPU.  The parts are checked on their own first."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import layout, regs
from gpuvm.device.layout import pte
from gpuvm.device.profile import load_profile
from gpuvm.device.vram import Vram
from gpuvm.device.write_log import EngineWriteLog
from gpuvm.mediator import mdev_types
from gpuvm.mediator.mediator import HYP_GLOBAL
from gpuvm.mediator.partition import PartitionError, residency_pool_size
from gpuvm.mediator.residency import COUNTERS
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.vmm.backends import kvm_usable
from shadow.frames import BackingStore, FrameTable, OverlayView, ResidentPolicy
from shadow.page_table import ShadowSpace
from shadow.vram_pool import VramPool

PAGE = regs.SMALL_PAGE
VRAM = 384 * regs.MiB
OS75, OS150 = "gpuvm-Q6000-75-OS", "gpuvm-Q6000-150-OS"
OPTIONS = RunOptions(mode="fv-opt", backend="inproc", vram_size=VRAM, wait_slice=2.0,
                     timeout=120, time_scale=1000.0)
CASES = {  # small sizes: both VMs run the same one, so their pages compete frame for frame
    "vecadd": [70000],
    "madd": [48],
    "mmul": [80],
    "fmadd": [70000],
    "memcpy": [5 * regs.MiB + 12],
    "loop": [250000, 4],
    "idle": [],
}


def types(vram: int = VRAM):
    return mdev_types.profile_types(load_profile().with_vram(vram))


# ---------------------------------------------------------------------- types and partitions
def test_two_75_percent_instances_sum_above_physical_vram_and_others_are_unchanged():
    t = types()
    usable = VRAM - HYP_GLOBAL
    assert 2 * t[OS75].partition.vram_size > usable
    assert t[OS150].partition.vram_size > VRAM
    assert t[OS75].partition.oversubscribed and "oversubscribed" in t[OS75].description
    plain = {k: v for k, v in t.items() if not v.partition.oversubscribed}
    assert sorted(plain) == ["gpuvm-Q6000-1Q", "gpuvm-Q6000-2Q", "gpuvm-Q6000-4Q",
                             "gpuvm-Q6000-8Q"]
    assert plain["gpuvm-Q6000-8Q"].partition.vram_size == 32 * regs.MiB


def test_available_instances_honour_the_host_backing_limit():
    profile = load_profile().with_vram(VRAM)
    fb = types()[OS75].partition.vram_size
    for limit, expect in ((fb - regs.MiB, 0), (fb, 1), (2 * fb, 2), (16 * fb, 4)):
        table = mdev_types.empty_table(profile, host_backing=limit)
        assert mdev_types.available_instances(table, types()[OS75]) == expect, limit


def test_oversubscribed_partitions_share_one_pool_given_back_with_the_last():
    profile = load_profile().with_vram(VRAM)
    table = mdev_types.empty_table(profile, host_backing=4 * types()[OS75].partition.vram_size)
    spec = types()[OS75].partition
    a, b = table.allocate(spec), table.allocate(spec)
    assert a.vram_base == b.vram_base == table.pool_base
    assert table.pool_size == residency_pool_size(VRAM - HYP_GLOBAL)
    assert a.shadow_pool.base != b.shadow_pool.base
    table.release(a)
    assert table.pool_base == b.vram_base
    table.release(b)
    assert table.pool_base is None and table.backing_used == 0
    small = table.allocate(types()["gpuvm-Q6000-8Q"].partition)  # the pool's VRAM is free again
    assert small.vram_base == 0
    tight = mdev_types.empty_table(profile, host_backing=spec.vram_size)
    tight.allocate(spec)
    with pytest.raises(PartitionError, match="host backing limit"):
        tight.allocate(spec)


# ---------------------------------------------------------------------- frames and the view
def test_the_overlay_view_reads_each_page_where_it_lives():
    vram = Vram(8 * regs.MiB)
    backing = BackingStore(4 * regs.MiB)
    view = OverlayView(vram, backing)
    try:
        pool = 2 * regs.MiB
        backing.u8[5 * PAGE:6 * PAGE] = 7  # guest page 5, in the backing store
        vram.u8[pool + 5 * PAGE:pool + 6 * PAGE] = 9  # another tenant's bytes in frame 5
        assert view.read_u32(view.base + 5 * PAGE) == 0x07070707
        view.write_u32(0x100, 0xABCD)  # below base: physical VRAM itself
        assert vram.read_u32(0x100) == 0xABCD
        view.place(5, 1, pool + 5 * PAGE)  # resident: the view is the frame
        assert view.read_u32(view.base + 5 * PAGE) == 0x09090909
        view.write_bytes(view.base + 5 * PAGE, 2, 0x1234)
        assert vram.read_bytes(pool + 5 * PAGE, 2) == 0x1234
        view.place(5, 1, None)  # evicted: the backing store again
        assert view.read_u32(view.base + 5 * PAGE) == 0x07070707
    finally:
        view.close()
        backing.close()
        vram.close()


def test_shadow_entries_reach_only_resident_frames():
    frames = FrameTable(64)
    base = 1 << 30  # the guest's VRAM in the view
    pool = 16 * regs.MiB
    policy = ResidentPolicy(base, 64 * PAGE, 1 << 36, lambda: [], frame_base=pool, frames=frames)
    guest = np.array([pte(3 * PAGE), pte(4 * PAGE), pte(70 * PAGE), 0], dtype=np.uint64)
    frames.frame[3] = 3
    shadow, refused = policy.translate(guest)
    assert shadow[0] == pte(pool + 3 * PAGE)  # resident: its frame's physical address
    assert shadow[1] == 0 and not refused[1]  # not resident: absent, not refused
    assert shadow[2] == 0 and refused[2]  # outside the guest's VRAM: refused as ever
    assert shadow[3] == 0 and not refused[3]


def test_an_engine_store_to_a_resident_table_reaches_the_incremental_shadow():
    """An oversubscribed guest's table is read through its overlay view, but its engines
    write the pool frame, and the device's engine write log names that physical page: the
    incremental resync must ask the log there (not at the view's address) to see it."""
    vram = Vram(32 * regs.MiB)
    backing = BackingStore(8 * regs.MiB)
    view = OverlayView(vram, backing)
    try:
        pool = 4 * regs.MiB  # frame p of the pool: physical pool + p * PAGE
        frames = FrameTable(backing.size // PAGE)
        policy = ResidentPolicy(view.base, backing.size, 1 << 36, lambda: [], engine_base=pool,
                                frame_base=pool, frames=frames)
        pd, table, data = 0x10000, 0x100000, 0x200000
        for page in (pd, table, data):  # resident (nothing in them yet: no copy)
            frames.frame[page // PAGE] = page // PAGE
            view.place(page // PAGE, 1, pool + page)
        view.u64[(view.base + pd) >> 3] = layout.pde_small(table)
        log = EngineWriteLog(vram.size)
        counts: dict[str, int] = {}
        space = ShadowSpace(view, policy, VramPool(16 * regs.MiB, 8 * regs.MiB, "shadow"), pd,
                            lambda name, n: counts.__setitem__(name, counts.get(name, 0) + n),
                            None, log)
        space.sync(incremental=False)
        entry = 77
        vram.u64[(pool + table) // 8 + entry] = pte(data)  # the guest's copy engine stores
        log.mark_range(pool + table + entry * 8, 8)  # ... and the device logs its frame
        scanned = counts["shadow.ptes_scanned"]
        space.sync(incremental=True)
        assert counts["shadow.ptes_scanned"] - scanned == PAGE // 8  # that page, no more
        (_, pt), = space._pts.items()
        assert int(vram.u64[pt.shadow // 8 + entry]) == pte(pool + data)
    finally:
        view.close()
        backing.close()
        vram.close()


# ---------------------------------------------------------------------- real guests
def moved(result) -> dict[str, int]:
    total = {name: 0 for name in COUNTERS}
    for phase in result.session.phases:
        for name in COUNTERS:
            total[name] += phase.counters.get(name, 0)
    return total


def check_pair(results):
    """Both passed their in-guest checks; each brought its pages in (its VRAM starts in the
    backing store), and the counts agree with one another.  Whether one evicted the other
    depends on their overlapping in time, which the callers that need it arrange."""
    for r in results:
        assert r.passed, (r.error(), r.session.console)
        assert r.record["check"] == "PASS" and r.faults == []
    counts = [moved(r) for r in results]
    for c in counts:
        assert c["residency_pages_in"] > 0 and c["residency_switches"] > 0
        assert c["residency_switch_ns"] > 0
        assert c["residency_bytes"] == \
            (c["residency_pages_in"] + c["residency_pages_out"]) * PAGE
    return counts


@pytest.mark.parametrize("bench", sorted(CASES))
def test_two_vms_of_75_percent_finish_every_benchmark(bench):
    specs = [VmSpec(f"vm{i}", bench, CASES[bench], mdev_type=OS75) for i in range(2)]
    check_pair(run_vms(specs, OPTIONS))


@pytest.mark.skipif(not kvm_usable()[0], reason=kvm_usable()[1])
def test_two_vms_of_75_percent_on_kvm():
    specs = [VmSpec(f"vm{i}", "mmul", [64], mdev_type=OS75) for i in range(2)]
    options = RunOptions(mode="fv-opt", backend="kvm", vram_size=VRAM, wait_slice=2.0,
                         timeout=120, time_scale=1000.0)
    check_pair(run_vms(specs, options))


def test_a_working_set_larger_than_the_pool_faults_that_vm_alone():
    vram = 128 * regs.MiB
    pool = residency_pool_size(vram - HYP_GLOBAL)
    n = (pool // 3 // 4) + (1 << 20)  # three buffers of n floats: past the pool
    specs = [VmSpec("big", "vecadd", [n], mdev_type=OS150),
             VmSpec("fits", "madd", [48], mdev_type=OS75)]
    options = RunOptions(mode="fv-opt", backend="inproc", vram_size=vram, wait_slice=2.0,
                         timeout=120, time_scale=1000.0)
    big, fits = run_vms(specs, options)
    assert fits.passed, fits.error()
    assert not big.passed
    error = big.error()
    assert error.startswith("big: ") and "working set of" in error
    assert f"({pool >> 20} MiB of {vram >> 20} MiB)" in error
    assert error.count("\n") == 0


def test_band_moves_more_pages_than_quantum():
    """Both VMs keep submitting short kernels: BAND alternates them, and every turn moves
    the pages the other evicted; QUANTUM lets the holder keep the GPU for its quantum."""
    def moves(policy: dict) -> list[dict[str, int]]:
        # 400 kernels of 1 ms each, on a real-time device clock: long enough to overlap
        # (150 did not always: once in a loaded full suite one VM's kernels were done
        # before the other's Init was)
        specs = [VmSpec(f"vm{i}", "loop", [1_000_000, 400], mdev_type=OS75) for i in range(2)]
        options = RunOptions(mode="fv-opt", backend="inproc", vram_size=VRAM, wait_slice=2.0,
                             timeout=120, scheduler=policy)
        return check_pair(run_vms(specs, options))

    band = moves({"policy": "band"})
    quantum = moves({"policy": "quantum", "quantum_s": 30, "quantum_idle_ms": 50})
    # BAND evicted each VM's pages over and over, every eviction undone by a copy back in
    assert all(c["residency_pages_out"] > 10 for c in band), band
    pages = [sum(c["residency_pages_in"] + c["residency_pages_out"] for c in run)
             for run in (band, quantum)]
    switches = [sum(c["residency_switches"] for c in run) for run in (band, quantum)]
    assert pages[0] > 4 * pages[1] and switches[0] > 4 * switches[1], (band, quantum)


# ---------------------------------------------------------------------- what `gpuvm run` shows
def test_run_shows_the_counts_in_json_rows_and_detail_tables(capsys):
    import json

    from gpuvm import cli

    argv = ["run", "--backend", "inproc", "--vram-mib", "384", "--time-scale", "1000",
            "-b", "madd,madd", "--size", "16", "--mode", "fv-opt", "--type", f"{OS75},{OS75}"]
    assert cli.main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        c = row["counters"]
        assert row["passed"] and c["residency_pages_in"] > 0
        moved_in = {"residency_pages_in", "residency_bytes", "residency_switches",
                    "residency_switch_ns"}  # (a count of 0 is left out of a row)
        assert moved_in <= set(c) and moved_in <= set(row["phase_counters"]["HtoD"])
    assert cli.main([*argv, "--detail"]) == 0
    out = capsys.readouterr().out
    assert out.count("Residency: pages moved") == 2 and "Pages in" in out


def test_a_host_backing_limit_too_small_for_the_type_is_one_error(capsys):
    from gpuvm import cli

    rc = cli.main(["run", "--backend", "inproc", "--vram-mib", "384", "-b", "idle",
                   "--mode", "fv-opt", "--type", OS75, "--host-backing-mib", "64"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and len(err) == 1
    assert err[0].startswith("gpuvm: error: vm0: ") and "host backing limit is 64 MiB" in err[0]


def test_the_reference_monitor_sees_a_vm_using_frames_it_does_not_hold(monkeypatch):
    """The monitor audits an oversubscribed VM's engine accesses against the frames it
    holds at that moment: with the switch skipped and shadows pointing at frames
    regardless of residency, it records escapes (so the runs above, with none, mean
    something)."""
    from gpuvm.mediator import monitor
    from gpuvm.mediator.residency import Residency

    def regardless(self, ptes, page=regs.SMALL_PAGE):
        shadow, refused = self.plain().translate(ptes, page)
        vram_entry = layout.ptes_present(shadow) & \
            (layout.ptes_target(shadow) == np.uint64(regs.TARGET_VRAM))
        offset = np.uint64(self.vram_base - self.frame_base)
        moved = layout.ptes_with_addr(shadow, layout.ptes_addr(shadow) - offset)
        return np.where(vram_entry, moved, shadow), refused

    monkeypatch.setattr(ResidentPolicy, "translate", regardless)
    monkeypatch.setattr(Residency, "make_resident", lambda self, tenant: None)
    specs = [VmSpec(f"vm{i}", "madd", [16], mdev_type=OS75) for i in range(2)]
    monitor.take()
    run_vms(specs, OPTIONS)
    escapes = monitor.take()
    assert escapes and all("outside vm" in e.why for e in escapes)


def test_an_oversubscribed_vgpu_in_a_pv_mode_is_one_error(capsys):
    from gpuvm import cli

    rc = cli.main(["run", "--backend", "inproc", "--vram-mib", "384", "-b", "idle",
                   "--mode", "pv", "--type", OS75])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc != 0 and err == ["gpuvm: error: vm0: an oversubscribed vGPU runs the fv modes "
                               "only (its shadows are re-pointed from guest entries, which "
                               "PV tables do not keep)"]
