"""What a VM sees of faults: its own fault records, unit mask and PFIFO interrupt bits.

The device records faults of every channel; a VM must see only its own, with its own
channel ids and instance addresses, plus the faults the mediator itself raised for it (a
channel the watchdog ended, a BAR access through an unmapped page).
"""

from __future__ import annotations

from typing import Callable

from gpuvm.device import layout, regs
from gpuvm.device.faults import ChannelFault, fault_flags
from gpuvm.mediator.channel_table import ChannelTable
from gpuvm.mediator.partition import Partition


class VmFaults:
    """A vGPU's virtual fault state: the records nouveau reads at 0x2800+, the unit mask
    at 0x259c and the PFIFO interrupt bits they raise.

    Why apart from the vGPU: the channels (a kill), the BAR path (a fault) and the trap
    table (reads and acknowledgements) each need it; handed this, none calls back up to
    the vGPU.  It outlives a device reset, as the records it has shown the guest do.

    `device_faults` is the device's fault list, `owns(pchid)` whether this VM owns that
    physical channel now; the channel table gives a faulted channel's guest RAMIN."""

    def __init__(self, part: Partition, table: ChannelTable,
                 device_faults: Callable[[], list[ChannelFault]],
                 owns: Callable[[int], bool]) -> None:
        self.part = part
        self.table = table
        self._device_faults = device_faults
        self._owns = owns
        self.records = [[0, 0, 0, 0] for _ in range(regs.PFIFO_FAULT_UNITS)]
        self.mask = 0
        self.pfifo = 0  # the PFIFO_INTR bits latched for the guest
        self._seen = 0
        self._kills: list[ChannelFault] = []

    def killed(self, vchid: int, reason: str) -> None:
        """The mediator ended channel vchid (the watchdog, a working set too large)."""
        self._kills.append(ChannelFault(vchid, reason, 0, "PFIFO", regs.CHAN_ERR_TIMEOUT_EXT))

    def bar_fault(self, bar: int, inst: int, offset: int, write: bool) -> None:
        """A BAR1/BAR3 access through a page the guest's BAR VM does not map."""
        unit = regs.FAULT_UNIT_BAR1 if bar == regs.BAR1 else regs.FAULT_UNIT_BAR3
        self.records[unit] = [inst, offset & 0xFFFFFFFF, offset >> 32,
                              fault_flags(unit, regs.FAULT_PAGE_NOT_PRESENT, write)]
        self.mask |= 1 << unit
        self.pfifo |= regs.PFIFO_INTR_VM_FAULT

    def all(self) -> list[ChannelFault]:
        """Every fault of this VM, its own channel ids: the mediator's, then the device's."""
        mine = list(self._kills)
        base = self.part.chid_base
        for f in self._device_faults():
            vchid = f.chid - base
            if 0 <= vchid < self.part.channels and self._owns(f.chid):
                mine.append(ChannelFault(vchid, f.reason, f.address, f.engine, f.code, f.unit,
                                         f.vm_reason, f.write))
        return mine

    def collect(self) -> None:
        """Turn new faults of this VM's channels into its own fault records."""
        faults = self.all()
        for f in faults[self._seen:]:
            if f.unit >= 0:
                ch = self.table.by_vchid.get(f.chid)
                inst = layout.fault_inst_word(ch.guest_inst) if ch and ch.guest_inst else 0
                self.records[f.unit] = [inst, f.address & 0xFFFFFFFF, f.address >> 32,
                                        fault_flags(f.unit, f.vm_reason, f.write)]
                self.mask |= 1 << f.unit
                self.pfifo |= regs.PFIFO_INTR_VM_FAULT
            else:
                self.pfifo |= regs.PFIFO_INTR_PBDMA
        self._seen = len(faults)

    def pfifo_intr(self) -> int:
        self.collect()
        return self.pfifo

    def pfifo_intr_clear(self, value: int) -> None:
        self.collect()
        self.pfifo &= ~value

    def fault_mask(self) -> int:
        self.collect()
        return self.mask

    def fault_mask_clear(self, value: int) -> None:
        self.mask &= ~value

    def fault_record(self, unit: int, word: int) -> int:
        self.collect()
        return self.records[unit][word]
