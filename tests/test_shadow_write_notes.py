"""A trapped store marks exactly the table entries it overlaps: none when it only
touches a table's edge from outside, both entries when it straddles two, the first or
last when it straddles a table's end.  (The trap path tests the overlap before it calls
a tracker at all: every trapped store passes every tracker of a VM.)"""

from __future__ import annotations

import pytest

from gpuvm.device import regs
from gpuvm.device.vram import Vram
from shadow.bar_window import BarWindow
from shadow.dirty import WriteTracker
from shadow.entries import EntryPolicy

BASE = 0x10000
ENTRIES = 8
END = BASE + ENTRIES * regs.PTE_SIZE


CASES = [
    (BASE - 8, 8, []),             # ends where the table begins
    (END, 8, []),                  # begins where it ends
    (BASE - 4, 8, [0]),            # straddles its start
    (END - 4, 8, [ENTRIES - 1]),   # straddles its end
    (BASE + 4, 8, [0, 1]),         # straddles two entries
    (BASE + 8, 4, [1]),            # the low word of one
    (END - 1, 1, [ENTRIES - 1]),   # its last byte
    (BASE - 8, ENTRIES * 8 + 16, list(range(ENTRIES))),  # over all of it
]


@pytest.mark.parametrize("addr, size, marked", CASES)
def test_a_store_marks_the_entries_it_overlaps(addr: int, size: int,
                                               marked: list[int]) -> None:
    tracker = WriteTracker(BASE, ENTRIES, None)
    tracker.note(addr, size)
    tracker.note(addr, size)  # a second store to the same entries marks nothing new
    assert tracker.stored().tolist() == marked and tracker.marked == len(marked)


@pytest.mark.parametrize("addr, size, marked", CASES)
def test_a_bar_window_hands_its_table_tracker_the_stores_that_overlap_it(
        addr: int, size: int, marked: list[int]) -> None:
    window = BarWindow(Vram(regs.MiB), EntryPolicy(0, regs.MiB, 1 << 36, lambda: []),
                       lambda name, n: None, phys_pt=0, first_index=0, pages=ENTRIES)
    window._table = WriteTracker(BASE, ENTRIES, None)  # as a walk of a VRAM table leaves it
    window.note_write(addr, size)
    assert window._table.stored().tolist() == marked
