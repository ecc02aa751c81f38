"""Memory configuration: partition count and sizes (how a driver learns the VRAM size),
PFLUSH, and the PFFB VM block with the TLB-flush pair 0x100cb8 / 0x100cbc."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.device import layout, regs
from gpuvm.device.mmio_bus import RegisterBlock

if TYPE_CHECKING:
    from gpuvm.device.gpu import Gpu


class PfbPartitions(RegisterBlock):
    name, start, size = "pfb_part", regs.BLOCK_PFB_PART, 0x1000

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        self.reg(regs.PFB_PART_COUNT, read=lambda: gpu.profile.partitions)


class PfbPartitionSizes(RegisterBlock):
    name, start, size = "pfbpa", regs.BLOCK_PFBPA, regs.PFB_MAX_PARTS * regs.PFBPA_PART_STRIDE

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        parts = gpu.profile.partitions
        mib = gpu.vram.size // parts // regs.MiB
        for p in range(regs.PFB_MAX_PARTS):
            value = mib if p < parts else 0
            self.reg(regs.PFBPA_PART_SIZE_MIB + p * regs.PFBPA_PART_STRIDE,
                     read=lambda v=value: v)


class Pfb(RegisterBlock):
    """The memory controller proper: nothing a driver of this model needs, but its range is
    claimed so stray accesses are counted as unimplemented registers of PFB."""

    name, start, size = "pfb", regs.BLOCK_PFB, 0x800


class Pflush(RegisterBlock):
    name, start, size = "pflush", regs.BLOCK_PFLUSH, 0x1000

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        # Writes reach memory synchronously in this model, so a flush (PFLUSH_TRIGGER) is
        # done at once: PFLUSH_BUSY, which nouveau polls, always reads clear.
        self.reg(regs.PFLUSH_FLUSH, read=lambda: 0, write=self._flush)
        self.gpu = gpu

    def _flush(self, value: int) -> None:
        if value & regs.PFLUSH_TRIGGER:
            self.gpu.counts.inc("pflush.flushes")


class Pffb(RegisterBlock):
    name, start, size = "pffb", regs.BLOCK_PFFB, 0x800

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        self.gpu = gpu
        self.cfg = 0
        self.flush_pd = 0
        self.flush_page = 0
        self.reg(regs.PFFB_VM_CFG, read=self._read_cfg, write=self._write_cfg)
        self.reg(regs.PFFB_FLUSH_PAGE, read=lambda: self.flush_page, write=self._set_page, plain=True)
        self.reg(regs.PFFB_FLUSH_PD, read=lambda: self.flush_pd, write=self._set_pd, plain=True)
        self.reg(regs.PFFB_FLUSH_TRIGGER, read=lambda: 0, write=self._trigger)

    def _read_cfg(self) -> int:
        # Flushes complete synchronously: slots are always free and "done" always set.
        return (self.cfg & regs.PFFB_VM_CFG_LARGE_64K) | regs.PFFB_VM_CFG_FLUSH_DONE | \
            (regs.PFFB_VM_CFG_SLOTS_MASK << regs.PFFB_VM_CFG_SLOTS_SHIFT)

    def _write_cfg(self, value: int) -> None:
        self.cfg = value & regs.PFFB_VM_CFG_LARGE_64K
        self.gpu.mmu.set_large_pages_64k(bool(self.cfg))

    def _set_page(self, value: int) -> None:
        self.flush_page = value

    def _set_pd(self, value: int) -> None:
        self.flush_pd = value

    def _trigger(self, value: int) -> None:
        if not value & regs.PFFB_TRIGGER_GO:
            return
        # one bit for sysram: the MMU drops the space under either sysram target
        target = regs.TARGET_SYSRAM if layout.flush_pd_sysram(self.flush_pd) else regs.TARGET_VRAM
        pd = layout.flush_pd_addr(self.flush_pd)
        if value & regs.PFFB_TRIGGER_ALL_PDS:
            self.gpu.mmu.flush()
        else:
            self.gpu.mmu.flush(pd, target)
        self.gpu.flushed()
