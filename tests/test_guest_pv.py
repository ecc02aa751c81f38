"""The paravirtual driver build: page tables only by hypercall, batched by a boot
parameter.  A toy hypervisor here keeps the tables in VRAM the way the PV mediator
does, so the build is checked end to end before (and independently of) the mediator."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import layout, regs
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.run.native import NativeMachine
from gpuvm.vfio import abi as vfio
from gpuvm.vfio.device import RegionInfo
from gpuvm.vfio.passthrough import PassthroughGpu
from gpuvm.vmm import abi
from gpuvm.vmm.guest_programs import PROBE_VECTORS

VRAM = 384 * regs.MiB
PT_BYTES = regs.SMALL_PTES_PER_PT * regs.PTE_SIZE


class ToyPvHypervisor:
    """HC_* on a native GPU: the PD key is used as the real PD; page tables come from
    the top of VRAM (the guest allocates from the bottom).  No validation -- that is the
    mediator's job; this only checks the guest's side of the protocol."""

    def __init__(self, gpu, dma) -> None:
        self.gpu = gpu
        self.dma = dma  # the GPU's DMA mappings: how the hypervisor reads the record
        self.top = gpu.vram.size
        self.spaces: dict[int, dict[int, int]] = {}
        self.calls: list[tuple[int, int]] = []  # (op, count)
        self.guest_pte_stores = 0

    def _pt(self, pd: int, index: int) -> int:
        pts = self.spaces[pd]
        if index not in pts:
            self.top -= PT_BYTES
            pts[index] = self.top
            self.gpu.vram.u8[self.top:self.top + PT_BYTES] = 0
            self.gpu.vram.u64[(pd >> 3) + index] = layout.pde_small(self.top)
        return pts[index]

    def __call__(self, gpa: int) -> None:
        hc = abi.HcallHeader.from_buffer(self.dma.region(gpa, abi.HCALL_HEADER_BYTES))
        op, count, pd = hc.op, hc.count, int(hc.args[0])
        raw = self.dma.region(gpa + abi.HCALL_HEADER_BYTES, 16 * count).copy() \
            .view(np.uint64).reshape(-1, 2)
        self.calls.append((op, count))
        with self.gpu.lock:
            if op == abi.HC_SET_PGD:
                self.spaces[pd] = {}
                self.gpu.vram.u8[pd:pd + regs.PD_BYTES] = 0
            elif op in (abi.HC_MAP_BATCH, abi.HC_UNMAP_BATCH):
                for va, pte in raw.tolist():
                    pt = self._pt(pd, va >> regs.PDE_SPAN_SHIFT)
                    slot = (va >> 12) & (regs.SMALL_PTES_PER_PT - 1)
                    self.gpu.vram.u64[(pt >> 3) + slot] = pte if op == abi.HC_MAP_BATCH else 0
            elif op == abi.HC_VM_FLUSH:
                self.gpu.mmu.flush(pd, regs.TARGET_VRAM)
                self.gpu.flushed()
            elif op == abi.HC_FREE_PGD:
                self.spaces.pop(pd)
        hc.status = abi.HC_OK
        del hc


class ToyPvGpu(PassthroughGpu):
    """A whole GPU with the PV vGPU's hypercall port (BAR4) answered by the toy."""

    last: "ToyPvGpu | None" = None

    def __init__(self, gpu) -> None:
        super().__init__(gpu)
        self.hv = ToyPvHypervisor(gpu, self.dma)
        ToyPvGpu.last = self

    def get_region_info(self, index: int) -> RegionInfo:
        if index == regs.BAR4:
            return RegionInfo(index, regs.BAR4_SIZE, vfio.VFIO_REGION_INFO_FLAG_WRITE)
        return super().get_region_info(index)

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        if region == regs.BAR4:
            self.hv(value)
        else:
            super().write(region, offset, size, value)


class ToyPv(NativeMachine):
    paravirtual = True
    device_class = ToyPvGpu


OPTIONS = RunOptions(backend="inproc", vram_size=VRAM, wait_slice=2.0)


def run_pv(bench: str, params: list[int], batch: int = 0):
    (r,) = run_vms([VmSpec("vm0", bench, params, paravirtual=True, pv_batch=batch)], OPTIONS,
                   machine=ToyPv)
    return r, ToyPvGpu.last.hv


@pytest.mark.parametrize("bench,params", [("mmul", [48]), ("memcpy", [5 * regs.MiB]),
                                          ("idle", []), ("loop", [1000])])
def test_pv_driver_passes(bench, params):
    r, hv = run_pv(bench, params)
    assert r.passed, (r.error(), r.session.console)
    assert int(r.record["hypercalls"]) == len(hv.calls)
    assert hv.spaces == {}  # every space it created was freed on close


def test_pv_driver_never_writes_page_tables_itself():
    pv, hv = run_pv("madd", [32])
    (direct,) = run_vms([VmSpec("vm0", "madd", [32])],
                        RunOptions(backend="inproc", vram_size=VRAM))
    pv_rec, d_rec = pv.record, direct.record
    assert pv_rec["pt_zero_words"] == "0" and pv_rec["pde_writes"] == "0"
    # the same entries, sent instead of stored -- less the BAR3 mappings the direct build
    # makes (and removes) to write the channel space's PD and its one page table
    table_pages = (regs.PD_BYTES + PT_BYTES) // regs.SMALL_PAGE
    assert int(d_rec["pte_writes"]) - int(pv_rec["pte_writes"]) == 2 * table_pages
    assert pv_rec["pte_writes"] == pv_rec["hc_entries"]
    total = lambda r, k: sum(p.counters.get(k, 0) for p in r.session.phases)
    assert total(pv, "exits.mmio.bar3.write") < total(direct, "exits.mmio.bar3.write") / 10
    assert total(pv, "mmio.bar0.pramin.write") < total(direct, "mmio.bar0.pramin.write") / 10
    assert total(pv, "mmio.bar0.pffb.write") == 0  # HC_VM_FLUSH instead
    ops = {op for op, _ in hv.calls}
    assert ops == {abi.HC_SET_PGD, abi.HC_MAP_BATCH, abi.HC_UNMAP_BATCH, abi.HC_VM_FLUSH,
                   abi.HC_FREE_PGD}


@pytest.mark.parametrize("batch", [1, 64, 0])
def test_batch_size_comes_from_the_boot_parameter(batch):
    r, hv = run_pv("vecadd", [4096], batch)
    assert r.passed
    sizes = [n for op, n in hv.calls if op in (abi.HC_MAP_BATCH, abi.HC_UNMAP_BATCH)]
    # the 4 MiB bounce buffer is 1024 entries, mapped before one flush
    assert max(sizes) == min(batch or abi.HC_MAX_ENTRIES, 1024)
    assert sum(sizes) == int(r.record["hc_entries"])
    assert len(sizes) >= sum(sizes) // (batch or abi.HC_MAX_ENTRIES)


def test_pv_map_probe_goes_through_the_hypercall():
    secret = 0x4000000
    (r,) = run_vms([VmSpec("vm0", "probe", [PROBE_VECTORS["pv_map"], secret, 16],
                           paravirtual=True)], OPTIONS, machine=ToyPv)
    assert r.passed and r.record["vector"] == "pv_map" and r.record["refused"] == "0"
    assert r.record["wrote"] == "1"


def test_pv_flat_image_on_kvm_counts_like_inproc():
    from dataclasses import replace

    from gpuvm.vmm.backends import kvm_usable

    ok, why = kvm_usable()
    if not ok:
        pytest.skip(why)
    spec = VmSpec("vm0", "madd", [32], paravirtual=True, pv_batch=16)
    (kvm,) = run_vms([spec], replace(OPTIONS, backend="kvm"), machine=ToyPv)
    (inproc,) = run_vms([spec], OPTIONS, machine=ToyPv)
    assert kvm.passed and inproc.passed
    # kvm.*: how KVM delivered the accesses (its coalesced ring), not what was counted
    assert [{k: v for k, v in p.counters.items() if not k.startswith("kvm.")}
            for p in kvm.session.phases] == [p.counters for p in inproc.session.phases]
