"""Which guest BAR pages may be mapped straight onto VRAM (BAR remap).

A page may be remapped when its shadow entry points at VRAM inside the VM's slice and
holds nothing the mediator must see: no page table, no instance block, no doorbell.
Those stay trapped, and a page that becomes sensitive later is torn down again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shadow.bar_window import NOT_VRAM


@dataclass
class RemapPlan:
    """The desired host page address per BAR page (NOT_VRAM = keep trapping)."""

    pages: np.ndarray  # int64

    @classmethod
    def build(cls, host_pages: np.ndarray, sensitive_host_pages: set[int],
              trapped_offsets: set[int]) -> "RemapPlan":
        want = host_pages.copy()
        if sensitive_host_pages:
            mask = np.isin(want, np.fromiter(sensitive_host_pages, dtype=np.int64))
            want[mask] = NOT_VRAM
        for off in trapped_offsets:
            if 0 <= off >> 12 < want.size:
                want[off >> 12] = NOT_VRAM
        return cls(want)


@dataclass
class RemapState:
    """What is currently mapped; `apply` yields the changes as coalesced runs."""

    pages: np.ndarray
    changes: int = field(default=0)
    # pages mapped now, kept as they change: a recorded VM reads it with every counter
    # snapshot, and comparing a 64k-page BAR each time was a fifth of the snapshot
    mapped: int = field(init=False)

    def __post_init__(self) -> None:
        self.mapped = int((self.pages != NOT_VRAM).sum())

    @classmethod
    def empty(cls, n: int) -> "RemapState":
        return cls(np.full(n, NOT_VRAM, dtype=np.int64))

    def diff(self, plan: RemapPlan) -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
        """(unmaps as (first page, count), maps as (first page, count, host address))."""
        changed = plan.pages != self.pages
        unmaps: list[tuple[int, int]] = []
        maps: list[tuple[int, int, int]] = []
        idx = np.flatnonzero(changed)
        if idx.size == 0:
            return unmaps, maps
        unmaps.extend(_runs(idx[self.pages[idx] != NOT_VRAM]))
        want = plan.pages
        # coalesce pages that are consecutive in both BAR offset and host address
        for p in idx[want[idx] != NOT_VRAM].tolist():
            if maps:
                first, n, host = maps[-1]
                if p == first + n and int(want[p]) == host + n * 4096:
                    maps[-1] = (first, n + 1, host)
                    continue
            maps.append((p, 1, int(want[p])))
        self.pages = want.copy()
        self.mapped = int((want != NOT_VRAM).sum())
        self.changes += len(unmaps) + len(maps)
        return unmaps, maps


def _runs(idx: np.ndarray) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for p in idx.tolist():
        if out and out[-1][0] + out[-1][1] == p:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((p, 1))
    return out
