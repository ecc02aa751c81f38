"""PCOPY falcons: which channel each copy engine serves (GPUvm translates these)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuvm.device import layout, regs
from gpuvm.device.mmio_bus import RegisterBlock

if TYPE_CHECKING:
    from gpuvm.device.engines import Engine


class Pcopy(RegisterBlock):
    """A copy engine's register block: the channel it runs now and the next-channel
    mailbox the driver and the engine share (each VM gets a virtual one in the
    mediator)."""
    size = 0x1000

    def __init__(self, index: int, engine: "Engine") -> None:
        super().__init__()
        self.name = f"pcopy{index}"
        self.start = regs.BLOCK_PCOPY0 if index == 0 else regs.BLOCK_PCOPY1
        self.engine = engine
        self.next_chan = 0
        self.reg(self.start + regs.PCOPY_CUR_CHAN, read=self._cur)
        self.reg(self.start + regs.PCOPY_NEXT_CHAN, read=lambda: self.next_chan,
                 write=self._set_next, plain=True)

    def _cur(self) -> int:
        inst = self.engine.current_inst
        return 0 if inst is None else layout.pcopy_chan_word(inst)

    def _set_next(self, value: int) -> None:
        self.next_chan = value
