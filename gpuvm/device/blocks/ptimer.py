"""PTIMER: nanoseconds from the device clock."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.device import regs
from gpuvm.device.mmio_bus import RegisterBlock

if TYPE_CHECKING:
    from gpuvm.device.gpu import Gpu


class Ptimer(RegisterBlock):
    name, start, size = "ptimer", regs.BLOCK_PTIMER, 0x1000

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        clock = gpu.clock
        # the counter ticks in units of 32 ns on the low word: bits 0-4 read as zero
        self.reg(regs.PTIMER_TIME_0, read=lambda: clock.now_ns() & regs.PTIMER_TIME_0_MASK)
        self.reg(regs.PTIMER_TIME_1, read=lambda: (clock.now_ns() >> 32) & 0xFFFFFFFF)
