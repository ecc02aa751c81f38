"""The PRAMIN window: 1 MiB of BAR0 onto VRAM at the PBUS base, untranslated."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.device import regs
from gpuvm.device.mmio_bus import RegisterBlock

if TYPE_CHECKING:
    from gpuvm.device.gpu import Gpu


class Pramin(RegisterBlock):
    name, start, size = "pramin", regs.PRAMIN_WINDOW, regs.PRAMIN_WINDOW_SIZE

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        self.gpu = gpu

    def vram_address(self, offset: int) -> int:
        return self.gpu.pbus.pramin_vram_base + offset - regs.PRAMIN_WINDOW

    def read(self, offset: int) -> int | None:
        addr = self.vram_address(offset)
        if not self.gpu.vram.contains(addr, 4):
            self.gpu.counts.inc("pramin.out_of_range")
            return 0xFFFFFFFF
        return self.gpu.vram.read_u32(addr)

    def write(self, offset: int, value: int) -> bool:
        addr = self.vram_address(offset)
        if not self.gpu.vram.contains(addr, 4):
            self.gpu.counts.inc("pramin.out_of_range")
            return True
        self.gpu.vram.write_u32(addr, value)
        return True
