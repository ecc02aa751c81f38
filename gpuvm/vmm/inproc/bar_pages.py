"""BAR remap for in-process guests: per-BAR page tables the guest's platform layer reads.

The KVM backend remaps a BAR page by giving it a memslot; an in-process guest has no
MMU to program, so its platform layer looks each BAR access up in a table with one u64
per 4 KiB page (boot parameter `host_bar_pages`): 0 traps (calls back), anything else is
the host address the page is backed by.  `BarPageSink` fills those tables and plugs into
the KVM backend's MemslotTable as its "VM", so the mediator remaps pages with the same
calls (`runner.memslots.map(gpa, host_address, size)`) whichever backend runs the guest.

Read-only slots leave their pages trapping: the tables have no permission bit, and a
trapped access reaches the same memory, only slower.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np

from gpuvm.vmm import abi
from gpuvm.vmm.abi import BAR_BASES
from gpuvm.vmm.kvm import kvm_api
from gpuvm.vmm.kvm.memslots import MemslotError, MemslotTable

PAGE = 0x1000
# The guest-physical BAR windows, as the KVM backend places them (and as boot params name them)


@dataclass
class _Window:
    bar: int
    base: int
    size: int
    pages: np.ndarray  # uint64, one entry per page

    @property
    def address(self) -> int:
        return self.pages.ctypes.data


class BarPageSink:
    """The page tables of one guest's BARs, driven as a MemslotTable's slot sink."""

    max_memslots = 1 << 30
    readonly_mem = True  # accepted; such pages simply keep trapping

    def __init__(self, bar_sizes: dict[int, int]) -> None:
        self.windows: list[_Window] = []
        for bar, size in sorted(bar_sizes.items()):
            if bar in BAR_BASES:
                self.windows.append(_Window(bar, BAR_BASES[bar], size,
                                            np.zeros(size // PAGE, dtype=np.uint64)))
        self._slots: dict[int, tuple[_Window, int, int]] = {}

    def _window(self, gpa: int, size: int) -> _Window:
        for w in self.windows:
            if w.base <= gpa and gpa + size <= w.base + w.size:
                return w
        raise MemslotError(f"range {gpa:#x}+{size:#x} is not inside one BAR window")

    def set_memory_region(self, slot: int, gpa: int, size: int, host_address: int,
                          flags: int = 0) -> None:
        old = self._slots.pop(slot, None)
        if old is not None:
            w, first, count = old
            w.pages[first:first + count] = 0
        if size == 0:
            return
        w = self._window(gpa, size)
        first, count = (gpa - w.base) // PAGE, size // PAGE
        if not flags & kvm_api.KVM_MEM_READONLY:
            w.pages[first:first + count] = np.arange(count, dtype=np.uint64) * PAGE + host_address
        self._slots[slot] = (w, first, count)


def bar_memslots(bar_sizes: dict[int, int], ram_size: int) -> tuple[MemslotTable, BarPageSink]:
    """A MemslotTable whose slots land in a fresh BarPageSink."""
    sink = BarPageSink(bar_sizes)
    table = MemslotTable(first_slot=1, reserved=((0, ram_size),))
    table.bind(sink)
    return table, sink


def install(bp: abi.BootParams, sink: BarPageSink) -> None:
    """Point the boot parameters at the sink's tables."""
    for w in sink.windows:
        bp.host_bar_pages[w.bar] = ctypes.c_uint64(w.address).value
