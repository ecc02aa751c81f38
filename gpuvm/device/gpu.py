"""The emulated GPU: a Quadro 6000-class device driven only through its BARs and memory.

`Gpu` composes the register blocks on a BAR0 bus, the BAR1/BAR3 apertures, VRAM, the MMU
and PFIFO, and runs the engines on a thread of their own, paced by the device clock, so
guests keep running while GPU work is in flight.  It is also the GpuTarget a VMM hands a
native guest's accesses to.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from threading import get_ident
from typing import Callable

import numpy as np

from gpuvm.device import regs
from gpuvm.device.bar_aperture import BarAperture
from gpuvm.device.blocks.pbdma import Pbdma
from gpuvm.device.blocks.pbus import Pbus
from gpuvm.device.blocks.pcopy import Pcopy
from gpuvm.device.blocks.pfb import Pfb, PfbPartitions, PfbPartitionSizes, Pffb, Pflush
from gpuvm.device.blocks.pgraph import Pgraph
from gpuvm.device.blocks.pmc import Pmc
from gpuvm.device.blocks.pramin import Pramin
from gpuvm.device.blocks.ptimer import Ptimer
from gpuvm.device.clock import WAKE_POLL_S, DeviceClock
from gpuvm.device.counters import Counters
from gpuvm.device.dma import DmaPort
from gpuvm.device.engine_classes import engine_classes
from gpuvm.device.engines import Engines
from gpuvm.device.events import DeviceEvents
from gpuvm.device.faults import ChannelFault
from gpuvm.device.mmio_bus import MmioBus
from gpuvm.device.mmu import Mmu
from gpuvm.device.pfifo import Pfifo
from gpuvm.device.profile import DeviceProfile, load_profile
from gpuvm.device.vram import Vram


_PRAMIN_LO = regs.PRAMIN_WINDOW
_PRAMIN_HI = regs.PRAMIN_WINDOW + regs.PRAMIN_WINDOW_SIZE


class Gpu:
    """The device as a whole: it composes the blocks -- each given its few
    collaborators, none of them this object -- serves BAR accesses, runs the engine
    thread and tells listeners what its work signalled."""

    def __init__(self, profile: DeviceProfile | None = None, time_scale: float = 1.0,
                 vram_size: int | None = None, clock: DeviceClock | None = None) -> None:
        profile = profile or load_profile()
        if vram_size is not None:
            profile = profile.with_vram(vram_size)
        self.profile = profile
        # Re-entrant: wait_event evaluates guests' predicates while holding it.
        self.lock = threading.RLock()
        self._work = threading.Condition(self.lock)  # engine thread waits here
        self._events = threading.Condition(self.lock)  # guests waiting for completions
        self.counts = Counters()
        self.clock = clock or DeviceClock(time_scale)
        # the engines as a party of a virtual clock: device time waits for their work
        self._clock_party = self.clock.timer("engines", self._wake_engines)
        self.vram = Vram(profile.vram_size)
        self.mmu = Mmu(self.vram, self.counts)
        self.engines = Engines.create()
        self.classes = engine_classes(profile)
        self.events = events = DeviceEvents(self._work, self._clock_party)
        counts, mmu = self.counts, self.mmu
        self.mmio_bus = MmioBus(counts)
        self.pbdma = Pbdma(events)
        self.pgraph = pgraph = Pgraph(self.engines.graph, self.clock, counts, events)
        self.ptimer = Ptimer(self.clock, counts, events)
        self.pmc = Pmc(profile.boot0, events)
        self.pfifo = pfifo = Pfifo(counts, mmu, self.clock, self.engines, events, self.pbdma,
                                   self.classes, self.pmc, self.pgraph)
        # a unit's line is its status under its own enables (nvkm leaves PFIFO_INTR bit 31
        # pending with 0x2140 bit 31 clear until a fence waiter wants it)
        self.pmc.wire(regs.PMC_INTR_PFIFO, lambda: pfifo.intr_status() & pfifo.intr_en)
        self.pmc.wire(regs.PMC_INTR_PTIMER, self.ptimer.pending)
        self.pmc.wire(regs.PMC_INTR_PGRAPH, lambda: pgraph.intr)
        self.bar1 = BarAperture(self.vram, mmu, counts, self.mmio_bus, pfifo.record_fault,
                                regs.BAR1, profile.bar1_size, regs.FAULT_UNIT_BAR1)
        self.bar3 = BarAperture(self.vram, mmu, counts, self.mmio_bus, pfifo.record_fault,
                                regs.BAR3, profile.bar3_size, regs.FAULT_UNIT_BAR3)
        self.pbus = Pbus(self.bar1, self.bar3)
        self.pffb = Pffb(mmu, (self.bar1.forget, self.bar3.forget))
        self.pramin = Pramin(self.vram, self.pbus, counts)
        for block in (self.pmc, self.pbus, self.pfifo, self.pbdma, self.ptimer,
                      PfbPartitions(profile.partitions), Pflush(counts), Pfb(), self.pffb,
                      Pcopy(0, self.engines.copy0), Pcopy(1, self.engines.copy1),
                      PfbPartitionSizes(profile.partitions, self.vram.size), self.pgraph,
                      self.pramin):
            self.mmio_bus.add(block)
        self._fast_reads, self._fast_writes = self.mmio_bus.fast_tables()
        self._thread_counts: dict[int, defaultdict[str, int]] = {}
        self._thread: threading.Thread | None = None
        self._stopping = False
        # called (lock held) whenever guests may have something to see: completions and
        # faults, with the channels they came from (None: from no channel in particular,
        # anyone may look); a VFIO device turns each call into its interrupt's eventfd
        self.event_listeners: list[Callable[[frozenset[int] | None], None]] = []

    # ------------------------------------------------------------------ lifecycle
    def attach_sysram(self, port: DmaPort) -> None:
        """Give the device the system memory it may DMA to (the VMM decides what that is)."""
        with self.lock:
            self.mmu.dma = port
            self.mmu.flush()

    def start(self) -> "Gpu":
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._engine_loop, name="gpu-engines",
                                            daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        thread = self._thread
        if thread is not None:
            with self.lock:
                self._stopping = True
                self._work.notify_all()
            thread.join()
            self._thread = None
        self._clock_party.leave()
        with self.lock:
            self._events.notify_all()

    def release_memory(self) -> None:
        """Unmap VRAM; only once nothing (no memslot, no view) uses it any more."""
        self.close()
        self.vram.close()

    def __enter__(self) -> "Gpu":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ BAR access
    def _mmio_counts(self) -> defaultdict[str, int]:
        """This thread's MMIO counters.  Accesses that skip the device lock still count
        exactly: each thread has its own dict, summed when counters are read."""
        ident = get_ident()
        counts = self._thread_counts.get(ident)
        if counts is None:
            counts = self._thread_counts[ident] = defaultdict(int)
        return counts

    def mmio_read(self, bar: int, offset: int, size: int) -> int:
        # Register reads return one value and never need the lock (the trap path is
        # measured: the lock alone costs more than the rest of a dispatch).
        if bar == 0 and size == 4:
            entry = self._fast_reads.get(offset)
            if entry is not None:
                counts = self._thread_counts.get(get_ident())  # inlined _mmio_counts
                if counts is None:
                    counts = self._mmio_counts()
                counts[entry[1]] += 1
                return entry[0]()
            if _PRAMIN_LO <= offset < _PRAMIN_HI and not offset & 3:
                self._mmio_counts()["mmio.bar0.pramin.read"] += 1
                return self.pramin.read(offset)
        with self.lock:
            if bar == regs.BAR0:
                return self.mmio_bus.read(offset, size)
            if bar == regs.BAR1:
                return self.bar1.read(offset, size)
            if bar == regs.BAR3:
                return self.bar3.read(offset, size)
            self.counts.inc("mmio.unimplemented")
            return (1 << (8 * size)) - 1

    def mmio_write(self, bar: int, offset: int, size: int, value: int) -> None:
        if bar == 0 and size == 4:
            entry = self._fast_writes.get(offset)
            if entry is not None:
                counts = self._thread_counts.get(get_ident())  # inlined _mmio_counts
                if counts is None:
                    counts = self._mmio_counts()
                counts[entry[1]] += 1
                if entry[2]:
                    with self.lock:
                        entry[0](value & 0xFFFFFFFF)
                else:
                    entry[0](value & 0xFFFFFFFF)
                return
            if _PRAMIN_LO <= offset < _PRAMIN_HI and not offset & 3:
                # a plain store into VRAM, as the hardware window does it
                self._mmio_counts()["mmio.bar0.pramin.write"] += 1
                self.pramin.write(offset, value & 0xFFFFFFFF)
                return
        with self.lock:
            if bar == regs.BAR0:
                self.mmio_bus.write(offset, size, value)
            elif bar == regs.BAR1:
                if self.bar1.write(offset, size, value) is not None:
                    userd = self.pfifo.userd_channel(offset)
                    if userd is not None and userd[1] == regs.USERD_GP_PUT:
                        self.pfifo.doorbell(userd[0])
            elif bar == regs.BAR3:
                self.bar3.write(offset, size, value)
            else:
                self.counts.inc("mmio.unimplemented")

    def bar3_write_run(self, offset: int, size: int, values: np.ndarray) -> bool:
        """Stores in a row into one page of BAR3, made at once where `BarAperture.
        write_run` can (False: nothing done; make them one by one with mmio_write)."""
        with self.lock:
            return self.bar3.write_run(offset, size, values)

    def reg_read(self, offset: int) -> int:
        """A 32-bit BAR0 register read, as a host driver makes it."""
        return self.mmio_read(regs.BAR0, offset, 4)

    def reg_write(self, offset: int, value: int) -> None:
        """A 32-bit BAR0 register write, as a host driver makes it."""
        self.mmio_write(regs.BAR0, offset, 4, value)

    # ------------------------------------------------------------------ GpuTarget
    def wait_event(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._events:
            while not predicate():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                # bounded, so a condition met by someone the device does not hear is seen
                self._events.wait(min(remaining, 0.05))
            return True

    def faults(self) -> list[ChannelFault]:
        return list(self.pfifo.faults)  # one C-level copy: consistent without the lock

    def counters(self) -> dict[str, int]:
        with self.lock:
            out = self.counts.flat()
        for counts in list(self._thread_counts.values()):
            for name, value in dict(counts).items():
                out[name] = out.get(name, 0) + value
        return out

    def device_time_ns(self) -> int:
        return self.clock.now_ns()

    # ------------------------------------------------------------------ internal hooks
    def _wake_engines(self) -> None:
        """A virtual clock reached the engines' alarm (any thread, must not block: a
        missed notify is made up by the engine loop's short wait)."""
        if self.lock.acquire(blocking=False):
            try:
                self._work.notify()
            finally:
                self.lock.release()

    def signal(self, chid: int | None = None) -> None:
        """Work on channel `chid` (None: on none in particular) completed or faulted:
        guests and listeners are told (DeviceEvents.signal; lock held)."""
        self.events.signal(chid)

    def flushed(self) -> None:
        """A TLB flush: BAR apertures re-read their instance blocks on next use."""
        self.bar1.forget()
        self.bar3.forget()

    def _engine_loop(self) -> None:
        virtual = self.clock.virtual
        with self.lock:
            while not self._stopping:
                if virtual:
                    # act exactly at the engines' own time, once device time is there
                    # (a kick holds it at the kicker's time: gpuvm/device/clock.py)
                    now = self._clock_party.due_at()
                    if now is None:
                        self._work.wait(WAKE_POLL_S)
                        continue
                else:
                    now = self.clock.now_ns()
                wake = self.pfifo.service(now)
                alarm = self.ptimer.fire(now)
                if alarm is not None and (wake is None or alarm < wake):
                    wake = alarm
                events = self.events
                if events.signalled is None or events.signalled:
                    chids = None if events.signalled is None \
                        else frozenset(events.signalled)
                    events.signalled = set()
                    self.clock.signal(self)  # sleeping guests wake at this device time
                    self._events.notify_all()
                    for listener in self.event_listeners:
                        listener(chids)
                self._clock_party.set_alarm(wake)  # only now may a virtual clock move on
                timeout = None if wake is None else self.clock.wall_seconds_until(wake)
                if self.pfifo.cut_short:
                    self._work.wait(0.0002)  # let whoever waits for the lock have it
                elif timeout is None or timeout > 0:
                    self._work.wait(timeout)
