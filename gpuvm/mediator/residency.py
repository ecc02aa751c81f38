"""Residency of oversubscribed vGPUs, switched at scheduling boundaries.

Fermi cannot resume a channel after a page fault, so guest VRAM cannot be paged in on
demand; but the mediator owns every shadow page table, and a VM's channels run only when
the scheduler hands it the GPU.  So, just before a VM's submission is rung (the scheduler's
dispatch), `make_resident` gives the VM its working set in the shared pool: pages of other
VMs that hold the frames it needs are copied out to their backing stores by the copy
engine and their shadow entries dropped (not present), then the VM's own pages are copied
in and its shadows pointed at the frames.  Nothing of a guest waits on a fault: the GPU
only runs the channels of the VM whose pages are resident, and the mediator's own reads
and writes (BAR traps, PRAMIN, guest tables) go through the VM's overlay view, which sees
its bytes wherever they are (shadow/frames.py).

The working set is the set of guest pages the VM's channel shadow page tables map, taken
from the guest entries of their last sync: exactly what its engines may touch when they
run, known without a fault.  It does not include pages reached only through the BAR
windows: those are CPU accesses, trapped and served from wherever the page is.  Pages stay
resident after the VM's turn until another VM needs their frames, so a VM that gets the
GPU back with its pages still in place moves nothing.

A working set that cannot be placed at all (its pages reach past the pool, which holds
at most `pool_pages` of any VM) is refused with one error, and only that VM is faulted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from gpuvm.device.gpu import Gpu
from gpuvm.device.migrate import copy_runs
from shadow.frames import (NOT_RESIDENT, PAGE, BackingStore, FrameTable, OverlayView,
                           ResidentPolicy, repoint, runs, working_set)
from shadow.page_table import ShadowSpace

COUNTERS = ("residency_pages_in", "residency_pages_out", "residency_bytes",
            "residency_switches", "residency_switch_ns")
NOBODY = -1


class WorkingSetTooLarge(Exception):
    """A VM's working set alone does not fit the physical VRAM it could be given."""


@dataclass
class Tenant:
    """One oversubscribed vGPU's residency: its frames, backing store and views."""

    key: int
    name: str
    frames: FrameTable
    backing: BackingStore
    view: OverlayView
    count: Callable[[str, int], None] = lambda name, n: None
    spaces: Callable[[], Iterable[ShadowSpace]] = lambda: ()
    flush: Callable[[int], None] = lambda pd: None
    policy: ResidentPolicy | None = None

    def shadow_pds(self) -> list[int]:
        return [s.shadow_pd for s in self.spaces()]


class Residency:
    """The pool of one GPU (frames [pool_base, pool_base + pool_pages pages)) and the
    oversubscribed vGPUs sharing it.  Every call is made under the mediator's lock."""

    def __init__(self, gpu: Gpu, pool_base: int, pool_size: int) -> None:
        self.gpu = gpu
        self.vram = gpu.vram
        self.pool_base = pool_base
        self.pool_pages = pool_size // PAGE
        self.owner = np.full(self.pool_pages, NOBODY, dtype=np.int64)  # tenant key per frame
        self.tenants: dict[int, Tenant] = {}
        self._next = 0

    def join(self, name: str, vram_size: int) -> Tenant:
        """A new oversubscribed vGPU: all of its VRAM in a fresh (zero) backing store,
        nothing resident, so nothing a previous tenant left in a frame is ever seen."""
        backing = BackingStore(vram_size)
        try:
            view = OverlayView(self.vram, backing)
        except OSError:
            backing.close()
            raise
        self._next += 1
        tenant = Tenant(self._next, name, FrameTable(vram_size // PAGE), backing, view)
        self.tenants[tenant.key] = tenant
        return tenant

    def leave(self, tenant: Tenant) -> None:
        """The vGPU is gone (its channels are off the device): its frames are free."""
        self.owner[self.owner == tenant.key] = NOBODY
        self.tenants.pop(tenant.key, None)
        tenant.view.close()
        tenant.backing.close()

    # ------------------------------------------------------------------ the switch
    def make_resident(self, tenant: Tenant) -> None:
        """Make the tenant's working set resident (see the module doc); raises
        WorkingSetTooLarge, having moved nothing, if it cannot be."""
        want = working_set(tenant.spaces(), tenant.policy)
        pages = np.flatnonzero(want)
        if pages.size and pages[-1] >= self.pool_pages:
            raise WorkingSetTooLarge(
                f"working set of {pages.size * PAGE >> 20} MiB (guest VRAM up "
                f"to {(int(pages[-1]) + 1) * PAGE >> 20} MiB) exceeds the physical VRAM the "
                f"GPU can hold for it ({self.pool_pages * PAGE >> 20} MiB of "
                f"{self.vram.size >> 20} MiB)")
        need = pages[tenant.frames.frame[pages] == NOT_RESIDENT]
        if need.size == 0:
            return
        elapsed = 0
        holders = self.owner[need]
        for key in np.unique(holders[holders != NOBODY]).tolist():
            elapsed += self._evict(self.tenants[key], need[holders == key])
        elapsed += self._bring_in(tenant, need)
        tenant.count("residency_switches", 1)
        tenant.count("residency_switch_ns", elapsed)

    def _evict(self, victim: Tenant, pages: np.ndarray) -> int:
        """Copy the victim's pages out to its backing store, drop its shadow entries to
        them, and point its view at the store."""
        moves = [(self._frames(first, n), victim.backing.u8[first * PAGE:(first + n) * PAGE])
                 for first, n in runs(pages)]
        elapsed = copy_runs(self.gpu, moves)
        victim.frames.frame[pages] = NOT_RESIDENT
        self.owner[pages] = NOBODY
        for first, n in runs(pages):
            victim.view.place(first, n, None)
        repoint(victim.spaces(), victim.policy, self.vram)
        for pd in victim.shadow_pds():
            victim.flush(pd)
        victim.count("residency_pages_out", int(pages.size))
        victim.count("residency_bytes", int(pages.size) * PAGE)
        return elapsed

    def _bring_in(self, tenant: Tenant, pages: np.ndarray) -> int:
        moves = [(tenant.backing.u8[first * PAGE:(first + n) * PAGE], self._frames(first, n))
                 for first, n in runs(pages)]
        elapsed = copy_runs(self.gpu, moves)
        tenant.frames.frame[pages] = pages  # direct-mapped: guest page p in frame p
        self.owner[pages] = tenant.key
        for first, n in runs(pages):
            tenant.view.place(first, n, self.pool_base + first * PAGE)
        repoint(tenant.spaces(), tenant.policy, self.vram)
        for pd in tenant.shadow_pds():
            tenant.flush(pd)
        tenant.count("residency_pages_in", int(pages.size))
        tenant.count("residency_bytes", int(pages.size) * PAGE)
        return elapsed

    def _frames(self, first: int, n: int) -> np.ndarray:
        base = self.pool_base + first * PAGE
        return self.vram.u8[base:base + n * PAGE]

    def resident_pages(self, tenant: Tenant) -> int:
        return int(tenant.frames.resident().sum())

