"""PGRAPH: busy status (what GPUvm's scheduler polls) and its interrupt word.

Two interrupts are modelled: NOTIFY (bit 0), a compute notifier written or a query with
its interrupt bit, and ILLEGAL_MTHD (bit 4), a method the bound compute or M2MF class
does not have -- recorded in TRAP_ADDR/TRAP_DATA and skipped, the channel going on, as
nvkm's gf100_gr_intr expects.  Which channels raised them is kept, so a mediator can
show each VM its own; the register shows them while any is unacknowledged (PMC_INTR
bit 12).  (Hardware also stops PGRAPH's FIFO access until the handler writes 0x400500;
the model does not hold the engine, so one VM's unhandled trap cannot stall another.)
"""

from __future__ import annotations

from typing import Protocol

from gpuvm.device import regs
from gpuvm.device.clock import DeviceClock
from gpuvm.device.counters import Counters
from gpuvm.device.engines import Engine
from gpuvm.device.events import DeviceEvents
from gpuvm.device.mmio_bus import RegisterBlock


class RaisedBy(Protocol):
    """The channel an interrupt is raised for (gpuvm.device.channel.Channel)."""

    chid: int


class Pgraph(RegisterBlock):
    """PGRAPH's status and interrupts, with which channel raised each (see above).
    Given the graphics engine (busy), the clock, the counters and the device's events,
    not the Gpu."""

    name, start, size = "pgraph", regs.BLOCK_PGRAPH, 0x10000

    def __init__(self, graph: Engine, clock: DeviceClock, counts: Counters,
                 events: DeviceEvents) -> None:
        super().__init__()
        self.counts = counts
        self.events = events
        self.notify_chids: set[int] = set()
        # illegal methods by channel, oldest first: [TRAP_ADDR, TRAP_DATA]
        self.traps: dict[int, list[int]] = {}
        self.fifo_access = 0
        self.reg(regs.PGRAPH_STATUS, read=lambda: int(graph.busy(clock.now_ns())))
        self.reg(regs.PGRAPH_INTR, read=lambda: self.intr, write=self._clear)
        self.reg(regs.PGRAPH_TRAP_ADDR, read=lambda: self._trap_word(0))
        self.reg(regs.PGRAPH_TRAP_DATA, read=lambda: self._trap_word(1))
        self.reg(regs.PGRAPH_FIFO_ACCESS, read=lambda: self.fifo_access,
                 write=self._set_fifo_access, plain=True)

    @property
    def intr(self) -> int:
        return (regs.PGRAPH_INTR_NOTIFY if self.notify_chids else 0) | \
            (regs.PGRAPH_INTR_ILLEGAL_MTHD if self.traps else 0)

    def _trap_word(self, word: int) -> int:
        for record in self.traps.values():
            return record[word]
        return 0

    def _clear(self, value: int) -> None:
        if value & regs.PGRAPH_INTR_NOTIFY:
            self.notify_chids.clear()
        if value & regs.PGRAPH_INTR_ILLEGAL_MTHD:
            for chid in self.traps:
                self.ack_trap(chid)
                break

    def ack_trap(self, chid: int) -> None:
        self.traps.pop(chid, None)

    def _set_fifo_access(self, value: int) -> None:
        self.fifo_access = value

    def illegal_method(self, ch: RaisedBy, subc: int, method: int, value: int) -> None:
        """A method the bound class lacks: recorded (the first per channel stays on show
        until acked), interrupted, skipped."""
        self.traps.setdefault(ch.chid, [(subc << regs.PGRAPH_TRAP_SUBC_SHIFT) | method,
                                        value & 0xFFFFFFFF])
        self.counts.chan(ch.chid, "pgraph.illegal_methods")
        self.events.signal(ch.chid)

    def notify(self, ch: RaisedBy) -> None:
        self.notify_chids.add(ch.chid)
        self.counts.chan(ch.chid, "pgraph.notifies")
        self.events.signal(ch.chid)
