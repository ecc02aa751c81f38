"""A second MMU format for the page-table footprint study: a current NVIDIA GPU's.

The emulated GPU is a Fermi (two-level tables, 4 KiB / 128 KiB pages, gpuvm/device/mmu.py).
The seed's footprint arithmetic (4 MB of tables per TB at 2 MiB pages, 2 GiB at 4 KiB)
is about today's GPUs, whose MMU (Pascal on, "version 2") has five levels over a 49-bit
virtual address and three page sizes:

    PD3  bits 48:47    4 entries x 8 B
    PD2  bits 46:38  512 entries x 8 B (4 KiB)
    PD1  bits 37:29  512 entries x 8 B (4 KiB)
    PD0  bits 28:21  256 entries x 16 B (4 KiB): a dual entry -- qword 0 points at a
                     64 KiB-page table or IS a 2 MiB page (valid bit set), qword 1 points
                     at a 4 KiB-page table
    PT   4 KiB pages: bits 20:12, 512 x 8 B (4 KiB);  64 KiB pages: bits 20:16, 32 x 8 B

Entries (the fields the study needs, laid out as the format does): a pointer entry has
its aperture in bits 2:1 (1 = video memory) and the table's address >> 12 from bit 8; a
page entry has valid bit 0, aperture bits 2:1 (2 = coherent system memory) and the page's
address >> 12 from bit 8.

`build` writes real tables into emulated VRAM (gpuvm.device.vram.Vram) for one or more
address spaces mapping the same pinned host range -- each with its own tables, or shared
once through one owner whose PD1 tables the others' PD2 entries point at (the seed's IPC
arrangement) -- and `read_back` walks them from each space's root, counting what is
there and translating pages, without the builder's bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuvm.device.vram import Vram

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
VA_BITS = 49
PAGE_SIZES = {"4k": 4 * KiB, "64k": 64 * KiB, "2m": 2 * MiB}

# (name, lowest VA bit, entries, bytes per entry) from the root down to PD0
LEVELS = (("pd3", 47, 4, 8), ("pd2", 38, 512, 8), ("pd1", 29, 512, 8), ("pd0", 21, 256, 16))
PT_ENTRIES = {"4k": 512, "64k": 32}
PTE_SIZE = 8

APERTURE_SHIFT = 1
APERTURE_VIDMEM = 1
APERTURE_SYSMEM = 2
VALID = 1
ADDR_SHIFT = 8  # address >> 12, from bit 8
ADDR_MASK = (1 << 46) - 1


def pde(table: int) -> int:
    return APERTURE_VIDMEM << APERTURE_SHIFT | (table >> 12) << ADDR_SHIFT


def pte(phys: int) -> int:
    return VALID | APERTURE_SYSMEM << APERTURE_SHIFT | (phys >> 12) << ADDR_SHIFT


def entry_addr(entry: np.ndarray) -> np.ndarray:
    return ((entry >> np.uint64(ADDR_SHIFT)) & np.uint64(ADDR_MASK)) << np.uint64(12)


def _ptes(phys: int, count: int, size: int) -> np.ndarray:
    """Page entries for `count` pages of `size` from host address `phys` on."""
    frames = np.uint64(phys) + np.arange(count, dtype=np.uint64) * np.uint64(size)
    return np.uint64(VALID | APERTURE_SYSMEM << APERTURE_SHIFT) | \
        (frames >> np.uint64(12)) << np.uint64(ADDR_SHIFT)


def table_bytes(level: str) -> int:
    for name, _, entries, size in LEVELS:
        if name == level:
            return entries * size
    return PT_ENTRIES[level] * PTE_SIZE


def span(level_index: int) -> int:
    """VA bytes one entry of LEVELS[level_index] covers."""
    return 1 << LEVELS[level_index][1]


@dataclass(frozen=True)
class V2Footprint:
    """Exact counts for mapping `nbytes` with `page` pages in `spaces` address spaces."""

    page: str
    nbytes: int
    spaces: int
    shared: bool
    tables: dict[str, int]  # tables per level, all spaces
    entries: dict[str, int]  # non-empty entries per level, all spaces (pte: page entries)

    @property
    def table_bytes(self) -> int:
        return sum(n * table_bytes(level) for level, n in self.tables.items())

    @property
    def pte_bytes(self) -> int:
        """Bytes of the entries that map pages (8 B each; a 2 MiB page sits in a 16-byte
        PD0 slot, whose other half is counted in table_bytes, not here)."""
        return self.entries["pte"] * PTE_SIZE


def footprint(nbytes: int, page: str, spaces: int = 1, shared: bool = False,
              va: int = 0) -> V2Footprint:
    """The counts, by arithmetic, for [va, va + nbytes)."""
    size = PAGE_SIZES.get(page)
    if size is None:
        raise ValueError(f"page size {page!r} is not one of {', '.join(PAGE_SIZES)}")
    if nbytes <= 0 or nbytes % size or va % size or va + nbytes > 1 << VA_BITS:
        raise ValueError(f"{nbytes} bytes at {va:#x} is not whole {page} pages inside "
                         f"the {VA_BITS}-bit space")
    if spaces < 1:
        raise ValueError(f"{spaces} address spaces: need at least one")

    def covering(bits: int) -> int:  # aligned blocks of 2^bits the range touches
        return ((va + nbytes - 1) >> bits) - (va >> bits) + 1

    owners = 1 if shared else spaces
    tables = {"pd3": spaces, "pd2": covering(47) * spaces, "pd1": covering(38) * owners,
              "pd0": covering(29) * owners}
    entries = {"pd3": covering(47) * spaces, "pd2": covering(38) * spaces,
               "pd1": covering(29) * owners}
    if page == "2m":
        entries["pd0"] = 0
    else:
        tables[page] = covering(21) * owners
        entries["pd0"] = covering(21) * owners
    entries["pte"] = nbytes // size * owners
    return V2Footprint(page, nbytes, spaces, shared, tables, entries)


class Builder:
    """Writes version-2 tables into a Vram, allocating tables from its start."""

    def __init__(self, vram: Vram) -> None:
        self.vram = vram
        self.next = 0
        self.u64 = vram.u64

    def alloc(self, nbytes: int) -> int:
        addr = self.next
        self.next += -(-nbytes // 4096) * 4096  # tables are 4 KiB aligned
        if self.next > self.vram.size:
            raise MemoryError(f"emulated VRAM of {self.vram.size} bytes is full")
        return addr

    def space(self) -> int:
        return self.alloc(table_bytes("pd3"))

    def _child(self, table: int, index: int, level: int) -> int:
        """The table entry `index` of a table at LEVELS[level] points at (made if absent)."""
        slot = (table + index * LEVELS[level][3]) >> 3
        if self.u64[slot]:
            return int(entry_addr(self.u64[slot:slot + 1])[0])
        child = self.alloc(table_bytes(LEVELS[level + 1][0]))
        self.u64[slot] = pde(child)
        return child

    def pd1_of(self, root: int, va: int) -> int:
        return self._child(self._child(root, (va >> 47) & 3, 0), (va >> 38) & 511, 1)

    def map(self, root: int, va: int, phys: int, nbytes: int, page: str) -> None:
        """Map [va, va + nbytes) (va 2 MiB aligned, not mapped before) onto phys.. in
        `page` pages: per PD0 table (512 MiB), its slots and leaf tables written at once."""
        size = PAGE_SIZES[page]
        if va % (2 * MiB) or phys % size:
            raise ValueError(f"map at {va:#x} -> {phys:#x}: need va 2 MiB aligned, phys "
                             f"{page} aligned")
        end = va + nbytes
        for chunk in range(va >> 29 << 29, end, 1 << 29):
            lo, hi = max(va, chunk), min(end, chunk + (1 << 29))
            pd0 = self._child(self.pd1_of(root, chunk), (chunk >> 29) & 511, 2)
            first = (lo - chunk) >> 21
            blocks = -(-(hi - lo) // (2 * MiB))
            slots = (pd0 >> 3) + 2 * (first + np.arange(blocks, dtype=np.int64))
            if page == "2m":
                self.u64[slots] = _ptes(phys + lo - va, blocks, size)
                continue
            entries = PT_ENTRIES[page]
            base = self.alloc(blocks * 4096)  # one 4 KiB-aligned table per 2 MiB block
            tables = base + 4096 * np.arange(blocks, dtype=np.int64)
            self.u64[slots + (1 if page == "4k" else 0)] = \
                np.uint64(APERTURE_VIDMEM << APERTURE_SHIFT) | \
                (tables.astype(np.uint64) >> np.uint64(12)) << np.uint64(ADDR_SHIFT)
            k = np.arange((hi - lo) // size, dtype=np.int64)
            self.u64[(tables[k // entries] >> 3) + k % entries] = \
                _ptes(phys + lo - va, k.size, size)

    def share(self, owner: int, other: int, va: int, nbytes: int) -> None:
        """Point `other`'s PD2 entries for the range at `owner`'s PD1 tables."""
        for index in range(va >> 38, (va + nbytes - 1 >> 38) + 1):
            owner_pd1 = self.pd1_of(owner, index << 38)
            pd2 = self._child(other, (index >> 9) & 3, 0)
            self.u64[(pd2 >> 3) + (index & 511)] = pde(owner_pd1)


@dataclass(frozen=True)
class ReadBack:
    """What walking the tables in VRAM found, from each space's root."""

    tables: dict[str, int]  # distinct tables per level
    entries: dict[str, int]  # non-empty entries per level (distinct tables), pte: pages
    table_bytes: int
    vram_used: int  # bytes the builder allocated
    pages_checked: int
    pages_translated: int  # of those, translated to the intended host address


def _batches(u64: np.ndarray, tables: list[int], qwords: int):
    """The entries of the tables, 4096 tables at a time (a TiB of 4 KiB tables is 2 GiB)."""
    offsets = np.arange(qwords, dtype=np.int64)
    for start in range(0, len(tables), 4096):
        bases = np.asarray(tables[start:start + 4096], dtype=np.int64) >> 3
        yield u64[(bases[:, None] + offsets[None, :]).ravel()]


def read_back(vram: Vram, roots: list[int], used: int, va: int, phys: int, nbytes: int,
              page: str, sample: int = 4096) -> ReadBack:
    u64 = vram.u64
    tables: dict[str, set[int]] = {"pd3": set(roots)}
    entries: dict[str, int] = {}
    leaf: dict[str, set[int]] = {"4k": set(), "64k": set()}
    for level, (name, _, count, esize) in enumerate(LEVELS):
        raw = np.concatenate(list(_batches(u64, sorted(tables[name]), count * esize // 8)))
        if name == "pd0":
            big, small = raw[0::2], raw[1::2]
            huge = (big & np.uint64(VALID)) != 0
            pointer = (big != 0) & ~huge
            entries["pd0"] = int(np.count_nonzero(pointer) + np.count_nonzero(small))
            entries["pte"] = int(np.count_nonzero(huge))
            leaf["64k"] = set(entry_addr(big[pointer]).astype(np.int64).tolist())
            leaf["4k"] = set(entry_addr(small[small != 0]).astype(np.int64).tolist())
            break
        live = raw[raw != 0]
        entries[name] = int(live.size)
        tables[LEVELS[level + 1][0]] = set(entry_addr(live).astype(np.int64).tolist())
    out_tables = {name: len(tables[name]) for name, *_ in LEVELS}
    for kind, found in leaf.items():
        if found:
            out_tables[kind] = len(found)
            entries["pte"] += sum(int(np.count_nonzero(batch)) for batch in
                                  _batches(u64, sorted(found), PT_ENTRIES[kind]))
    checked, good = _translate(u64, roots, va, phys, nbytes, page, sample)
    return ReadBack(out_tables, entries,
                    sum(n * table_bytes(level) for level, n in out_tables.items()),
                    used, checked, good)


def _walk(u64: np.ndarray, root: int, addr: int) -> int | None:
    """The host address the tables under `root` translate `addr` to (None: unmapped)."""
    table = root
    for level, (_, low, count, esize) in enumerate(LEVELS):
        index = (addr >> low) & (count - 1) if level else 0
        slot = (table + index * esize) >> 3
        if LEVELS[level][0] == "pd0":
            big, small = int(u64[slot]), int(u64[slot + 1])
            if big & VALID:
                return ((big >> ADDR_SHIFT) & ADDR_MASK) << 12 | addr & (2 * MiB - 1)
            for qword, kind in ((small, "4k"), (big, "64k")):
                if not qword:
                    continue
                shift = 12 if kind == "4k" else 16
                pt = ((qword >> ADDR_SHIFT) & ADDR_MASK) << 12
                entry = int(u64[(pt >> 3) + ((addr & (2 * MiB - 1)) >> shift)])
                if entry & VALID:
                    return ((entry >> ADDR_SHIFT) & ADDR_MASK) << 12 | addr & ((1 << shift) - 1)
            return None
        entry = int(u64[slot])
        if not entry:
            return None
        table = ((entry >> ADDR_SHIFT) & ADDR_MASK) << 12
    return None


def _translate(u64: np.ndarray, roots: list[int], va: int, phys: int, nbytes: int,
               page: str, sample: int) -> tuple[int, int]:
    """Translate every page, or `sample` of them (the first, the last, evenly between)."""
    pages = nbytes // PAGE_SIZES[page]
    picks = range(pages) if pages <= sample else \
        sorted({0, pages - 1, *np.linspace(0, pages - 1, sample, dtype=np.int64).tolist()})
    checked = good = 0
    for root in roots:
        for i in picks:
            addr = va + i * PAGE_SIZES[page] + 123 * 8  # a byte inside the page
            checked += 1
            good += _walk(u64, root, addr) == phys + addr - va
    return checked, good


def build(nbytes: int, page: str, spaces: int = 1, shared: bool = False,
          va: int = 1 << 38, phys: int = 1 << 40, sample: int = 4096) -> ReadBack:
    """Build the tables for real in a fresh emulated VRAM just large enough, read them
    back.  `va` defaults to a 256 GiB boundary, so sharing covers whole PD2 entries."""
    expect = footprint(nbytes, page, spaces, shared, va)
    if shared and va % (1 << 38):
        raise ValueError("a shared mapping starts on a 256 GiB boundary (one PD2 entry)")
    vram = Vram(vram_needed(expect))
    try:
        builder = Builder(vram)
        roots = [builder.space() for _ in range(spaces)]
        for root in roots[:1] if shared else roots:
            builder.map(root, va, phys, nbytes, page)
        for root in roots[1:] if shared else []:
            builder.share(roots[0], root, va, nbytes)
        return read_back(vram, roots, builder.next, va, phys, nbytes, page, sample)
    finally:
        vram.close()


def vram_needed(f: V2Footprint) -> int:
    """Emulated VRAM a build of `f` takes: every table in its own 4 KiB (the entries hold
    table addresses >> 12)."""
    return 4096 * sum(f.tables.values())


SEED_PTE_BYTES = 8  # the seed's arithmetic: one 8-byte entry per page, nothing else


def study(nbytes: int, counts: list[int], build_limit: int, va: int = 1 << 38
          ) -> list[tuple[V2Footprint, ReadBack | None]]:
    """Every page size x space count (x own / shared tables where several): the counts,
    and the tables built and read back where their VRAM fits `build_limit` (None: not
    built)."""
    rows = []
    for page in PAGE_SIZES:
        for spaces in counts:
            for shared in ((False,) if spaces == 1 else (False, True)):
                f = footprint(nbytes, page, spaces, shared, va)
                built = build(nbytes, page, spaces, shared, va) \
                    if vram_needed(f) <= build_limit else None
                rows.append((f, built))
    return rows


def agrees(f: V2Footprint, b: ReadBack) -> bool:
    """Whether what was read back is what the arithmetic says, every page translated."""
    return b.tables == f.tables and b.entries == f.entries and \
        b.table_bytes == f.table_bytes and b.pages_translated == b.pages_checked
