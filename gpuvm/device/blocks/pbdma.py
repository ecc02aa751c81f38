"""PBDMA unit 0 (envytools' PSUBFIFO): the pusher's interrupt status, the method it
trapped, and the channel it was working for -- what nvkm's gf100_fifo_intr_pbdma reads.

Records are kept per channel, oldest first: the registers show the oldest (one unit, as
on a GF100 with one PBDMA), and a mediator can show each VM its own.  PFIFO_INTR bit 29
and PFIFO_PBDMA_INTR_SOURCE are levels of "any record".
"""

from __future__ import annotations

from gpuvm.device import regs
from gpuvm.device.events import DeviceEvents
from gpuvm.device.mmio_bus import RegisterBlock


class Pbdma(RegisterBlock):
    """The one PBDMA's registers and its per-channel interrupt records.  Given the
    device's events (a record signals its channel), not the Gpu."""

    name, start, size = "pbdma", regs.BLOCK_PBDMA, regs.PBDMA_STRIDE

    def __init__(self, events: DeviceEvents) -> None:
        super().__init__()
        self.events = events
        self.traps: dict[int, list[int]] = {}  # chid -> [INTR, METHOD0, DATA0]
        self.intr_en = 0
        self.config = 0
        self.reg(regs.PBDMA_INTR, read=lambda: self._oldest(0), write=self._ack_oldest)
        self.reg(regs.PBDMA_METHOD0, read=lambda: self._oldest(1),
                 write=lambda v: None)  # nvkm's NOP: the method was skipped already
        self.reg(regs.PBDMA_DATA0, read=lambda: self._oldest(2))
        self.reg(regs.PBDMA_CHAN, read=lambda: next(iter(self.traps), 0))
        self.reg(regs.PBDMA_INTR_EN, read=lambda: self.intr_en, write=self._set_intr_en,
                 plain=True)
        self.reg(regs.PBDMA_CONFIG, read=lambda: self.config, write=self._set_config,
                 plain=True)

    def _oldest(self, word: int) -> int:
        for record in self.traps.values():
            return record[word]
        return 0

    def _ack_oldest(self, value: int) -> None:
        for chid in self.traps:
            self.ack(chid, value)
            return

    def _set_intr_en(self, value: int) -> None:
        self.intr_en = value

    def _set_config(self, value: int) -> None:
        self.config = value

    def ack(self, chid: int, value: int) -> None:
        """Write-1-to-clear one channel's reasons (the register write acks the oldest
        record; a mediator acks the one its VM sees)."""
        record = self.traps.get(chid)
        if record is not None:
            record[0] &= ~value
            if not record[0]:
                del self.traps[chid]

    def trap(self, chid: int, reason: int, subc: int = 0, method: int = 0,
             data: int = 0) -> None:
        """Record an interrupt for channel chid; reasons accumulate, the first method
        trapped stays on show until acked."""
        record = self.traps.get(chid)
        if record is None:
            self.traps[chid] = [reason, (subc << regs.PBDMA_METHOD0_SUBC_SHIFT) |
                                (method & 0x3FFC), data & 0xFFFFFFFF]
        else:
            record[0] |= reason
        self.events.signal(chid)
