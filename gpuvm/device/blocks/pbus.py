"""PBUS: the host's windows onto VRAM (PRAMIN base, BAR1 and BAR3 VMs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.device import regs
from gpuvm.device.mmio_bus import RegisterBlock

if TYPE_CHECKING:
    from gpuvm.device.gpu import Gpu


class Pbus(RegisterBlock):
    name, start, size = "pbus", regs.BLOCK_PBUS, 0x1000

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        self.pramin_base = 0
        self.reg(regs.PBUS_PRAMIN_BASE, read=lambda: self.pramin_base, write=self._set_pramin,
                 plain=True)
        self.reg(regs.PBUS_BAR1_VM, read=lambda: gpu.bar1.reg, write=gpu.bar1.set_reg)
        self.reg(regs.PBUS_BAR3_VM, read=lambda: gpu.bar3.reg, write=gpu.bar3.set_reg)

    def _set_pramin(self, value: int) -> None:
        self.pramin_base = value & regs.PBUS_PRAMIN_BASE_MASK

    @property
    def pramin_vram_base(self) -> int:
        return self.pramin_base << regs.PBUS_PRAMIN_BASE_SHIFT
