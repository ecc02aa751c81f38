"""PMC: identity, the interrupt summary, engine enables."""

from __future__ import annotations

from typing import Callable

from gpuvm.device import regs
from gpuvm.device.events import DeviceEvents
from gpuvm.device.mmio_bus import RegisterBlock


_INTR_EN_BITS = regs.PMC_INTR_EN_HW | regs.PMC_INTR_EN_SW


class Pmc(RegisterBlock):
    """The chip's identity, its engine enables and its interrupt summary.  Given the
    identity and the device's events (enabling an engine may make work runnable); the
    units' interrupt lines are wired to it (`wire`), as on the chip, rather than read
    from a Gpu it would hold."""

    name, start, size = "pmc", regs.BLOCK_PMC, 0x1000

    def __init__(self, boot0: int, events: DeviceEvents) -> None:
        super().__init__()
        self.events = events
        self.lines: list[tuple[int, Callable[[], object]]] = []  # (PMC_INTR bit, level)
        self.intr_en = 0
        self.enable = 0
        self.reg(regs.PMC_BOOT_0, read=lambda: boot0)
        self.reg(regs.PMC_INTR, read=self.pending)
        self.reg(regs.PMC_INTR_EN, read=lambda: self.intr_en, write=self._set_intr_en,
                 plain=True)
        self.reg(regs.PMC_ENABLE, read=lambda: self.enable, write=self._set_enable)
        self.pbdma_enable = 0
        self.reg(regs.PMC_PBDMA_ENABLE, read=lambda: self.pbdma_enable,
                 write=self._set_pbdma_enable, plain=True)

    def wire(self, bit: int, level: Callable[[], object]) -> None:
        """A unit's interrupt line: PMC_INTR `bit` is set while `level()` is true."""
        self.lines.append((bit, level))

    def pending(self) -> int:
        """Which units have an interrupt pending (the summary a driver reads first)."""
        value = 0
        for bit, level in self.lines:
            if level():
                value |= bit
        return value

    def _set_intr_en(self, value: int) -> None:
        self.intr_en = value & _INTR_EN_BITS

    def _set_enable(self, value: int) -> None:
        self.enable = value
        self.events.kick_engines()

    def _set_pbdma_enable(self, value: int) -> None:
        self.pbdma_enable = value & ((1 << regs.PBDMA_COUNT) - 1)

    def engine_enabled(self, bit: int) -> bool:
        return bool(self.enable & bit)
