"""PMC: identity, the interrupt summary, engine enables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.device import regs
from gpuvm.device.mmio_bus import RegisterBlock

if TYPE_CHECKING:
    from gpuvm.device.gpu import Gpu


_INTR_EN_BITS = regs.PMC_INTR_EN_HW | regs.PMC_INTR_EN_SW


class Pmc(RegisterBlock):
    name, start, size = "pmc", regs.BLOCK_PMC, 0x1000

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        self.gpu = gpu
        self.intr_en = 0
        self.enable = 0
        self.reg(regs.PMC_BOOT_0, read=lambda: gpu.profile.boot0)
        self.reg(regs.PMC_INTR, read=self.pending)
        self.reg(regs.PMC_INTR_EN, read=lambda: self.intr_en, write=self._set_intr_en,
                 plain=True)
        self.reg(regs.PMC_ENABLE, read=lambda: self.enable, write=self._set_enable)
        self.pbdma_enable = 0
        self.reg(regs.PMC_PBDMA_ENABLE, read=lambda: self.pbdma_enable,
                 write=self._set_pbdma_enable, plain=True)

    def pending(self) -> int:
        """Which units have an interrupt pending (the summary a driver reads first)."""
        value = 0
        # a unit's line is its status under its own enables (nvkm leaves PFIFO_INTR bit 31
        # pending with 0x2140 bit 31 clear until a fence waiter wants it)
        if self.gpu.pfifo.intr_status() & self.gpu.pfifo.intr_en:
            value |= regs.PMC_INTR_PFIFO
        if self.gpu.ptimer.pending():
            value |= regs.PMC_INTR_PTIMER
        if self.gpu.pgraph.intr:
            value |= regs.PMC_INTR_PGRAPH
        return value

    def _set_intr_en(self, value: int) -> None:
        self.intr_en = value & _INTR_EN_BITS

    def _set_enable(self, value: int) -> None:
        self.enable = value
        self.gpu.kick_engines()

    def _set_pbdma_enable(self, value: int) -> None:
        self.pbdma_enable = value & ((1 << regs.PBDMA_COUNT) - 1)

    def engine_enabled(self, bit: int) -> bool:
        return bool(self.enable & bit)
