"""The physical GPU as a vGPU's parts and the scheduler may touch it, passed in rather
than reached through.

The mediator brings the device up through this port and hands it to every vGPU's
channels, shadowing and hypercalls and to the scheduler; none of them walks from its vGPU
to the mediator to the device, and the port never calls up into either.
"""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.gpu import Gpu

# a VM's counters of its waits for the mediator's lock (gpuvm run --detail shows them;
# traces carry them per event)
MEDIATOR_LOCK_WAITS = "mediator_lock.waits"
MEDIATOR_LOCK_WAIT_NS = "mediator_lock.wait_ns"
# counts that follow how the run's threads took turns, not the VM's work: every other
# count is the same on every rerun, and a VM alone never waits
WALL_CLOCK_COUNTERS = frozenset({MEDIATOR_LOCK_WAITS, MEDIATOR_LOCK_WAIT_NS})


def work_counters(counters: dict[str, int]) -> dict[str, int]:
    """`counters` less WALL_CLOCK_COUNTERS: what a rerun counts alike."""
    return {k: v for k, v in counters.items() if k not in WALL_CLOCK_COUNTERS}


class RunlistSource(Protocol):
    """A VM's channel table as the physical runlist's rebuild reads it: the port needs
    only this, not the vGPU."""
    def runlist_pchids(self) -> list[int]:
        """The physical channels one VM has on its runlist and bound, now."""
        ...


class HostPort:
    """The mediator's driver of the physical GPU: its BAR0 registers, the physical BAR1
    and BAR3 address spaces (each VM's arena is a window into them), the USERD poll
    area, TLB flushes of hypervisor-owned directories, the one physical runlist and the
    real GP_PUT write.

    Why a port of its own: the vGPUs' parts and the scheduler need exactly these few
    operations on the device; given this, they need neither the mediator nor the whole
    `Gpu`, and a doorbell or a translated register store reaches the device without a
    call back up through the vGPU or the mediator."""

    def __init__(self, gpu: Gpu, alloc: Callable[[int], int]) -> None:
        self.gpu = gpu
        # a physical BAR0 register read / write: the device's own, so a translated
        # register store goes from its trap handler straight to the device
        self.rd: Callable[[int], int] = gpu.reg_read
        self.wr: Callable[[int, int], None] = gpu.reg_write
        self._alloc = alloc  # zeroed hypervisor VRAM
        self.engine_writes = gpu.mmu.engine_writes  # VRAM pages the engines wrote
        # every VM's channel table, read at each rebuild of the physical runlist
        self.runlists: list[RunlistSource] = []
        self._bring_up()

    # ------------------------------------------------------------------ bring-up
    def _bar_vm(self, size: int) -> tuple[int, int, int]:
        """(instance, directory, small table) of one physical BAR VM, in hypervisor VRAM."""
        inst = self._alloc(regs.RAMIN_SIZE)
        pd = self._alloc(regs.PD_BYTES)
        pt = self._alloc(regs.SMALL_PTES_PER_PT * regs.PTE_SIZE)
        v = self.gpu.vram
        pd_lo, pd_hi = layout.ramin_ptr_words(pd)
        limit_lo, limit_hi = layout.ramin_limit_words(size - 1)
        v.write_u32(inst + regs.RAMIN_PD_LO, pd_lo)
        v.write_u32(inst + regs.RAMIN_PD_HI, pd_hi)
        v.write_u32(inst + regs.RAMIN_LIMIT_LO, limit_lo)
        v.write_u32(inst + regs.RAMIN_LIMIT_HI, limit_hi)
        v.u64[pd >> 3] = layout.pde_small(pt)
        return inst, pd, pt

    def _bring_up(self) -> None:
        prof = self.gpu.profile
        self.wr(regs.PMC_ENABLE, regs.PMC_ENABLE_PFIFO | regs.PMC_ENABLE_PGRAPH |
                regs.PMC_ENABLE_PCOPY0 | regs.PMC_ENABLE_PCOPY1 | regs.PMC_ENABLE_PTIMER)
        self.wr(regs.PFIFO_CTRL, regs.PFIFO_CTRL_ENABLE)
        self.wr(regs.PFIFO_INTR_EN, 0xFFFFFFFF)
        inst1, self.bar1_pd, self.bar1_pt = self._bar_vm(prof.bar1_size)
        inst3, self.bar3_pd, self.bar3_pt = self._bar_vm(prof.bar3_size)
        self.wr(regs.PBUS_BAR1_VM, layout.barvm_word(inst1))
        self.wr(regs.PBUS_BAR3_VM, layout.barvm_word(inst3))
        self.wr(regs.PFIFO_USERD_POLL, layout.userd_poll_word(0))  # poll area at BAR1 0
        self.runlist = self._alloc(regs.NUM_CHANNELS * regs.RUNLIST_ENTRY_SIZE)

    # ------------------------------------------------------------------ channels
    def flush(self, pd: int, bar_vm: bool = False) -> None:
        """A real TLB flush of a hypervisor-owned directory, through the flush registers."""
        self.wr(regs.PFFB_FLUSH_PD, layout.flush_pd_word(pd))
        self.wr(regs.PFFB_FLUSH_TRIGGER, regs.PFFB_TRIGGER_BAR_VM if bar_vm
                else regs.PFFB_TRIGGER_GO | regs.PFFB_TRIGGER_ALL_PAGES)

    def set_poll_page(self, pchid: int, userd: int | None) -> None:
        """Map physical channel pchid's USERD page in the poll area (None: unmap)."""
        self.gpu.vram.u64[(self.bar1_pt >> 3) + pchid] = 0 if userd is None else layout.pte(userd)
        self.flush(self.bar1_pd, bar_vm=True)

    def rebuild_runlist(self) -> None:
        """The physical runlist from every VM's runlist, as it is now."""
        chids = sorted(c for source in self.runlists for c in source.runlist_pchids())
        entries = layout.runlist_entries(chids)
        self.gpu.vram.u8[self.runlist:self.runlist + entries.nbytes] = entries.view(np.uint8)
        self.wr(regs.PFIFO_RUNLIST_ADDR, layout.runlist_word(self.runlist))
        self.wr(regs.PFIFO_RUNLIST_SUBMIT, len(chids))

    def kick(self, pchid: int) -> None:
        """Preempt a physical channel: the device drops the context it cached and loads
        the instance block afresh when the channel next runs."""
        self.wr(regs.PFIFO_KICK, pchid)

    def signal(self, pchid: int) -> None:
        """Make the device look at channel pchid again (a fault the mediator recorded)."""
        self.gpu.signal(pchid)

    # ------------------------------------------------------------------ the scheduler's GpuPort
    def now_ns(self) -> int:
        return self.gpu.device_time_ns()

    def ring(self, pchid: int, put: int) -> None:
        """The real GP_PUT write of physical channel pchid, through the USERD poll area."""
        self.gpu.mmio_write(regs.BAR1, pchid * regs.USERD_STRIDE + regs.USERD_GP_PUT, 4, put)

    def runnable(self, pchid: int) -> bool:
        gpu = self.gpu
        with gpu.lock:
            return pchid in gpu.pfifo.runlist and gpu.pfifo.channels[pchid].runnable
