"""BAR1 and BAR3: host windows translated through their own GPU address spaces.

With the MODE bit (bit 31 of PBUS_BAR1_VM / PBUS_BAR3_VM) clear, a BAR is a plain window
onto VRAM: offset x is VRAM address x, untranslated (envytools rnndb/bus/pbus.xml).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.counters import Counters
from gpuvm.device.mmio_bus import MmioBus
from gpuvm.device.mmu import DATA, DmaFault, Mmu, Space, VmFault
from gpuvm.device.vram import Vram

# PFIFO's fault record of a BAR access: (unit, instance, offset, write, reason)
RecordFault = Callable[[int, int, int, bool, int], None]


class BarAperture:
    """BAR1 or BAR3: host accesses translated through the BAR VM's page table.  Given
    VRAM, the MMU, the counters, the bus (which counts malformed accesses) and PFIFO's
    fault record, not the Gpu."""

    def __init__(self, vram: Vram, mmu: Mmu, counts: Counters, bus: MmioBus,
                 record_fault: RecordFault, bar: int, size: int, fault_unit: int) -> None:
        self.vram = vram
        self.mmu = mmu
        self.counts = counts
        self.bus = bus
        self.record_fault = record_fault
        self.bar = bar
        self.size = size
        self.fault_unit = fault_unit
        self.reg = 0
        self._space: Space | None = None
        self._keys = (f"mmio.bar{bar}.read", f"mmio.bar{bar}.write")
        # told whenever translations through this BAR may change (a passed-through GPU
        # takes back the pages it mapped into the guest)
        self.on_forget: list[Callable[[], None]] = []

    def set_reg(self, value: int) -> None:
        self.reg = value
        self.forget()

    def forget(self) -> None:
        """Re-read the instance block on next use (after a flush or a rewrite)."""
        self._space = None
        for listener in self.on_forget:
            listener()

    def page_frame(self, offset: int) -> int | None:
        """The VRAM address of the page at BAR `offset` if a store there lands in plain
        VRAM (present, writable), else None -- without counting or faulting."""
        if not self.reg & regs.PBUS_BARVM_ENABLE:
            base = offset & ~0xFFF
            return base if self.vram.contains(base, 0x1000) else None
        space = self.space()
        if space is None:
            return None
        mmu = self.mmu
        try:
            target, phys = mmu.translate_one(space, offset & ~0xFFF, True, user=False)
        except (VmFault, DmaFault):
            return None
        mmu.counters.total["vm.translations"] -= 1  # a look, not an access
        return phys if target == regs.TARGET_VRAM else None

    @property
    def inst(self) -> int:
        return layout.barvm_inst(self.reg)

    def space(self) -> Space | None:
        if not self.reg & regs.PBUS_BARVM_ENABLE:
            return None
        if self._space is None:
            self._space = self.mmu.space_from_instance(self.inst, layout.barvm_target(self.reg))
        return self._space

    def _translate(self, offset: int, size: int, write: bool) -> tuple[int, int] | None:
        if size not in (1, 2, 4, 8) or offset < 0 or offset + size > self.size or \
                (offset & 0xFFF) + size > 0x1000:
            self.bus.unimplemented(offset, f"bar{self.bar} access of {size}")
            return None
        self.mmu.actor = ("bar", self.bar, offset)
        if not self.reg & regs.PBUS_BARVM_ENABLE:
            if not self.vram.contains(offset, size):
                self.counts.inc(f"bar{self.bar}.plain_out_of_range")
                return None
            self.mmu.check(DATA, regs.TARGET_VRAM, offset, size, write)
            return regs.TARGET_VRAM, offset
        space = self.space()
        try:
            if space is None:
                raise VmFault(regs.FAULT_NO_CHANNEL, offset, write)
            target, phys = self.mmu.translate_one(space, offset, write, user=False)
            self.mmu.touch(target, phys, size, DATA, write)
            return target, phys
        except (VmFault, DmaFault) as exc:
            reason = exc.reason if isinstance(exc, VmFault) else regs.FAULT_PAGE_NOT_PRESENT
            self.record_fault(self.fault_unit, self.inst, offset, write, reason)
            self.counts.inc(f"vm.faults.bar{self.bar}")
            return None

    def write_run(self, offset: int, size: int, values: np.ndarray) -> bool:
        """Aligned stores of `size` (4 or 8) bytes at `offset` and on, one each of
        `values` (masked), inside one page: what that many `write`s do -- each counted
        and translated, the page checked present and writable for each -- made at once,
        where the page lands in plain VRAM through the BAR VM (a monitor, where one is
        installed, still shown each store).  False, having done nothing, where not (the
        caller then makes them one by one).  Why: KVM's coalesced ring hands a VMM
        page-table stores ~150 at a time, nearly all in a row."""
        n = len(values)
        last = offset + size * (n - 1)
        if n < 1 or size not in (4, 8) or offset & (size - 1) or offset < 0 or \
                (offset & 0xFFF) + size * n > 0x1000 or last + size > self.size or \
                not self.reg & regs.PBUS_BARVM_ENABLE:
            return False
        mmu = self.mmu
        mmu.actor = ("bar", self.bar, offset)  # whose walk it is, as `write` says first
        space = self.space()
        if space is None or last > space.limit:
            return False
        frame = self.page_frame(offset)  # present, writable VRAM, as each write checks
        if frame is None:
            return False
        self.counts.total[self._keys[1]] += n
        mmu.counters.total["vm.translations"] += n
        phys = frame + (offset & 0xFFF)
        if mmu.monitor is not None:
            for at in range(offset, last + size, size):
                mmu.actor = ("bar", self.bar, at)
                mmu.touch(regs.TARGET_VRAM, phys + at - offset, size, DATA, True)
        mmu.actor = ("bar", self.bar, last)
        self.vram.write_run(phys, size, values)
        return True

    def read(self, offset: int, size: int) -> int:
        self.counts.total[self._keys[0]] += 1
        where = self._translate(offset, size, False)
        if where is None:
            return (1 << (8 * size)) - 1
        target, phys = where
        if target == regs.TARGET_VRAM:
            return self.vram.read_bytes(phys, size)
        return int.from_bytes(self.mmu.view(target, phys, size).tobytes(), "little")

    def write(self, offset: int, size: int, value: int) -> tuple[int, int] | None:
        """Store through the aperture; returns where it landed (None if it faulted)."""
        self.counts.total[self._keys[1]] += 1
        where = self._translate(offset, size, True)
        if where is None:
            return None
        target, phys = where
        if target == regs.TARGET_VRAM:
            self.vram.write_bytes(phys, size, value)
        else:
            self.mmu.phys_write(target, phys,
                                    (value & ((1 << (8 * size)) - 1)).to_bytes(size, "little"))
        return where
