"""Where the pages of an oversubscribed guest's VRAM are: a pool frame or the backing store.

An oversubscribed vGPU's VRAM is larger than its share of the GPU, so its pages live in a
host-memory backing store and only those in use are resident in physical VRAM, in a pool
of frames that every oversubscribed vGPU of the GPU shares.  Three views of that fact are
kept here, each as one numpy array or one mapping:

- `FrameTable`: per guest page, the pool frame holding it now, or NOT_RESIDENT.  Frames are
  direct-mapped (guest page p can live only in pool frame p): a guest's page tables,
  instance blocks and large pages then stay contiguous wherever they are, so the shadow
  code that reads a guest table as one array, and large pages of 128 KiB, keep working
  unchanged; the price is that two guests' page p compete for one frame (which is what two
  tenants running the same driver do anyway, since both allocate from the bottom).
- `OverlayView`: the mediator's CPU view of the vGPU's memory, a drop-in for `Vram`.  Below
  `base` it is physical VRAM itself (shadow tables, BAR page tables); from `base` on it is
  the guest's VRAM page by page, mapped onto the pool frame while resident and onto the
  backing store otherwise (mmap MAP_FIXED over one reserved range).  Every mediator read
  of a guest table, instance block, PRAMIN or BAR access then sees the guest's own bytes
  whatever is resident, with no copy and no coherence protocol.
- `ResidentPolicy`: entry validation and translation for the vGPU's channel shadows.  A
  VRAM entry becomes the physical address of its frame if the page is resident for this
  vGPU, and not-present otherwise, so the GPU can reach only frames this vGPU owns at the
  moment; after frames move, `repoint` rewrites the shadows from the guest entries that
  the last sync recorded (no rescan, no sync counted).
"""

from __future__ import annotations

import ctypes
import mmap
import os
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from gpuvm.device import host_memory, layout, regs
from gpuvm.device.vram import Vram
from shadow.entries import EntryPolicy
from shadow.page_table import LARGE, ShadowSpace

NOT_RESIDENT = -1
PAGE = regs.SMALL_PAGE
LARGE_SPAN = regs.LARGE_PAGE // regs.SMALL_PAGE  # small pages in one large page

_PAGE_SHIFT = np.uint64(regs.SMALL_PAGE_SHIFT)


class BackingStore:
    """Host memory holding one vGPU's guest VRAM while it is not resident: a memfd, so
    that the overlay view can map its pages; sparse, so it costs what the guest touched."""

    def __init__(self, size: int) -> None:
        if size <= 0 or size % PAGE:
            raise ValueError(f"backing store size {size:#x} is not a positive multiple of 4 KiB")
        self.size = size
        self.fd = os.memfd_create("gpuvm-backing", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, size)
        self._map = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED | host_memory.MAP_NORESERVE,
                              prot=host_memory.PROT_READ_WRITE)
        self.u8 = np.frombuffer(self._map, dtype=np.uint8)

    def close(self) -> None:
        self.u8 = np.empty(0, dtype=np.uint8)
        host_memory.close_memfd_mapping(self.fd, self._map)
        self.fd = -1


class FrameTable:
    """Per guest page of one vGPU: the pool frame holding it, or NOT_RESIDENT."""

    def __init__(self, pages: int) -> None:
        self.frame = np.full(pages, NOT_RESIDENT, dtype=np.int64)

    @property
    def pages(self) -> int:
        return self.frame.size

    def resident(self) -> np.ndarray:
        return self.frame != NOT_RESIDENT

    def resident_spans(self, first: np.ndarray, span: int) -> np.ndarray:
        """Whether each run of `span` pages starting at `first` is wholly resident in
        consecutive frames (direct mapping makes consecutive the same as resident)."""
        res = self.resident()
        if span == 1:
            return res[first]
        chunks = res[:res.size - res.size % span].reshape(-1, span).all(axis=1)
        idx = first // span
        ok = np.zeros(first.shape, dtype=bool)
        inside = idx < chunks.size
        ok[inside] = chunks[idx[inside]]
        return ok


def runs(pages: np.ndarray) -> Iterable[tuple[int, int]]:
    """(first, count) of each run of consecutive page numbers in a sorted array."""
    if pages.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(pages) != 1) + 1
    starts = np.concatenate(([0], breaks))
    ends = np.concatenate((breaks, [pages.size]))
    return [(int(pages[s]), int(e - s)) for s, e in zip(starts, ends)]


class OverlayView:
    """A `Vram` for the mediator's side of one oversubscribed vGPU (see the module doc):
    physical VRAM below `base`, the guest's VRAM from `base` on, each page onto its frame or
    onto the backing store."""

    def __init__(self, vram: Vram, backing: BackingStore) -> None:
        self.vram = vram
        self.backing = backing
        align = regs.LARGE_PAGE
        self.base = (vram.size + align - 1) & ~(align - 1)
        self.size = self.base + backing.size
        self._addr = host_memory.reserve(self.size)
        vram.map_onto(self._addr)  # physical VRAM below base (its pool frames are not carved)
        host_memory.map_fixed(self._addr + self.base, backing.size, backing.fd, 0)
        buf = (ctypes.c_uint8 * self.size).from_address(self._addr)
        self.u8 = np.ctypeslib.as_array(buf)
        self.u32 = self.u8.view(np.uint32)
        self.u64 = self.u8.view(np.uint64)

    @property
    def host_address(self) -> int:
        return self._addr

    def place(self, first: int, count: int, frame_addr: int | None) -> None:
        """Guest pages [first, first+count) now live at physical VRAM frame_addr (or, with
        None, in the backing store at their own offset)."""
        at = self._addr + self.base + first * PAGE
        if frame_addr is None:
            host_memory.map_fixed(at, count * PAGE, self.backing.fd, first * PAGE)
        else:
            fd, offset = self.vram.backing(frame_addr)
            host_memory.map_fixed(at, count * PAGE, fd, offset)

    def contains(self, addr: int, length: int) -> bool:
        return 0 <= addr and length >= 0 and addr + length <= self.size

    def zero(self, addr: int, length: int) -> None:
        if length > 0:
            self.u8[addr:addr + length] = 0

    def read_u32(self, addr: int) -> int:
        if addr & 3:
            return int.from_bytes(self.u8[addr:addr + 4].tobytes(), "little")
        return int(self.u32[addr >> 2])

    def write_u32(self, addr: int, value: int) -> None:
        self.write_bytes(addr, 4, value)

    def read_bytes(self, addr: int, length: int) -> int:
        return int.from_bytes(self.u8[addr:addr + length].tobytes(), "little")

    def write_bytes(self, addr: int, length: int, value: int) -> None:
        data = (value & ((1 << (8 * length)) - 1)).to_bytes(length, "little")
        self.u8[addr:addr + length] = np.frombuffer(data, dtype=np.uint8)

    def close(self) -> None:
        """Unmap (nothing may use the arrays after this)."""
        self.u8 = self.u32 = self.u64 = np.empty(0, dtype=np.uint8)
        if self._addr:
            host_memory.unmap(self._addr, self.size)
            self._addr = 0


def _decode(entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(VRAM-and-present mask, address) of shadow-format entries."""
    entries = entries.astype(np.uint64, copy=False)
    vram = layout.ptes_target(entries) == np.uint64(regs.TARGET_VRAM)
    return layout.ptes_present(entries) & vram, layout.ptes_addr(entries)


@dataclass(frozen=True)
class ResidentPolicy(EntryPolicy):
    """EntryPolicy of an oversubscribed vGPU's channel shadows: `vram_base` is the guest's
    VRAM in the overlay view (for the mediator's reads); a translated VRAM entry is the
    physical address of the page's pool frame (`frame_base` is frame 0) when the page is
    resident for this vGPU, and not present otherwise.  Dropping a non-resident entry is
    not a refusal (the guest did nothing wrong): it is not counted as one."""

    frame_base: int = 0
    frames: FrameTable | None = None

    def plain(self) -> EntryPolicy:
        return EntryPolicy(self.vram_base, self.vram_size, self.sys_base, self.sys_ranges,
                           self.engine_base)

    def translate(self, ptes: np.ndarray, page: int = regs.SMALL_PAGE) -> tuple[np.ndarray, np.ndarray]:
        shadow, refused = self.plain().translate(ptes, page)
        in_vram, addr = _decode(shadow)
        if not in_vram.any():
            return shadow, refused
        idx = np.flatnonzero(in_vram)
        guest = addr[idx] - np.uint64(self.vram_base)
        first = (guest >> _PAGE_SHIFT).astype(np.int64)
        ok = self.frames.resident_spans(first, page // PAGE)
        frame = self.frames.frame[first[ok]].astype(np.uint64)
        phys = np.uint64(self.frame_base) + (frame << _PAGE_SHIFT)
        out = shadow.copy()
        out[idx[~ok]] = 0
        kept = idx[ok]
        out[kept] = layout.ptes_with_addr(shadow[kept], phys)
        return out, refused


def _tables(space: ShadowSpace):
    """(page size, guest entries as of the last sync, shadow table address) of every
    table the shadow of this space holds."""
    for (_, kind), pt in space._pts.items():
        yield (regs.LARGE_PAGE if kind == LARGE else regs.SMALL_PAGE), pt.snapshot, pt.shadow


def working_set(spaces: Iterable[ShadowSpace], policy: ResidentPolicy) -> np.ndarray:
    """The guest pages the channel shadows map (whether resident or not), as a mask: what
    the GPU may touch when this vGPU's channels run."""
    plain = policy.plain()
    mask = np.zeros(policy.frames.pages, dtype=bool)
    for space in spaces:
        for page, snapshot, _ in _tables(space):
            translated, _ = plain.translate(snapshot, page)
            in_vram, addr = _decode(translated)
            first = ((addr[in_vram] - np.uint64(policy.vram_base)) >> _PAGE_SHIFT).astype(np.int64)
            span = page // PAGE
            for k in range(span):
                pages = first + k
                mask[pages[pages < mask.size]] = True
    return mask


def repoint(spaces: Iterable[ShadowSpace], policy: ResidentPolicy, vram: Vram) -> int:
    """Rewrite every channel shadow table from the guest entries of its last sync, under
    the frames as they are now; returns how many entries changed.  The caller flushes."""
    changed = 0
    for space in spaces:
        for page, snapshot, shadow in _tables(space):
            translated, _ = policy.translate(snapshot, page)
            dest = vram.u64[shadow >> 3:(shadow >> 3) + snapshot.size]
            changed += int((dest != translated).sum())
            dest[:] = translated
    return changed
