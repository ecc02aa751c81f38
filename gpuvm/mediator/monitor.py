"""The reference monitor: every physical access the device makes, judged against its owner.

The device reports each access (page-table walk, context fetch, data) with the actor it
works for (a channel, a BAR offset, PFIFO itself) and stays VM-agnostic; the mediator
maps actors and physical ranges to owners:

- a channel of VM v: data only in v's VRAM slice or v's bus window (sysram is further
  limited to v's DMA mappings by the bus map itself); walks and context fetches only in
  structures the hypervisor holds allocated for v in v's shadow reserve -- a walk into
  the slice is a guest-written table, a walk of freed shadow memory a lifetime bug (the
  memory may already be someone else's table or guest-copied words): both escapes;
- a BAR access in v's arena: walks/contexts in the hypervisor's global area (the physical
  BAR tables), data in v's slice or bus window;
- the USERD poll area and PFIFO (runlist): the hypervisor's structures only;
- a channel no VM owns must not run at all.

It is a test option: `enable()` (or GPUVM_REFERENCE_MONITOR=1) before a mediator is made
installs it; tests/conftest.py turns it on for the whole suite and fails any test after
which `ESCAPES` grew.  Escapes are recorded, not prevented: the monitor is the judge of
the mediator's own rules, not one of them.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Hashable, Mapping, Sequence

import numpy as np

from gpuvm.device import regs
from gpuvm.device.mmu import DATA
from gpuvm.mediator.partition import POLL_AREA

if TYPE_CHECKING:
    from gpuvm.mediator.vgpu import VGpu


@dataclass(frozen=True)
class Escape:
    """One access the reference monitor judged outside its actor's partition: who, what
    kind (engine DMA, BAR, shadow entry), which memory and why -- the unit an isolation
    report and the fuzzer count, so a failure names the exact bytes."""
    actor: Hashable
    kind: str
    target: int
    lo: int
    hi: int
    write: bool
    why: str

    def __str__(self) -> str:
        mem = "VRAM" if self.target == regs.TARGET_VRAM else "sysram"
        return (f"{self.actor} {self.kind} {'write' if self.write else 'read'} of {mem} "
                f"[{self.lo:#x}, {self.hi:#x}): {self.why}")


ESCAPES: list[Escape] = []
_record_lock = threading.Lock()
_enabled = os.environ.get("GPUVM_REFERENCE_MONITOR", "") == "1"


def enable(on: bool = True) -> None:
    global _enabled
    _enabled = on


def enabled() -> bool:
    return _enabled


def take() -> list[Escape]:
    """The escapes recorded so far, forgetting them (for tests that provoke one)."""
    with _record_lock:
        out = list(ESCAPES)
        ESCAPES.clear()
    return out


def _inside(lo: int, hi: int, base: int, size: int) -> bool:
    return base <= lo and hi <= base + size


class ReferenceMonitor:
    """The judge of every physical access the device makes (see the module docstring).

    Given what it judges against -- the mediator's vGPUs and channel owners (live views,
    read at each access), the hypervisor's VRAM range and the bus window -- not the
    mediator itself."""

    def __init__(self, vgpus: Sequence["VGpu"], owner: Mapping[int, "VGpu"], hyp_base: int,
                 hyp_size: int, bus_window: int) -> None:
        self.vgpus = vgpus
        self.owner = owner
        self.hyp_base = hyp_base
        self.hyp_size = hyp_size
        self.bus_window = bus_window
        self.checks = 0

    def _vm_of_arena(self, bar: int, offset: int) -> "VGpu | None":
        for v in list(self.vgpus):
            base, size = (v.part.bar1_base, v.part.spec.bar1_size) if bar == regs.BAR1 else \
                (v.part.bar3_base, v.part.spec.bar3_size)
            if base <= offset < base + size:
                return v
        return None

    def _hyp(self, target: int, lo: int, hi: int) -> bool:
        return target == regs.TARGET_VRAM and _inside(lo, hi, self.hyp_base, self.hyp_size)

    def _vm_data(self, v: "VGpu", target: int, lo: int, hi: int) -> bool:
        if target == regs.TARGET_VRAM and v.tenant is not None:
            # oversubscribed: only the pool frames it holds now (another VM's pages may be
            # in the rest of the pool)
            first = (lo - v.part.vram_base) // regs.SMALL_PAGE
            last = (hi - 1 - v.part.vram_base) // regs.SMALL_PAGE
            frames = v.tenant.frames.frame
            return 0 <= first <= last < frames.size and \
                bool((frames[first:last + 1] == np.arange(first, last + 1)).all())
        if target == regs.TARGET_VRAM:
            return _inside(lo, hi, v.part.vram_base, v.part.vram_size)
        return _inside(lo, hi, v.part.sys_base, self.bus_window)

    def _vm_shadow(self, v: "VGpu", target: int, lo: int, hi: int) -> bool:
        pool = v.part.shadow_pool
        return target == regs.TARGET_VRAM and _inside(lo, hi, pool.base, pool.size)

    def judge(self, actor: Hashable, kind: str, target: int, lo: int, hi: int) -> str | None:
        """None if the access is the actor's to make, else why not."""
        if not isinstance(actor, tuple) or not actor:
            return None  # the host's own bring-up, before anyone acts for a VM
        if actor[0] == "channel":
            v = self.owner.get(actor[1])
            if v is None:
                return "a channel no VM owns is running"
            if kind == DATA:
                return None if self._vm_data(v, target, lo, hi) else f"outside {v.name}'s memory"
            if not self._vm_shadow(v, target, lo, hi):
                return f"a {kind} outside {v.name}'s shadow reserve"
            if not v.part.shadow_pool.allocated(lo, hi):
                return f"a {kind} of freed shadow memory of {v.name} (use after free)"
            return None
        if actor[0] == "bar":
            _, bar, offset = actor
            if bar == regs.BAR1 and offset < POLL_AREA:  # the hypervisor's USERD poll area
                if kind != DATA:
                    return None if self._hyp(target, lo, hi) else "poll-area walk outside hypervisor VRAM"
                v = self.owner.get(offset // regs.USERD_STRIDE)
                ok = v is not None and self._vm_shadow(v, target, lo, hi)
                return None if ok else "poll-area access outside the channel owner's USERD"
            if kind != DATA:
                return None if self._hyp(target, lo, hi) else f"BAR{bar} walk outside the BAR tables"
            v = self._vm_of_arena(bar, offset)
            if v is None:
                return f"BAR{bar} offset {offset:#x} belongs to no VM"
            return None if self._vm_data(v, target, lo, hi) else f"outside {v.name}'s memory"
        if actor[0] == "pfifo":
            return None if self._hyp(target, lo, hi) else "runlist outside hypervisor VRAM"
        return "unknown actor"

    def __call__(self, actor: Hashable, kind: str, target: int, lo: int, hi: int,
                 write: bool) -> None:
        self.checks += 1
        why = self.judge(actor, kind, target, lo, hi)
        if why is not None:
            with _record_lock:
                ESCAPES.append(Escape(actor, kind, target, lo, hi, write, why))
