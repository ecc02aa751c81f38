"""The PRAMIN window: 1 MiB of BAR0 onto VRAM at the PBUS base, untranslated."""

from __future__ import annotations

from gpuvm.device import regs
from gpuvm.device.blocks.pbus import Pbus
from gpuvm.device.counters import Counters
from gpuvm.device.mmio_bus import RegisterBlock
from gpuvm.device.vram import Vram


class Pramin(RegisterBlock):
    """The window itself, given the VRAM it opens onto, PBUS (its base) and counters."""

    name, start, size = "pramin", regs.PRAMIN_WINDOW, regs.PRAMIN_WINDOW_SIZE

    def __init__(self, vram: Vram, pbus: Pbus, counts: Counters) -> None:
        super().__init__()
        self.vram = vram
        self.pbus = pbus
        self.counts = counts

    def vram_address(self, offset: int) -> int:
        return self.pbus.pramin_vram_base + offset - regs.PRAMIN_WINDOW

    def read(self, offset: int) -> int | None:
        addr = self.vram_address(offset)
        if not self.vram.contains(addr, 4):
            self.counts.inc("pramin.out_of_range")
            return 0xFFFFFFFF
        return self.vram.read_u32(addr)

    def write(self, offset: int, value: int) -> bool:
        addr = self.vram_address(offset)
        if not self.vram.contains(addr, 4):
            self.counts.inc("pramin.out_of_range")
            return True
        self.vram.write_u32(addr, value)
        return True
