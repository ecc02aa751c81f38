"""PBUS: the host's windows onto VRAM (PRAMIN base, BAR1 and BAR3 VMs)."""

from __future__ import annotations

from gpuvm.device import regs
from gpuvm.device.bar_aperture import BarAperture
from gpuvm.device.mmio_bus import RegisterBlock


class Pbus(RegisterBlock):
    """The PRAMIN base and the two BAR VM registers, given the apertures they set."""

    name, start, size = "pbus", regs.BLOCK_PBUS, 0x1000

    def __init__(self, bar1: BarAperture, bar3: BarAperture) -> None:
        super().__init__()
        self.pramin_base = 0
        self.reg(regs.PBUS_PRAMIN_BASE, read=lambda: self.pramin_base, write=self._set_pramin,
                 plain=True)
        self.reg(regs.PBUS_BAR1_VM, read=lambda: bar1.reg, write=bar1.set_reg)
        self.reg(regs.PBUS_BAR3_VM, read=lambda: bar3.reg, write=bar3.set_reg)

    def _set_pramin(self, value: int) -> None:
        self.pramin_base = value & regs.PBUS_PRAMIN_BASE_MASK

    @property
    def pramin_vram_base(self) -> int:
        return self.pramin_base << regs.PBUS_PRAMIN_BASE_SHIFT
