"""PGRAPH: busy status (what GPUvm's scheduler polls) and its interrupt word.

The one interrupt modelled is NOTIFY (bit 0): a compute notifier written or a query with
its interrupt bit.  Which channels raised it is kept, so a mediator can show each VM
its own; the register shows it while any channel's is unacknowledged (PMC_INTR bit 12).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.device import regs
from gpuvm.device.mmio_bus import RegisterBlock

if TYPE_CHECKING:
    from gpuvm.device.channel import Channel
    from gpuvm.device.gpu import Gpu


class Pgraph(RegisterBlock):
    name, start, size = "pgraph", regs.BLOCK_PGRAPH, 0x10000

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        self.gpu = gpu
        self.notify_chids: set[int] = set()
        self.reg(regs.PGRAPH_STATUS, read=lambda: int(gpu.engines.graph.busy(gpu.clock.now_ns())))
        self.reg(regs.PGRAPH_INTR, read=lambda: self.intr, write=self._clear)

    @property
    def intr(self) -> int:
        return regs.PGRAPH_INTR_NOTIFY if self.notify_chids else 0

    def _clear(self, value: int) -> None:
        if value & regs.PGRAPH_INTR_NOTIFY:
            self.notify_chids.clear()

    def notify(self, ch: "Channel") -> None:
        self.notify_chids.add(ch.chid)
        self.gpu.counts.chan(ch.chid, "pgraph.notifies")
        self.gpu.signal(ch.chid)
