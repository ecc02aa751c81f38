"""PGRAPH: busy status (what GPUvm's scheduler polls) and its interrupt word."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.device import regs
from gpuvm.device.mmio_bus import RegisterBlock

if TYPE_CHECKING:
    from gpuvm.device.gpu import Gpu


class Pgraph(RegisterBlock):
    name, start, size = "pgraph", regs.BLOCK_PGRAPH, 0x10000

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        self.intr = 0
        self.reg(regs.PGRAPH_STATUS, read=lambda: int(gpu.engines.graph.busy(gpu.clock.now_ns())))
        self.reg(regs.PGRAPH_INTR, read=lambda: self.intr, write=self._clear)

    def _clear(self, value: int) -> None:
        self.intr &= ~value
