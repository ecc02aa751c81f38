"""A VM's virtual GPU: where its trapped BAR accesses land.

This is the GpuTarget a VMM hands a mediated guest's accesses to.  BAR0 goes through the
trap table (bar0_traps); the PRAMIN window is translated into the VM's slice; BAR1 and
BAR3 are forwarded into the VM's arena of the physical BARs (translated by the shadow of
the guest's BAR VM), except the USERD poll area, where doorbells are caught.  Writes that
land in a sensitive page (a shadowed instance block) are reflected into its shadow.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Callable

from gpuvm.device import regs
from gpuvm.device.engines import Engine
from gpuvm.device.faults import ChannelFault, fault_flags
from gpuvm.mediator import bar0_traps
from gpuvm.mediator.channels import Channels
from gpuvm.mediator.hypercalls import Hypercalls
from gpuvm.mediator.modes import Mode
from gpuvm.mediator.partition import Partition
from gpuvm.mediator.shadowing import Shadowing
from gpuvm.vmm.guest_ram import GuestRam
from shadow.bar_window import NOT_VRAM
from shadow.entries import EntryPolicy

if TYPE_CHECKING:
    from gpuvm.mediator.mediator import Mediator

_PRAMIN_END = regs.PRAMIN_WINDOW + regs.PRAMIN_WINDOW_SIZE
_UNLOCKED = frozenset({"virtual", "faked", "refused"})


class VGpu:
    def __init__(self, med: "Mediator", name: str, part: Partition, mode: Mode,
                 ram: GuestRam) -> None:
        self.med = med
        self.name = name
        self.part = part
        self.mode = mode
        self.ram = ram
        self.policy = EntryPolicy(part.vram_base, part.vram_size, part.sys_base, ram.size)
        self.counts: defaultdict[str, int] = defaultdict(int)
        self.vregs: dict[str, int] = defaultdict(int)
        self._fault_records = [[0, 0, 0, 0] for _ in range(regs.PFIFO_FAULT_UNITS)]
        self._fault_mask = 0
        self._pfifo_intr = 0
        self._faults_seen = 0
        self.channels = Channels(self)
        self.shadowing = Shadowing(self)
        self.hypercalls = Hypercalls(self)
        reads, writes = bar0_traps.build(self)
        # Virtual, faked and refused registers touch only this VM's own state (written by
        # this VM's vCPU alone), so they skip the mediator lock: it costs more than the
        # rest of a trap on this host.
        self._r0 = {off: (f"trap.bar0.{label}.read", fn, label not in _UNLOCKED)
                    for off, (label, fn) in reads.items()}
        self._w0 = {off: (f"trap.bar0.{label}.write", fn, label not in _UNLOCKED)
                    for off, (label, fn) in writes.items()}
        self._vram = med.gpu.vram
        # Physical channels are reused by later VMs: count only what happens from now on.
        self._device_baseline = self._device_channel_counts()

    def count(self, name: str, n: int) -> None:
        self.counts[name] += n

    def guest_u32(self, guest_addr: int) -> int:
        return self._vram.read_u32(self.policy.host_vram(guest_addr))

    # ------------------------------------------------------------------ GpuTarget
    def mmio_read(self, bar: int, offset: int, size: int) -> int:
        if bar == 0:  # BAR0; a literal keeps a global lookup off the trap path
            handler = self._r0.get(offset)
            if handler is not None and size == 4:
                self.counts[handler[0]] += 1
                if not handler[2]:
                    return handler[1]()
                with self.med.lock:
                    return handler[1]()
            if regs.PRAMIN_WINDOW <= offset < _PRAMIN_END:
                return self._pramin(offset, size, None)
            self.counts["trap.bar0.passthrough.read"] += 1
            return self.med.gpu.mmio_read(bar, offset, size)
        with self.med.lock:
            return self._bar_access(bar, offset, size, None)

    def mmio_write(self, bar: int, offset: int, size: int, value: int) -> None:
        if bar == 0:  # BAR0; a literal keeps a global lookup off the trap path
            handler = self._w0.get(offset)
            if handler is not None and size == 4:
                self.counts[handler[0]] += 1
                if not handler[2]:
                    handler[1](value)
                    return
                with self.med.lock:
                    handler[1](value)
                return
            if regs.PRAMIN_WINDOW <= offset < _PRAMIN_END:
                self._pramin(offset, size, value)
                return
            self.counts["trap.bar0.passthrough.write"] += 1
            self.med.gpu.mmio_write(bar, offset, size, value)
            return
        with self.med.lock:
            self._bar_access(bar, offset, size, value)

    def wait_event(self, predicate: Callable[[], bool], timeout: float) -> bool:
        return self.med.gpu.wait_event(predicate, timeout)

    def faults(self) -> list[ChannelFault]:
        mine = []
        for f in self.med.gpu.faults():
            vchid = f.chid - self.part.chid_base
            if 0 <= vchid < self.part.channels and self.med.owner.get(f.chid) is self:
                mine.append(ChannelFault(vchid, f.reason, f.address, f.engine, f.code, f.unit,
                                         f.vm_reason, f.write))
        return mine

    def _device_channel_counts(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        per_chan = self.med.gpu.counts.per_channel
        with self.med.gpu.lock:
            for c in range(self.part.chid_base, self.part.chid_base + self.part.channels):
                for name, value in per_chan.get(c, {}).items():
                    out[name] += value
        return out

    def counters(self) -> dict[str, int]:
        out = dict(self.counts)
        for name, value in self._device_channel_counts().items():
            delta = value - self._device_baseline.get(name, 0)
            if delta:
                out[name] = out.get(name, 0) + delta
        out["remap.pages"] = self.shadowing.remapped_pages()
        slots = getattr(self.shadowing.remapper, "slots_in_use", None)
        if slots is not None:
            out["remap.memslots"] = slots()
        return out

    def device_time_ns(self) -> int:
        return self.med.gpu.device_time_ns()

    def hypercall(self, ram: GuestRam, gpa: int) -> None:
        self.hypercalls.handle(ram, gpa)

    # ------------------------------------------------------------------ PRAMIN
    def _pramin(self, offset: int, size: int, value: int | None) -> int:
        kind = "read" if value is None else "write"
        self.counts[f"trap.bar0.pramin.{kind}"] += 1
        addr = (self.vregs["pramin_base"] << regs.PBUS_PRAMIN_BASE_SHIFT) + \
            offset - regs.PRAMIN_WINDOW
        if size != 4 or offset & 3 or not self.policy.guest_vram_ok(addr, 4):
            self.count("trap.refused.pramin", 1)
            return 0xFFFFFFFF
        host = self.policy.host_vram(addr)
        if value is None:
            return self._vram.read_u32(host)
        with self.med.lock:
            self._vram.write_u32(host, value)
            self.channels.reflect(addr)
        return 0

    # ------------------------------------------------------------------ BAR1 / BAR3
    def _bar_access(self, bar: int, offset: int, size: int, value: int | None) -> int:
        kind = "read" if value is None else "write"
        if bar == regs.BAR1:
            slot = self.channels.userd_slot(offset)
            if slot is not None:
                ch, reg = slot
                self.counts[f"trap.bar1.userd.{kind}"] += 1
                if value is None:
                    return self.channels.userd_read(ch, reg, size)
                self.channels.userd_write(ch, reg, size, value)
                return 0
            window, arena = self.shadowing.bar1, self.part.bar1_base
        elif bar == regs.BAR3:
            window, arena = self.shadowing.bar3, self.part.bar3_base
        else:
            self.count("trap.refused.bar", 1)
            return (1 << (8 * size)) - 1
        self.counts[f"trap.bar{bar}.forward.{kind}"] += 1
        page = offset >> 12
        if offset < 0 or page >= window.pages or (offset & 0xFFF) + size > 0x1000:
            self.count(f"trap.refused.bar{bar}", 1)
            return (1 << (8 * size)) - 1
        phys_pte = int(self._vram.u64[(window.phys_pt >> 3) + window.first + page])
        if not phys_pte & regs.PTE_PRESENT:
            self._bar_fault(bar, offset, value is not None)
            return (1 << (8 * size)) - 1
        if value is None:
            return self.med.gpu.mmio_read(bar, arena + offset, size)
        self.med.gpu.mmio_write(bar, arena + offset, size, value)
        host = int(window.host_pages[page])
        if host != NOT_VRAM:
            self.channels.reflect(host - self.policy.vram_base)
        return 0

    def _bar_fault(self, bar: int, offset: int, write: bool) -> None:
        unit = regs.FAULT_UNIT_BAR1 if bar == regs.BAR1 else regs.FAULT_UNIT_BAR3
        inst = (self.vregs["bar1_vm" if bar == regs.BAR1 else "bar3_vm"]
                & regs.PBUS_BARVM_INST_MASK)
        self._fault_records[unit] = [inst, offset & 0xFFFFFFFF, offset >> 32,
                                     fault_flags(unit, regs.FAULT_PAGE_NOT_PRESENT, write)]
        self._fault_mask |= 1 << unit
        self._pfifo_intr |= regs.PFIFO_INTR_VM_FAULT
        self.count(f"vm.faults.bar{bar}", 1)

    # ------------------------------------------------------------------ handlers used by bar0_traps
    def set_bar_vm(self, bar: int, value: int) -> None:
        self.vregs["bar1_vm" if bar == regs.BAR1 else "bar3_vm"] = value
        self.shadowing.bind_window(bar, value)

    def set_userd_poll(self, value: int) -> None:
        self.channels.userd_poll = value
        self.shadowing.refresh_remap()

    def runlist_submit(self, value: int) -> None:
        self.vregs["runlist_len"] = value & regs.PFIFO_RUNLIST_LEN_MASK
        self.channels.runlist_submit(self.vregs["runlist_addr"], value & regs.PFIFO_RUNLIST_LEN_MASK)

    def runlist_pchids(self) -> list[int]:
        return self.channels.runlist_pchids()

    def tlb_flush(self, trigger: int) -> None:
        self.shadowing.guest_flush(self.vregs["flush_pd"], trigger)

    def pcopy_channel(self, engine: Engine) -> int:
        inst = engine.current_inst
        for ch in self.channels.by_vchid.values():
            if ch.bound and ch.shadow_inst == inst:
                return (ch.guest_inst >> 12) | regs.PCOPY_CHAN_VALID
        return 0

    # ------------------------------------------------------------------ virtual interrupts/faults
    def _collect_faults(self) -> None:
        """Turn device faults of this VM's channels into its own fault records."""
        faults = self.faults()
        for f in faults[self._faults_seen:]:
            ch = self.channels.by_vchid.get(f.chid)
            if f.unit >= 0:
                inst = (ch.guest_inst >> 12) if ch and ch.guest_inst else 0
                self._fault_records[f.unit] = [
                    inst, f.address & 0xFFFFFFFF, f.address >> 32,
                    fault_flags(f.unit, f.vm_reason, f.write)]
                self._fault_mask |= 1 << f.unit
                self._pfifo_intr |= regs.PFIFO_INTR_VM_FAULT
            else:
                self._pfifo_intr |= regs.PFIFO_INTR_PBDMA
        self._faults_seen = len(faults)

    def pfifo_intr(self) -> int:
        self._collect_faults()
        return self._pfifo_intr

    def pfifo_intr_clear(self, value: int) -> None:
        self._collect_faults()
        self._pfifo_intr &= ~value

    def pmc_intr(self) -> int:
        return regs.PMC_INTR_PFIFO if self.pfifo_intr() else 0

    def fault_mask(self) -> int:
        self._collect_faults()
        return self._fault_mask

    def fault_mask_clear(self, value: int) -> None:
        self._fault_mask &= ~value

    def fault_record(self, unit: int, word: int) -> int:
        self._collect_faults()
        return self._fault_records[unit][word]

    # ------------------------------------------------------------------ lifecycle
    def set_remapper(self, remapper) -> None:
        with self.med.lock:
            self.shadowing.remapper = remapper
            self.shadowing.refresh_remap()

    def teardown(self) -> None:
        self.channels.teardown()
        self.shadowing.teardown()
