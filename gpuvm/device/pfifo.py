"""PFIFO: the channel table, the runlist, doorbells, VM-fault records, and the round-robin
service of runnable channels that the device's engine thread performs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.channel import Channel, ChannelExecutor
from gpuvm.device.faults import CHAN_ERROR_NAMES, ChannelFault, fault_flags
from gpuvm.device.mmio_bus import RegisterBlock
from gpuvm.device.mmu import CONTEXT, FAULT_NAMES, DmaFault, VmFault

if TYPE_CHECKING:
    from gpuvm.device.gpu import Gpu

SERVICE_SLICE_S = 0.005  # wall time one service call may hold the device lock
ACQUIRE_POLL_WALL_S = 0.001  # an unsatisfied acquire is polled at most this often

UNIT_NAMES = {regs.FAULT_UNIT_PGRAPH: "PGRAPH", regs.FAULT_UNIT_BAR1: "BAR1",
              regs.FAULT_UNIT_BAR3: "BAR3", regs.FAULT_UNIT_PFIFO: "PFIFO",
              regs.FAULT_UNIT_PCOPY0: "PCOPY0", regs.FAULT_UNIT_PCOPY1: "PCOPY1"}


# the PBDMA reason a stopping channel error shows (nvkm names only a few; the rest are
# the engines' errors, which this model reports through CHAN_ERROR_EXT)
_PBDMA_REASON = {
    regs.CHAN_ERR_IB_EMPTY_EXT: regs.PBDMA_INTR_GPENTRY,
    regs.CHAN_ERR_BAD_GPFIFO_ENTRY_EXT: regs.PBDMA_INTR_GPENTRY,
    regs.CHAN_ERR_BAD_METHOD_HEADER_EXT: regs.PBDMA_INTR_PBENTRY,
    regs.CHAN_ERR_DMA_TARGET_EXT: regs.PBDMA_INTR_MEMREQ,
}


class Pfifo(RegisterBlock):
    name, start, size = "pfifo", regs.BLOCK_PFIFO, 0x2000

    def __init__(self, gpu: "Gpu") -> None:
        super().__init__()
        self.gpu = gpu
        self.executor = ChannelExecutor(gpu)
        self.intr = 0  # latched bits; PFIFO_INTR_RUNLIST is derived (see intr_status)
        self.runlist_intr = 0  # PFIFO_INTR_RUNLIST_STATUS
        self.intr_en = 0
        self.ctrl = 0
        self.userd_poll = 0
        self.runlist_addr = 0
        self.runlist_len = 0
        self.runlist: list[int] = []
        self.kick = 0
        self.fault_mask = 0
        # channels whose NOTIFY_INTR (the non-stall interrupt) is not acknowledged yet;
        # the register view is one bit, the set lets a mediator show each VM its own
        self.notify_chids: set[int] = set()
        # subchannel objects of unbound channels by instance (the engine contexts a
        # rebind of the same instance picks up): inst -> ((GP_PUT, GP_GET) saved, objects)
        self.saved_objects: dict[int, tuple[tuple[int, int], dict]] = {}
        self.engine_intr_en = 0
        self.fault_records = [[0, 0, 0, 0] for _ in range(regs.PFIFO_FAULT_UNITS)]
        self.channels = [Channel(c) for c in range(regs.NUM_CHANNELS)]
        self.faults: list[ChannelFault] = []
        self.cut_short = False  # the last service call stopped at its time slice
        # host time spent running each channel's turns (this process's, under the
        # device lock): what one VM's commands cost the others where the device is
        # shared -- not a device counter (it depends on the host), so kept apart
        self.host_ns = [0] * regs.NUM_CHANNELS
        # Called (under the device lock) with a chid when that channel runs out of work.
        self.idle_listeners: list[Callable[[int, int], None]] = []
        for ch in self.channels:
            ch.counts = lambda name, n, c=ch.chid: gpu.counts.chan(c, name, n)
        self._register()

    def _register(self) -> None:
        self.reg(regs.PFIFO_INTR, read=self.intr_status, write=self._clear_intr)
        self.reg(regs.PFIFO_INTR_RUNLIST_STATUS, read=lambda: self.runlist_intr,
                 write=self._ack_runlist_intr)
        self.reg(regs.PFIFO_INTR_EN, read=lambda: self.intr_en, write=self._set_intr_en, plain=True)
        self.reg(regs.PFIFO_CTRL, read=lambda: self.ctrl, write=self._set_ctrl)
        self.reg(regs.PFIFO_USERD_POLL, read=lambda: self.userd_poll, write=self._set_poll, plain=True)
        self.reg(regs.PFIFO_RUNLIST_ADDR, read=lambda: self.runlist_addr,
                 write=self._set_runlist_addr, plain=True)
        self.reg(regs.PFIFO_RUNLIST_SUBMIT, read=lambda: self.runlist_len,
                 write=self._submit_runlist)
        self.reg(regs.PFIFO_RUNLIST_STATUS, read=lambda: 0)  # submission is synchronous
        self.reg(regs.PFIFO_KICK, read=lambda: self.kick, write=self._kick)
        self.reg(regs.PFIFO_FAULT_UNIT_MASK, read=lambda: self.fault_mask,
                 write=self._clear_fault_mask)
        self.reg(regs.PFIFO_ENGINE_INTR_SOURCE, read=self.engine_intr_source)
        self.reg(regs.PFIFO_PBDMA_INTR_SOURCE, read=lambda: 1 if self.gpu.pbdma.traps else 0,
                 write=lambda v: None)  # a level: gone once PBDMA_INTR is acked
        self.pbdma_enable = 0
        self.reg(regs.PFIFO_PBDMA_ENABLE, read=lambda: self.pbdma_enable,
                 write=self._set_pbdma_enable, plain=True)
        for engn in range(regs.PFIFO_ENGINE_INTR_COUNT):
            self.reg(regs.PFIFO_ENGINE_INTR + engn * regs.PFIFO_ENGINE_INTR_STRIDE,
                     read=lambda e=engn: self.engine_intr(e),
                     write=lambda v, e=engn: self._ack_engine_intr(e, v))
        self.reg(regs.PFIFO_ENGINE_INTR_EN, read=lambda: self.engine_intr_en,
                 write=self._set_engine_intr_en, plain=True)
        for unit in range(regs.PFIFO_FAULT_UNITS):
            base = regs.PFIFO_FAULT_RECORD + unit * regs.PFIFO_FAULT_RECORD_STRIDE
            for i in range(4):
                self.reg(base + 4 * i, read=lambda u=unit, k=i: self.fault_records[u][k])
        for c in range(regs.NUM_CHANNELS):
            ch = self.channels[c]
            self.reg(regs.PFIFO_CHAN_TABLE + c * regs.PFIFO_CHAN_STRIDE,
                     read=lambda ch=ch: ch.table, write=lambda v, ch=ch: self._set_table(ch, v))
            self.reg(regs.PFIFO_CHAN_STATE + c * regs.PFIFO_CHAN_STRIDE,
                     read=lambda ch=ch: ch.state, write=lambda v, ch=ch: self._set_state(ch, v))
            self.reg(regs.PFIFO_CHAN_ERROR_EXT + c * regs.PFIFO_CHAN_ERROR_STRIDE_EXT,
                     read=lambda ch=ch: (regs.PFIFO_CHAN_ERROR_FAULTED_EXT | ch.error)
                     if ch.error else 0)

    # ------------------------------------------------------------------ registers
    def intr_status(self) -> int:
        """PFIFO_INTR: the latched bits (CHAN_TABLE, SCHED), and the levels rnndb marks as
        such: VM_FAULT while a fault unit is pending, PBDMA while a PBDMA record is, the
        runlist event while 0x2a00 has anything set, ENGINE while 0x25a4 does.  nvkm acks
        those at their sources, never in 0x2100."""
        return self.intr | (regs.PFIFO_INTR_VM_FAULT if self.fault_mask else 0) | \
            (regs.PFIFO_INTR_PBDMA if self.gpu.pbdma.traps else 0) | \
            (regs.PFIFO_INTR_RUNLIST if self.runlist_intr else 0) | \
            (regs.PFIFO_INTR_ENGINE if self.engine_intr_source() else 0)

    def _set_pbdma_enable(self, value: int) -> None:
        self.pbdma_enable = value & ((1 << regs.PBDMA_COUNT) - 1)  # the PBDMAs there are

    def skip_method(self, ch: Channel, reason: int, subc: int, method: int, data: int) -> None:
        """A method the PBDMA will not pass on (ILLEGAL_MTHD, EMPTY_SUBC): recorded and
        interrupted; the channel goes on past it.  (Hardware holds the channel until the
        handler writes PBDMA_METHOD0 = NOP; this model skips it at once, so a guest that
        never handles the interrupt is not stuck behind it.)"""
        self.gpu.counts.chan(ch.chid, "pfifo.skipped_methods")
        self.gpu.pbdma.trap(ch.chid, reason, subc, method, data)

    def engine_intr(self, engn: int) -> int:
        """PFIFO_ENGINE_INTR of one FIFO engine: NOTIFY while a channel's non-stall
        interrupt is unacknowledged (reported on the PGRAPH FIFO engine)."""
        if engn == regs.FIFO_ENGINE_PGRAPH and self.notify_chids:
            return regs.PFIFO_ENGINE_INTR_NOTIFY
        return 0

    def engine_intr_source(self) -> int:
        """PFIFO_ENGINE_INTR_SOURCE: a bit per FIFO engine with an enabled interrupt."""
        return (1 << regs.FIFO_ENGINE_PGRAPH) if \
            self.engine_intr(regs.FIFO_ENGINE_PGRAPH) & self.engine_intr_en else 0

    def _ack_engine_intr(self, engn: int, value: int) -> None:
        if engn == regs.FIFO_ENGINE_PGRAPH and value & regs.PFIFO_ENGINE_INTR_NOTIFY:
            self.notify_chids.clear()

    def _set_engine_intr_en(self, value: int) -> None:
        self.engine_intr_en = value

    def notify(self, ch: Channel) -> None:
        """The host NOTIFY_INTR method: raise the non-stall interrupt for this channel
        (its owner's MSI; nouveau's fence waiters wake on it)."""
        self.notify_chids.add(ch.chid)
        self.gpu.counts.chan(ch.chid, "pfifo.notify_intrs")
        self.gpu.signal(ch.chid)

    def _clear_intr(self, value: int) -> None:
        self.intr &= ~(value & ~regs.PFIFO_INTR_RUNLIST)

    def _ack_runlist_intr(self, value: int) -> None:
        self.runlist_intr &= ~value

    def _set_intr_en(self, value: int) -> None:
        self.intr_en = value

    def _set_ctrl(self, value: int) -> None:
        self.ctrl = value
        self.gpu.kick_engines()

    def _set_poll(self, value: int) -> None:
        self.userd_poll = value

    def _set_runlist_addr(self, value: int) -> None:
        self.runlist_addr = value

    def _submit_runlist(self, value: int) -> None:
        count = value & regs.PFIFO_RUNLIST_LEN_MASK
        self.runlist_len = count
        addr = layout.runlist_addr(self.runlist_addr)
        target = layout.runlist_target(self.runlist_addr)
        self.gpu.counts.inc("pfifo.runlist_submits")
        # The update completes at once in this model: PENDING never reads set, and the
        # runlist event ("update done", what nouveau's gf100_fifo_runlist_commit waits
        # for) is raised now.  A runlist the device cannot use also raises SCHED.
        self.runlist_intr |= regs.PFIFO_RUNLIST_EVENT_DONE
        self.gpu.signal()
        try:
            self.gpu.mmu.actor = ("pfifo",)
            entries = self.gpu.mmu.view(target, addr, count * regs.RUNLIST_ENTRY_SIZE, CONTEXT)
        except DmaFault:
            self.intr |= regs.PFIFO_INTR_SCHED
            self.runlist = []
            return
        chids = layout.runlist_chids(entries.view(np.uint32)) if count else []
        bad = [c for c in chids if c >= regs.NUM_CHANNELS]
        if bad:
            self.intr |= regs.PFIFO_INTR_SCHED
        self.runlist = [c for c in dict.fromkeys(chids) if c < regs.NUM_CHANNELS]
        for c in self.runlist:
            self.channels[c].poll = True
        self.gpu.kick_engines()

    def _kick(self, value: int) -> None:
        # Work in this model is never preempted mid-method, so the kick completes at once.
        # A kick preempts the channel: its context is saved and, when it next runs, loaded
        # again from its instance block -- so a driver that rewrote or moved what RAMIN
        # points at (its page directory, USERD) knows the device no longer uses the old.
        self.kick = value & 0xFFFF
        self.gpu.counts.inc("pfifo.kicks")
        if self.kick < regs.NUM_CHANNELS:
            self.channels[self.kick].ctx = None

    def _preempt(self, inst: int) -> None:
        """A channel taken off its instance while an engine works for it: the engine's
        work is abandoned (its context scrubbed) and the engine is free from now on, as a
        preempting unbind does on hardware -- otherwise a killed kernel would keep the
        engine busy until its modelled end."""
        now = self.gpu.clock.now_ns()
        for engine in (self.gpu.engines.graph, self.gpu.engines.copy0, self.gpu.engines.copy1):
            if engine.current_inst == inst and engine.busy_until > now:
                engine.busy_ns -= engine.busy_until - now
                engine.busy_until = now
                engine.current_inst = None
                self.gpu.counts.inc("pfifo.preempted")

    def _clear_fault_mask(self, value: int) -> None:
        self.fault_mask &= ~value

    def _set_table(self, ch: Channel, value: int) -> None:
        old = ch.table
        old_inst = ch.inst if ch.valid else None
        ch.table = value
        if value != old:
            if old_inst is not None and (ch.on_resume is not None or ch.busy_since is not None):
                self._preempt(old_inst)
            if old_inst is not None:  # the context save of an unbind (RAMFC)
                ch.table = old
                self.executor.save(ch)
                ch.table = value
            since = ch.busy_since
            ch.reset()
            ch.restore = ch.valid
            if since is not None:  # whoever waits for this channel to go idle: it has
                now = self.gpu.clock.now_ns()
                for listener in self.idle_listeners:
                    listener(ch.chid, now - since)
            if ch.valid:
                ch.poll = True
        self.gpu.kick_engines()

    def _set_state(self, ch: Channel, value: int) -> None:
        ch.state = value
        if ch.runnable:
            ch.poll = True
            self.gpu.kick_engines()

    # ------------------------------------------------------------------ doorbells
    def userd_channel(self, bar1_offset: int) -> tuple[int, int] | None:
        """(chid, register) if a BAR1 offset falls in the USERD poll area."""
        return layout.userd_poll_slot(self.userd_poll, bar1_offset, regs.NUM_CHANNELS)

    def doorbell(self, chid: int) -> None:
        ch = self.channels[chid]
        self.gpu.counts.chan(chid, "pfifo.doorbells")
        ch.poll = True
        ch.ctx = None  # reload RAMIN: the driver may have changed it since the last turn
        self.gpu.kick_engines()

    # ------------------------------------------------------------------ faults
    def record_fault(self, unit: int, inst: int, va: int, write: bool, reason: int) -> None:
        self.fault_records[unit] = [layout.fault_inst_word(inst), va & 0xFFFFFFFF, va >> 32,
                                    fault_flags(unit, reason, write)]
        self.fault_mask |= 1 << unit  # PFIFO_INTR_VM_FAULT follows it
        self.gpu.counts.inc("vm.faults")
        self.gpu.signal()

    def channel_vm_fault(self, ch: Channel, unit: int, exc: VmFault) -> None:
        self.record_fault(unit, ch.inst, exc.va, exc.write, exc.reason)
        self._stop(ch, ChannelFault(ch.chid, f"vm-fault: {FAULT_NAMES.get(exc.reason, exc.reason)}"
                                    f"{' (write)' if exc.write else ''}", exc.va,
                                    UNIT_NAMES.get(unit, str(unit)), regs.CHAN_ERR_VM_FAULT_EXT,
                                    unit, exc.reason, exc.write))

    def channel_error(self, ch: Channel, code: int, text: str, address: int = 0) -> None:
        self.gpu.pbdma.trap(ch.chid, _PBDMA_REASON.get(code,
                                                       regs.PBDMA_INTR_CHANNEL_STOPPED_EXT),
                            data=address)
        self._stop(ch, ChannelFault(ch.chid, text or CHAN_ERROR_NAMES[code], address, "PFIFO",
                                    code))

    def _stop(self, ch: Channel, fault: ChannelFault) -> None:
        ch.error = fault.code
        ch.pending.clear()
        ch.poll = False
        ch.acquire = None
        ch.on_resume = None
        self.faults.append(fault)
        self.gpu.counts.chan(ch.chid, "chan.faults")
        self.gpu.signal(ch.chid)

    # ------------------------------------------------------------------ service
    def service(self, now: int) -> int | None:
        """Run every channel that can make progress; returns the next time one unblocks."""
        if not self.ctrl & regs.PFIFO_CTRL_ENABLE:
            return None
        progress = True
        started = time.perf_counter()
        self.cut_short = False
        while progress:
            if time.perf_counter() - started > SERVICE_SLICE_S:
                # Long pushbuffers can keep channels busy for a long time: give the lock
                # back (doorbells, the hypervisor, a watchdog) and come straight back.
                self.cut_short = True
                return now
            progress = False
            pass_now = now  # what this pass decided by: a channel it skipped as busy is
            for chid in self.runlist:  # woken for at its resume time, even one now past
                ch = self.channels[chid]
                if not ch.runnable or ch.resume_at > now:
                    continue
                was_idle = ch.busy_since is None
                t0 = time.perf_counter_ns()
                ran = self.executor.run(ch, now)
                self.host_ns[chid] += time.perf_counter_ns() - t0
                if ran:
                    progress = True
                    if was_idle:
                        ch.busy_since = now
            now = self.gpu.clock.now_ns()
        wake = None
        for chid in self.runlist:
            ch = self.channels[chid]
            if ch.busy_since is not None and (ch.idle(now) or ch.error):
                since, ch.busy_since = ch.busy_since, None
                for listener in self.idle_listeners:
                    listener(chid, now - since)
            if ch.runnable and ch.resume_at > pass_now:
                # may already lie behind `now`: then the loop comes straight back
                wake = ch.resume_at if wake is None else min(wake, ch.resume_at)
            elif ch.runnable and ch.acquire is not None:
                # an acquire is re-checked when anything is released; poll slowly meanwhile
                # (every device ms, and never more often than every wall ms:
                # with a fast clock the poll would otherwise spin on the device lock)
                step = max(1_000_000, int(ACQUIRE_POLL_WALL_S * 1e9 * self.gpu.clock.time_scale))
                wake = now + step if wake is None else min(wake, now + step)
        return wake
