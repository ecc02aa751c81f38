"""One channel's execution: fetch GPFIFO entries, decode pushbuffers, run host methods,
hand engine methods to the bound class, and block while the engine works.

A channel executes in order: after an engine launch it waits until that work completes,
so a semaphore release after a launch is a fence.  Anything malformed stops this channel
with a reason; the device and other channels carry on.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.blocks.pgraph import Pgraph
from gpuvm.device.blocks.pmc import Pmc
from gpuvm.device.engine_classes import BoundObject, Completion, EngineClass
from gpuvm.device.engines import Engines
from gpuvm.device.events import DeviceEvents
from gpuvm.device.faults import ChannelError
from gpuvm.device.channel_memory import ChannelMemory
from gpuvm.device.mmu import CONTEXT, DmaFault, Mmu, Space, VmFault, space_from_words
from gpuvm.device.pushbuffer import MethodCall, PushDecoder

log = logging.getLogger(__name__)

MAX_PUSHBUFFER_WORDS = 1 << 20  # one GPFIFO entry may name at most 4 MiB of commands
METHODS_PER_TURN = 256  # how many methods a channel runs before others get a turn


@dataclass
class ChannelContext:
    """What the device loads from RAMIN when it picks the channel up."""

    space: Space
    userd_target: int
    userd: int
    gpfifo_va: int
    gpfifo_entries: int


@dataclass
class Channel:
    """One hardware channel as PFIFO keeps it: its table and state words, GP_GET/GP_PUT,
    the context loaded from its instance block and the methods decoded but not yet run.
    Owned by PFIFO; the executor runs what it holds."""
    chid: int
    table: int = 0  # PFIFO_CHAN_TABLE word
    state: int = 0  # PFIFO_CHAN_STATE word
    gp_get: int = 0
    gp_put: int = 0  # the GP_PUT the device last read from USERD
    restore: bool = False  # just bound: take progress from RAMFC when the context loads
    error: int = 0  # CHAN_ERR_*_EXT; non-zero = stopped
    ctx: ChannelContext | None = None
    pending: deque = field(default_factory=deque)  # MethodCall | ChannelError
    decoder: PushDecoder = field(default_factory=PushDecoder)  # carries across entries
    objects: dict[int, BoundObject] = field(default_factory=dict)
    resume_at: int = 0  # blocked on an engine until this device time
    on_resume: Completion | None = None
    acquire: tuple[int, int, int] | None = None  # (va, value, op) being waited for
    sem_addr: int = 0
    sem_seq: int = 0
    poll: bool = False  # GP_PUT may have moved: look at USERD
    busy_since: int | None = None  # device time the channel last went from idle to busy
    counts: Callable[[str, int], None] | None = None

    @property
    def actor(self) -> tuple[str, int]:
        """Who the device works for while it runs this channel (the access monitor's key)."""
        return ("channel", self.chid)

    @property
    def valid(self) -> bool:
        return layout.chan_valid(self.table)

    @property
    def runnable(self) -> bool:
        return self.valid and bool(self.state & regs.PFIFO_CHAN_STATE_RUNNABLE) and not self.error

    @property
    def inst(self) -> int:
        return layout.chan_inst(self.table)

    @property
    def inst_target(self) -> int:
        return layout.chan_target(self.table)

    def reset(self) -> None:
        """A (re)bound channel starts from a clean PFIFO context."""
        self.gp_get = self.gp_put = 0
        self.error = 0
        self.ctx = None
        self.pending.clear()
        self.decoder.reset()
        self.objects.clear()
        self.resume_at = 0
        self.on_resume = None
        self.acquire = None
        self.poll = False
        self.busy_since = None

    def idle(self, now: int) -> bool:
        return not self.pending and self.on_resume is None and self.acquire is None and \
            not self.poll and self.resume_at <= now

    def count(self, name: str, n: int = 1) -> None:
        if self.counts is not None:
            self.counts(name, n)


class ChannelHost(Protocol):
    """What a running channel reports to PFIFO (gpuvm.device.pfifo.Pfifo)."""

    saved_objects: dict[int, tuple[tuple[int, int], dict]]

    def notify(self, ch: Channel) -> None: ...

    def skip_method(self, ch: Channel, reason: int, subc: int, method: int,
                    data: int) -> None: ...

    def channel_error(self, ch: Channel, code: int, text: str, address: int = 0) -> None: ...

    def channel_vm_fault(self, ch: Channel, unit: int, exc: VmFault) -> None: ...


class ChannelExecutor:
    """Runs channels on behalf of PFIFO; all calls happen under the device lock.  Given
    what a channel's methods reach -- PFIFO (its reports), the MMU, the engine classes
    and engines, PMC (engine enables), PGRAPH (its interrupts) and the device's events
    -- not the Gpu."""

    def __init__(self, pfifo: ChannelHost, mmu: Mmu, classes: dict[int, EngineClass],
                 engines: Engines, pmc: Pmc, pgraph: Pgraph, events: DeviceEvents) -> None:
        self.pfifo = pfifo
        self.mmu = mmu
        self.classes = classes
        self.engines = engines
        self.pmc = pmc
        self.pgraph = pgraph
        self.events = events

    # ------------------------------------------------------------------ context
    def load_context(self, ch: Channel) -> ChannelContext:
        mmu = self.mmu
        try:
            ramin = mmu.view(ch.inst_target, ch.inst, regs.RAMIN_SIZE,
                                 CONTEXT).view(np.uint32)
        except DmaFault:
            raise ChannelError(regs.CHAN_ERR_BAD_INSTANCE_EXT,
                               f"instance block {ch.inst:#x} is outside memory", ch.inst) from None
        w = ramin.tolist()
        if w[regs.RAMIN_SIGNATURE // 4] != regs.RAMIN_SIGNATURE_VALUE:
            raise ChannelError(regs.CHAN_ERR_BAD_INSTANCE_EXT,
                               f"instance block {ch.inst:#x} has no 0xface signature", ch.inst)
        gpfifo_va, log2 = layout.ramin_gpfifo(w[regs.RAMIN_GPFIFO_LO // 4],
                                              w[regs.RAMIN_GPFIFO_HI // 4])
        if log2 > regs.GPFIFO_MAX_LOG2:
            raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, f"GPFIFO of 2^{log2} entries", log2)
        userd_lo = w[regs.RAMIN_USERD_LO // 4]
        ctx = ChannelContext(
            space=space_from_words(w[regs.RAMIN_PD_LO // 4], w[regs.RAMIN_PD_HI // 4],
                                       w[regs.RAMIN_LIMIT_LO // 4], w[regs.RAMIN_LIMIT_HI // 4],
                                       ch.inst),
            userd_target=layout.ramin_ptr_target(userd_lo),
            userd=layout.ramin_ptr(userd_lo, w[regs.RAMIN_USERD_HI // 4]),
            gpfifo_va=gpfifo_va,
            gpfifo_entries=1 << log2,
        )
        try:
            mmu.view(ctx.userd_target, ctx.userd, regs.USERD_STRIDE, CONTEXT)
        except DmaFault:
            raise ChannelError(regs.CHAN_ERR_BAD_INSTANCE_EXT,
                               f"USERD {ctx.userd:#x} is outside memory", ctx.userd) from None
        if ch.restore:
            ch.restore = False
            self._restore(ch, ctx, w)
        return ctx

    def _restore(self, ch: Channel, ctx: ChannelContext, w: list[int]) -> None:
        """A channel bound again picks up where it was unbound: GP_GET and the semaphore
        state from RAMFC, its subchannel objects (engine context) if the RAMFC is still the
        one the device saved -- a driver that zeroed it made a new channel."""
        put, get = w[regs.RAMFC_GP_PUT // 4], w[regs.RAMFC_GP_GET // 4]
        ch.gp_get = get % ctx.gpfifo_entries
        ch.sem_addr = layout.addr40(w[regs.RAMFC_SEMAPHOREA // 4], w[regs.RAMFC_SEMAPHOREB // 4])
        ch.sem_seq = w[regs.RAMFC_SEMAPHOREC // 4]
        saved = self.pfifo.saved_objects.pop(ch.inst, None)
        if saved is not None and saved[0] == (put, get) and (put or get):
            ch.objects.update(saved[1])
            ch.count("pfifo.context_restores")

    def save(self, ch: Channel) -> None:
        """Unbinding: write the channel's progress to its RAMFC (GP_PUT, GP_GET, the
        semaphore registers) and keep its subchannel objects for the same instance."""
        words = {regs.RAMFC_GP_PUT: ch.gp_put, regs.RAMFC_GP_GET: ch.gp_get,
                 regs.RAMFC_SEMAPHOREA: ch.sem_addr >> 32,
                 regs.RAMFC_SEMAPHOREB: ch.sem_addr & 0xFFFFFFFF,
                 regs.RAMFC_SEMAPHOREC: ch.sem_seq}
        self.mmu.actor = ch.actor
        try:
            for off, value in words.items():
                self.mmu.phys_write(ch.inst_target, ch.inst + off,
                                        (value & 0xFFFFFFFF).to_bytes(4, "little"), CONTEXT)
        except DmaFault:
            return
        if ch.objects:
            self.pfifo.saved_objects[ch.inst] = ((ch.gp_put, ch.gp_get), dict(ch.objects))

    def _userd_write(self, ctx: ChannelContext, offset: int, value: int) -> None:
        self.mmu.phys_write(ctx.userd_target, ctx.userd + offset,
                                (value & 0xFFFFFFFF).to_bytes(4, "little"), CONTEXT)

    # ------------------------------------------------------------------ fetch
    def _fetch(self, ch: Channel, mem: ChannelMemory) -> bool:
        """Move the next GPFIFO entry's methods into `pending`; False when there is none."""
        if not ch.poll:
            return False
        ctx = ch.ctx
        gp_put = self.mmu.phys_read_u32(ctx.userd_target, ctx.userd + regs.USERD_GP_PUT,
                                            CONTEXT)
        if gp_put >= ctx.gpfifo_entries:
            raise ChannelError(regs.CHAN_ERR_BAD_GPFIFO_ENTRY_EXT,
                               f"GP_PUT {gp_put} beyond a ring of {ctx.gpfifo_entries}", gp_put)
        ch.gp_put = gp_put
        if gp_put == ch.gp_get:
            ch.poll = False
            return False
        mem.unit = regs.FAULT_UNIT_PFIFO
        entry = mem.read(ctx.gpfifo_va + regs.GPFIFO_ENTRY_SIZE * ch.gp_get,
                         regs.GPFIFO_ENTRY_SIZE).view(np.uint32).tolist()
        va, words, main = layout.gpfifo_entry_decode(entry[0], entry[1])
        if words > MAX_PUSHBUFFER_WORDS:
            raise ChannelError(regs.CHAN_ERR_BAD_GPFIFO_ENTRY_EXT,
                               f"entry {ch.gp_get} names {words} words", va)
        if not words:  # the DMA pusher's IB_EMPTY (envytools docs/hw/fifo/dma-pusher.rst)
            raise ChannelError(regs.CHAN_ERR_IB_EMPTY_EXT, f"GPFIFO entry {ch.gp_get}", va)
        ch.count("pfifo.gpfifo_entries")
        calls, error = ch.decoder.decode(mem.read(va, 4 * words).view(np.uint32))
        ch.pending.extend(calls)
        if error is not None:
            ch.pending.append(error)
        ch.gp_get = (ch.gp_get + 1) % ctx.gpfifo_entries
        self._userd_write(ctx, regs.USERD_GP_GET, ch.gp_get)
        self._dma_pointers(ctx, va + 4 * words, main)
        return True

    def _dma_pointers(self, ctx: ChannelContext, end: int, main: bool) -> None:
        """The pusher has read the segment up to `end` (its words are queued): DMA_PUT and
        DMA_GET both stand there, and DMA_MGET too for a main-pushbuffer segment."""
        lo, hi = end & 0xFFFFFFFF, end >> 32
        write = self.mmu.phys_write
        write(ctx.userd_target, ctx.userd + regs.USERD_DMA_PUT,
              lo.to_bytes(4, "little") * 2, CONTEXT)  # DMA_PUT, DMA_GET
        write(ctx.userd_target, ctx.userd + regs.USERD_DMA_PUT_HIGH, hi.to_bytes(4, "little"),
              CONTEXT)
        if main:  # DMA_MGET, DMA_MGET_HIGH, DMA_GET_HIGH
            write(ctx.userd_target, ctx.userd + regs.USERD_DMA_MGET,
                  np.array([lo, hi | regs.USERD_DMA_MGET_VALID, hi], dtype="<u4").tobytes(),
                  CONTEXT)
        else:
            self._userd_write(ctx, regs.USERD_DMA_GET_HIGH, hi)

    # ------------------------------------------------------------------ methods
    def _host_method(self, ch: Channel, mem: ChannelMemory, call: MethodCall, now: int) -> None:
        m, v = call.method, call.value
        mem.unit = regs.FAULT_UNIT_PFIFO
        if m == regs.HOST_OBJECT:
            cls = v & 0xFFFF
            engine_id = (v >> regs.HOST_OBJECT_ENGINE_SHIFT) & regs.HOST_OBJECT_ENGINE_MASK
            klass = self.classes.get(cls)
            if klass is None or engine_id not in klass.engines:
                raise ChannelError(regs.CHAN_ERR_UNKNOWN_CLASS_EXT,
                                   f"class {cls:#x} on engine {engine_id}", v)
            ch.objects[call.subc] = BoundObject(cls, engine_id)
        elif m in (regs.HOST_NOP, regs.HOST_WRCACHE_FLUSH, regs.HOST_YIELD):
            pass  # writes reach memory at once; channels switch at every turn anyway
        elif m == regs.HOST_NOTIFY_INTR:
            self.pfifo.notify(ch)
        elif m == regs.HOST_SEMAPHORE_ADDR_HI:
            ch.sem_addr = layout.with_addr40_hi(ch.sem_addr, v)
        elif m == regs.HOST_SEMAPHORE_ADDR_LO:
            ch.sem_addr = layout.with_addr40_lo(ch.sem_addr, v)
        elif m == regs.HOST_SEMAPHORE_SEQUENCE:
            ch.sem_seq = v
        elif m == regs.HOST_SEMAPHORE_TRIGGER:
            op = v & regs.SEM_OP_MASK
            if op == regs.SEM_RELEASE:
                data = [ch.sem_seq] if v & regs.SEM_SHORT else \
                    [ch.sem_seq, 0, now & 0xFFFFFFFF, now >> 32]
                mem.write(ch.sem_addr, np.array(data, dtype=np.uint32).view(np.uint8))
                ch.count("pfifo.semaphore_releases")
                self.events.signal(ch.chid)
            elif op in (regs.SEM_ACQUIRE_EQUAL, regs.SEM_ACQUIRE_GEQUAL, regs.SEM_ACQUIRE_MASK):
                ch.acquire = (ch.sem_addr, ch.sem_seq, op)
            else:
                raise ChannelError(regs.CHAN_ERR_UNKNOWN_METHOD_EXT,
                                   f"semaphore operation {op}", v)
        elif m == regs.HOST_REF_CNT:
            self._userd_write(ch.ctx, regs.USERD_REF, v)
            self.events.signal(ch.chid)
        else:  # the PBDMA's ILLEGAL_MTHD: recorded, interrupted, skipped
            self.pfifo.skip_method(ch, regs.PBDMA_INTR_ILLEGAL_MTHD, call.subc, m, v)

    def _acquired(self, ch: Channel, mem: ChannelMemory) -> bool:
        va, value, op = ch.acquire
        mem.unit = regs.FAULT_UNIT_PFIFO
        current = mem.read_u32(va)
        if op == regs.SEM_ACQUIRE_EQUAL:
            return current == value
        if op == regs.SEM_ACQUIRE_MASK:
            return bool(current & value)
        return ((current - value) & 0xFFFFFFFF) < 0x80000000

    def _engine_method(self, ch: Channel, mem: ChannelMemory, call: MethodCall,
                       now: int) -> bool:
        """Run one engine method; False if its engine is disabled (the channel stalls)."""
        obj = ch.objects.get(call.subc)
        if obj is None:  # the PBDMA's EMPTY_SUBC: recorded, interrupted, skipped
            self.pfifo.skip_method(ch, regs.PBDMA_INTR_EMPTY_SUBC, call.subc, call.method,
                                       call.value)
            return True
        engine = self.engines.by_id(obj.engine_id)
        if not self.pmc.engine_enabled(engine.enable_bit):
            return False
        klass = self.classes[obj.cls]
        if call.method not in klass.methods and obj.engine_id == regs.ENGINE_PGRAPH:
            self.pgraph.illegal_method(ch, call.subc, call.method, call.value)
            return True  # PGRAPH's ILLEGAL_MTHD: recorded, interrupted, skipped
        mem.unit = engine.fault_unit
        launch = klass.method(ch, obj, mem, call.method, call.value, now)
        if launch is not None:
            duration, done = launch
            ch.resume_at = engine.occupy(now, duration, ch.inst)
            ch.on_resume = done
            ch.count("engine.busy_ns", duration)
        return True

    # ------------------------------------------------------------------ one turn
    def run(self, ch: Channel, now: int) -> bool:
        """Give the channel a turn; True if it made progress."""
        progress = False
        self.mmu.actor = ch.actor
        try:
            if ch.ctx is None:
                ch.ctx = self.load_context(ch)
            mem = ChannelMemory(self.mmu, ch.ctx.space, self.pgraph.notify)
            budget = METHODS_PER_TURN
            while budget:
                if ch.resume_at > now:
                    break
                if ch.on_resume is not None:
                    done, ch.on_resume = ch.on_resume, None
                    done(ch.resume_at)
                    self.events.signal(ch.chid)
                    progress = True
                if ch.acquire is not None:
                    if not self._acquired(ch, mem):
                        break
                    ch.acquire = None
                    progress = True
                if not ch.pending:
                    if not self._fetch(ch, mem):
                        break
                    progress = True
                    continue
                item = ch.pending[0]
                if isinstance(item, ChannelError):
                    raise item
                if item.method < regs.HOST_METHODS_END:
                    ch.pending.popleft()
                    self._host_method(ch, mem, item, now)
                elif self._engine_method(ch, mem, item, now):
                    ch.pending.popleft()
                else:
                    break  # engine disabled: stall until PMC_ENABLE changes
                ch.count("pfifo.methods")
                budget -= 1
                progress = True
        except ChannelError as exc:
            self.pfifo.channel_error(ch, exc.code, str(exc), exc.address)
            return True
        except VmFault as exc:
            unit = mem.unit if "mem" in locals() else regs.FAULT_UNIT_PFIFO
            self.pfifo.channel_vm_fault(ch, unit, exc)
            return True
        except DmaFault as exc:
            self.pfifo.channel_error(ch, regs.CHAN_ERR_DMA_TARGET_EXT, str(exc), exc.addr)
            return True
        except Exception as exc:  # a device-model bug: stop this channel, keep the device
            log.exception("channel %d: internal error", ch.chid)
            self.pfifo.channel_error(ch, regs.CHAN_ERR_UNKNOWN_METHOD_EXT,
                                         f"internal error: {exc!r}")
            return True
        return progress
