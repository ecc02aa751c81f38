"""The vGPU's BAR0 trap table: for each register, what a guest access does.

Five kinds of handling, each counted under its own label:
- virtual: the guest sees its own copy (interrupt enables, PRAMIN base, poll base, the
  copy engines' next-channel registers, PGRAPH's interrupt word, ...);
- translated: forwarded after translating channel ids, instance blocks, addresses
  (channel table, runlist, kick, BAR VMs, TLB flush -> shadow sync);
- faked: what makes the guest see its partition (VRAM size registers, PGRAPH busy only
  for its own work);
- refused: channels beyond the partition, GPU-wide settings;
- passthrough: only the registers in PASSTHROUGH, each harmless to share (identity, the
  clock, flushes that complete at once), forwarded at their own offset.
Every register the device implements is in one of these (tests/test_mediator_traps.py
enumerates the device's BAR0 map against this table).  Any other access -- an offset the
table does not name, one that is not an aligned 4-byte word, a write to a register only
read here -- is refused by the vGPU (trap.refused.bar0): nothing reaches the device at a
guest's raw offset, which for a VM whose channels start at 16 is another VM's channel.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from functools import partial
from typing import Callable

from gpuvm.device import layout, regs
from gpuvm.device.blocks.ptimer import alarm_time
from gpuvm.device.engines import Engine
from gpuvm.device.gpu import Gpu
from gpuvm.mediator.channel_table import ChannelTable
from gpuvm.mediator.channels import Channels
from gpuvm.mediator.meter import VmMeter
from gpuvm.mediator.partition import Partition
from gpuvm.mediator.planted import planted
from gpuvm.mediator.shadowing import Shadowing
from gpuvm.mediator.vm_faults import VmFaults

Reader = Callable[[], int]
Writer = Callable[[int], None]

# (offset, "read"/"write") -> why sharing it between VMs is harmless
PASSTHROUGH: dict[tuple[int, str], str] = {
    (regs.PMC_BOOT_0, "read"): "the chip's identity: a constant",
    (regs.PFLUSH_FLUSH, "read"): "write-back flush status: always done in this model",
    (regs.PFLUSH_FLUSH, "write"): "write-back flush: completes at once, changes no state",
    (regs.PFFB_VM_CFG, "read"): "flush slots/done and the large-page size: read only",
}


@dataclass(frozen=True)
class TrapParts:
    """What the trap table's handlers use: the physical GPU (the state of its engines,
    PTIMER and interrupt records, read for this VM's view), the VM's virtual registers,
    its channel table and channels, shadowing, fault records, meter and partition, and
    its interrupt (`interrupt`, raised by its own PTIMER alarm).  Each handler is bound
    to the part that owns its decision, so a register store goes from the vGPU's
    `write` straight to that part."""

    gpu: Gpu
    vregs: dict[str, int]
    table: ChannelTable
    channels: Channels
    shadowing: Shadowing
    faults: VmFaults
    meter: VmMeter
    part: Partition
    interrupt: Callable[[], None]


def build(v: TrapParts) -> tuple[dict[int, tuple[str, Reader]], dict[int, tuple[str, Writer]]]:
    """The table: register offset -> (label, handler), for reads and for writes."""
    reads: dict[int, tuple[str, Reader]] = {}
    writes: dict[int, tuple[str, Writer]] = {}
    r = v.vregs
    ch = v.channels
    table = v.table
    faults = v.faults
    gpu = v.gpu
    refuse = v.meter.count

    def virtual(offset: int, name: str, writable: bool = True) -> None:
        # partials of the dict's own methods: no Python frame on the trap path
        reads[offset] = ("virtual", partial(r.__getitem__, name))
        if writable:
            writes[offset] = ("virtual", partial(r.__setitem__, name))

    for (offset, how) in PASSTHROUGH:
        if how == "read":
            reads[offset] = ("passthrough", partial(gpu.mmio_read, regs.BAR0, offset, 4))
        else:
            writes[offset] = ("passthrough", partial(gpu.mmio_write, regs.BAR0, offset, 4))
    virtual(regs.PMC_INTR_EN, "pmc_intr_en")
    virtual(regs.PMC_ENABLE, "pmc_enable")
    virtual(regs.PBUS_PRAMIN_BASE, "pramin_base")
    virtual(regs.PFIFO_INTR_EN, "pfifo_intr_en")
    virtual(regs.PFIFO_CTRL, "pfifo_ctrl")
    virtual(regs.PFIFO_RUNLIST_ADDR, "runlist_addr")
    virtual(regs.PFFB_FLUSH_PAGE, "flush_page")
    virtual(regs.PFFB_FLUSH_PD, "flush_pd")
    engine_intr_source = _engine_notify(v, reads, writes)
    pbdma_pending = _pbdma(v, reads, writes)
    pgraph_intr = _pgraph(v, reads, writes)

    def pfifo_intr() -> int:
        # VM_FAULT is a level of the fault unit mask (rnndb gf100_pfifo.xml), so nvkm's
        # handler, which acks 0x259c and never 0x2100 bit 28, sees it go
        # PBDMA likewise follows the VM's PBDMA records (and the mediator's own stops of
        # its channels, which have none: acked by the guest at 0x40108 or in 0x2100)
        value = faults.pfifo_intr() & ~regs.PFIFO_INTR_VM_FAULT
        return value | (regs.PFIFO_INTR_VM_FAULT if faults.fault_mask() else 0) | \
            (regs.PFIFO_INTR_PBDMA if pbdma_pending() else 0) | \
            (regs.PFIFO_INTR_RUNLIST if r["runlist_intr"] else 0) | \
            (regs.PFIFO_INTR_ENGINE if engine_intr_source() else 0)

    _timer(v, reads, writes)
    reads[regs.PMC_INTR] = ("virtual", lambda: (regs.PMC_INTR_PFIFO if pfifo_intr() &
                                                 r["pfifo_intr_en"] else 0) |
                            (regs.PMC_INTR_PGRAPH if pgraph_intr() else 0) |
                            (regs.PMC_INTR_PTIMER if r["ptimer_intr"] & r["ptimer_intr_en"]
                             else 0))
    # The runlist event interrupt is the guest's own: its status (0x2a00) is set when the
    # guest's runlist submission has been taken, and PFIFO_INTR bit 30 follows it (a level).
    reads[regs.PFIFO_INTR] = ("virtual", pfifo_intr)
    writes[regs.PFIFO_INTR] = ("virtual",
                               lambda value: faults.pfifo_intr_clear(value &
                                                                     ~regs.PFIFO_INTR_RUNLIST))
    reads[regs.PFIFO_INTR_RUNLIST_STATUS] = ("virtual", lambda: r["runlist_intr"])
    writes[regs.PFIFO_INTR_RUNLIST_STATUS] = ("virtual", lambda value: r.__setitem__(
        "runlist_intr", r["runlist_intr"] & ~value))
    reads[regs.PFIFO_FAULT_UNIT_MASK] = ("virtual", faults.fault_mask)
    writes[regs.PFIFO_FAULT_UNIT_MASK] = ("virtual", faults.fault_mask_clear)
    for unit in range(regs.PFIFO_FAULT_UNITS):
        base = regs.PFIFO_FAULT_RECORD + unit * regs.PFIFO_FAULT_RECORD_STRIDE
        for i in range(4):
            reads[base + 4 * i] = ("virtual", partial(faults.fault_record, unit, i))

    reads[regs.PFIFO_USERD_POLL] = ("virtual", lambda: table.userd_poll)
    writes[regs.PFIFO_USERD_POLL] = ("channel", ch.set_userd_poll)  # changes what is remapped
    reads[regs.PFIFO_RUNLIST_SUBMIT] = ("virtual", lambda: r["runlist_len"])

    def runlist_submit(value: int) -> None:
        r["runlist_len"] = value & regs.PFIFO_RUNLIST_LEN_MASK
        ch.runlist_submit(r["runlist_addr"], value & regs.PFIFO_RUNLIST_LEN_MASK)
        r["runlist_intr"] |= regs.PFIFO_RUNLIST_EVENT_DONE

    writes[regs.PFIFO_RUNLIST_SUBMIT] = ("runlist", runlist_submit)
    reads[regs.PFIFO_RUNLIST_STATUS] = ("virtual", lambda: 0)
    reads[regs.PFIFO_KICK] = ("virtual", lambda: table.kick)
    writes[regs.PFIFO_KICK] = ("channel", ch.kick_write)
    for c in range(v.part.channels):
        word = regs.PFIFO_CHAN_TABLE + c * regs.PFIFO_CHAN_STRIDE
        state = regs.PFIFO_CHAN_STATE + c * regs.PFIFO_CHAN_STRIDE
        error = regs.PFIFO_CHAN_ERROR_EXT + c * regs.PFIFO_CHAN_ERROR_STRIDE_EXT
        # partials of the channels' own methods: the store goes straight to its owner
        reads[word] = ("channel", partial(ch.table_read, c))
        writes[word] = ("channel", partial(ch.table_write, c))
        reads[state] = ("channel", partial(ch.state_read, c))
        writes[state] = ("channel", partial(ch.state_write, c))
        reads[error] = ("channel", partial(ch.error_read, c))
    for c in range(v.part.channels, regs.NUM_CHANNELS):  # channels beyond the partition
        for off in (regs.PFIFO_CHAN_TABLE + c * regs.PFIFO_CHAN_STRIDE,
                    regs.PFIFO_CHAN_STATE + c * regs.PFIFO_CHAN_STRIDE,
                    regs.PFIFO_CHAN_ERROR_EXT + c * regs.PFIFO_CHAN_ERROR_STRIDE_EXT):
            reads[off] = ("refused", lambda: 0)
            writes[off] = ("refused", lambda value: refuse("trap.refused.channel_id", 1))

    reads[regs.PBUS_BAR1_VM] = ("virtual", lambda: r["bar1_vm"])
    writes[regs.PBUS_BAR1_VM] = ("bar_vm", partial(v.shadowing.set_bar_vm, regs.BAR1))
    reads[regs.PBUS_BAR3_VM] = ("virtual", lambda: r["bar3_vm"])
    writes[regs.PBUS_BAR3_VM] = ("bar_vm", partial(v.shadowing.set_bar_vm, regs.BAR3))
    writes[regs.PFFB_FLUSH_TRIGGER] = ("tlb_flush", v.shadowing.guest_flush)
    reads[regs.PFFB_FLUSH_TRIGGER] = ("virtual", lambda: 0)
    # the large-page size is one setting for the whole GPU: a guest may not change it
    writes[regs.PFFB_VM_CFG] = ("refused", lambda value: refuse("trap.refused.vm_cfg", 1))

    # the guest sees a GPU with one memory partition the size of its slice
    reads[regs.PFB_PART_COUNT] = ("faked", lambda: 1)
    for p in range(regs.PFB_MAX_PARTS):
        size = v.part.vram_size // regs.MiB if p == 0 else 0
        reads[regs.PFBPA_PART_SIZE_MIB + p * regs.PFBPA_PART_STRIDE] = ("faked", lambda s=size: s)
    for engine, base in ((gpu.engines.copy0, regs.BLOCK_PCOPY0),
                         (gpu.engines.copy1, regs.BLOCK_PCOPY1)):
        reads[base + regs.PCOPY_CUR_CHAN] = ("channel", partial(_pcopy_channel, table, engine))
        # the next-channel register is a mailbox between driver and engine: shared, two
        # VMs could signal each other through it; each VM gets its own
        if planted("shared-pcopy-next"):
            off = base + regs.PCOPY_NEXT_CHAN
            reads[off] = ("passthrough", partial(gpu.mmio_read, regs.BAR0, off, 4))
            writes[off] = ("passthrough", partial(gpu.mmio_write, regs.BAR0, off, 4))
        else:
            virtual(base + regs.PCOPY_NEXT_CHAN, f"pcopy_next_{base:x}")
    reads[regs.PGRAPH_STATUS] = ("faked", partial(_pgraph_busy, gpu, table))
    return reads, writes


def _pgraph_busy(gpu: Gpu, table: ChannelTable) -> int:
    """PGRAPH_STATUS as this VM may see it: busy only while working for its channels."""
    engine = gpu.engines.graph
    inst = engine.current_inst
    mine = any(ch.bound and ch.shadow_inst == inst for ch in table.by_vchid.values())
    return int(mine and engine.busy(gpu.clock.now_ns()))


def _pcopy_channel(table: ChannelTable, engine: Engine) -> int:
    """PCOPY_CUR_CHAN as this VM may see it: its own channel's instance, else none."""
    inst = engine.current_inst
    for ch in table.by_vchid.values():
        if ch.bound and ch.shadow_inst == inst:
            return layout.pcopy_chan_word(ch.guest_inst)
    return 0


def _timer(v: TrapParts, reads: dict[int, tuple[str, Reader]],
           writes: dict[int, tuple[str, Writer]]) -> None:
    """Each VM's own PTIMER: the GPU clock plus the offset its TIME writes set, its own
    alarm and interrupt.  A VM that sets the time or arms an alarm changes nothing for
    another; its alarm raises its own MSI (the device calls back at the device time)."""
    r = v.vregs
    gpu = v.gpu
    ptimer = gpu.ptimer
    # an alarm left armed must not keep a removed vGPU alive: its meter and interrupt
    # are reached through weak references
    meter = weakref.ref(v.meter)
    interrupt = weakref.WeakMethod(v.interrupt)
    key = ("vgpu-ptimer", id(v.vregs))

    def counter() -> int:
        return (gpu.clock.now_ns() + r["ptimer_offset"]) % (1 << 64)

    def fired() -> None:  # device lock held, on the engine thread
        m, raise_irq = meter(), interrupt()
        if m is None or raise_irq is None:
            return
        r["ptimer_intr"] |= regs.PTIMER_INTR_ALARM
        m.count("ptimer.alarms", 1)
        raise_irq()
        arm(again=True)  # the low word comes round again in 2^32 ns

    def arm(again: bool = False) -> None:
        if r["ptimer_intr_en"] & regs.PTIMER_INTR_ALARM:
            now = gpu.clock.now_ns()
            when = alarm_time(now + r["ptimer_offset"], r["ptimer_alarm"])
            ptimer.call_at(key, now + (when or (1 << 32) if again else when), fired)
        else:
            ptimer.call_at(key, None)

    def setter(name: str, rearm: bool) -> Writer:
        def write(value: int) -> None:
            r[name] = value
            if rearm:
                with gpu.lock:
                    arm()
        return write

    def time_0(value: int) -> None:
        r["ptimer_offset"] = ((r["ptimer_time_1"] << 32) | value) - gpu.clock.now_ns()
        with gpu.lock:
            arm()

    reads[regs.PTIMER_TIME_0] = ("virtual", lambda: counter() & regs.PTIMER_TIME_0_MASK)
    reads[regs.PTIMER_TIME_1] = ("virtual", lambda: (counter() >> 32) & 0xFFFFFFFF)
    writes[regs.PTIMER_TIME_0] = ("virtual", time_0)
    writes[regs.PTIMER_TIME_1] = ("virtual", setter("ptimer_time_1", False))
    reads[regs.PTIMER_ALARM_0] = ("virtual", lambda: r["ptimer_alarm"])
    writes[regs.PTIMER_ALARM_0] = ("virtual", setter("ptimer_alarm", True))
    reads[regs.PTIMER_INTR_EN_0] = ("virtual", lambda: r["ptimer_intr_en"])
    writes[regs.PTIMER_INTR_EN_0] = ("virtual", setter("ptimer_intr_en", True))
    reads[regs.PTIMER_INTR_0] = ("virtual", lambda: r["ptimer_intr"])
    writes[regs.PTIMER_INTR_0] = ("virtual", lambda value: r.__setitem__(
        "ptimer_intr", r["ptimer_intr"] & ~value))
    for off, name in ((regs.PTIMER_NUMERATOR, "ptimer_num"), (regs.PTIMER_DENOMINATOR,
                                                             "ptimer_den")):
        reads[off] = ("virtual", lambda n=name: r[n])
        writes[off] = ("virtual", setter(name, False))


def _engine_notify(v: TrapParts, reads: dict[int, tuple[str, Reader]],
                   writes: dict[int, tuple[str, Writer]]) -> Reader:
    """PFIFO's engine interrupts as this VM sees them: the non-stall interrupt
    (NOTIFY_INTR) its own channels raised and it has not acknowledged.  Returns the
    reader of ENGINE_INTR_SOURCE (PFIFO_INTR bit 31 is its level)."""
    r, pfifo, table = v.vregs, v.gpu.pfifo, v.table

    def engine_intr(engn: int) -> int:
        pending = engn == regs.FIFO_ENGINE_PGRAPH and any(
            pchid in pfifo.notify_chids for pchid in table.bound_pchids())
        return regs.PFIFO_ENGINE_INTR_NOTIFY if pending else 0

    def source() -> int:
        return (1 << regs.FIFO_ENGINE_PGRAPH) if engine_intr(regs.FIFO_ENGINE_PGRAPH) & \
            r["engine_intr_en"] else 0

    def ack(engn: int, value: int) -> None:
        if engn == regs.FIFO_ENGINE_PGRAPH and value & regs.PFIFO_ENGINE_INTR_NOTIFY:
            for c in table.by_vchid.values():
                pfifo.notify_chids.discard(c.pchid)

    reads[regs.PFIFO_ENGINE_INTR_SOURCE] = ("virtual", source)
    for engn in range(regs.PFIFO_ENGINE_INTR_COUNT):
        off = regs.PFIFO_ENGINE_INTR + engn * regs.PFIFO_ENGINE_INTR_STRIDE
        reads[off] = ("virtual", lambda e=engn: engine_intr(e))
        writes[off] = ("channel", lambda value, e=engn: ack(e, value))
    reads[regs.PFIFO_ENGINE_INTR_EN] = ("virtual", partial(r.__getitem__, "engine_intr_en"))
    writes[regs.PFIFO_ENGINE_INTR_EN] = ("virtual", partial(r.__setitem__, "engine_intr_en"))
    return source


def _pbdma(v: TrapParts, reads: dict[int, tuple[str, Reader]],
           writes: dict[int, tuple[str, Writer]]) -> Callable[[], bool]:
    """The PBDMA as this VM sees it: the oldest record of its own channels, its channel id
    its own, its acknowledgement clearing only that.  Returns whether one is pending."""
    r, gpu, table = v.vregs, v.gpu, v.table

    def record() -> tuple[int, list[int]] | None:
        mine = table.bound_pchids()
        for pchid, words in list(gpu.pbdma.traps.items()):
            if pchid in mine:
                return pchid, words
        return None

    def word(i: int) -> int:
        found = record()
        if found is None:
            return 0
        return table.bound_pchids().get(found[0], 0) if i < 0 else found[1][i]

    def ack(value: int) -> None:
        found = record()
        if found is not None:
            with gpu.lock:
                gpu.pbdma.ack(found[0], value)
        v.faults.pfifo_intr_clear(regs.PFIFO_INTR_PBDMA)  # the VM's own latched copy of the bit

    reads[regs.PFIFO_PBDMA_INTR_SOURCE] = ("virtual", lambda: 1 if record() else 0)
    writes[regs.PFIFO_PBDMA_INTR_SOURCE] = ("virtual", lambda value: None)  # a level
    reads[regs.PBDMA_INTR] = ("virtual", lambda: word(0))
    writes[regs.PBDMA_INTR] = ("channel", ack)
    reads[regs.PBDMA_METHOD0] = ("virtual", lambda: word(1))
    writes[regs.PBDMA_METHOD0] = ("virtual", lambda value: None)  # the method is skipped
    reads[regs.PBDMA_DATA0] = ("virtual", lambda: word(2))
    reads[regs.PBDMA_CHAN] = ("virtual", lambda: word(-1))
    for off, name, mask in ((regs.PBDMA_INTR_EN, "pbdma_intr_en", 0xFFFFFFFF),
                            (regs.PBDMA_CONFIG, "pbdma_config", 0xFFFFFFFF),
                            (regs.PFIFO_PBDMA_ENABLE, "pbdma_enable",
                             (1 << regs.PBDMA_COUNT) - 1),
                            (regs.PMC_PBDMA_ENABLE, "pmc_pbdma_enable",
                             (1 << regs.PBDMA_COUNT) - 1)):
        reads[off] = ("virtual", lambda n=name: r[n])
        writes[off] = ("virtual", lambda value, n=name, m=mask: r.__setitem__(n, value & m))
    return lambda: record() is not None


def _pgraph(v: TrapParts, reads: dict[int, tuple[str, Reader]],
            writes: dict[int, tuple[str, Writer]]) -> Reader:
    """PGRAPH's interrupt word as this VM sees it -- the NOTIFY and ILLEGAL_MTHD its own
    channels raised (another VM's would tell it about that VM's work) -- with the trapped
    method of its own oldest record.  Returns the PGRAPH_INTR reader."""
    r, gpu, table = v.vregs, v.gpu, v.table

    def trap() -> tuple[int, list[int]] | None:
        mine = table.bound_pchids()
        for pchid, words in list(gpu.pgraph.traps.items()):
            if pchid in mine:
                return pchid, words
        return None

    def intr() -> int:
        notify = any(pchid in gpu.pgraph.notify_chids for pchid in table.bound_pchids())
        return (regs.PGRAPH_INTR_NOTIFY if notify else 0) | \
            (regs.PGRAPH_INTR_ILLEGAL_MTHD if trap() else 0)

    def ack(value: int) -> None:
        if value & regs.PGRAPH_INTR_NOTIFY:
            for c in table.by_vchid.values():
                gpu.pgraph.notify_chids.discard(c.pchid)
        if value & regs.PGRAPH_INTR_ILLEGAL_MTHD:
            found = trap()
            if found is not None:
                with gpu.lock:
                    gpu.pgraph.ack_trap(found[0])

    reads[regs.PGRAPH_INTR] = ("virtual", intr)
    writes[regs.PGRAPH_INTR] = ("channel", ack)
    for off, i in ((regs.PGRAPH_TRAP_ADDR, 0), (regs.PGRAPH_TRAP_DATA, 1)):
        reads[off] = ("virtual", lambda i=i: (trap() or (0, [0, 0]))[1][i])
    reads[regs.PGRAPH_FIFO_ACCESS] = ("virtual", partial(r.__getitem__, "pgraph_fifo_access"))
    writes[regs.PGRAPH_FIFO_ACCESS] = ("virtual",
                                       partial(r.__setitem__, "pgraph_fifo_access"))
    return intr
