"""VRAM taken by the GPU page tables that map pinned host memory.

Pinned sysram reaches a GPU context only through its page tables, and those live in
VRAM.  With the emulated Fermi layout (regs.py) a page directory entry covers 128 MiB and
points at a small-page table (4 KiB pages, 32768 entries) and/or a large-page table
(128 KiB pages, 1024 entries).  Every VM or process that maps the same host memory in its
own tables pays for them again; if one owner builds the tables and the others point their
directory entries at them (a shared mapping), only the directory entries are repeated.

`footprint` is the exact arithmetic; `build_and_count` builds the same tables with the
project's host-side writer (HostDriver, through PRAMIN into emulated VRAM), reads them
back from VRAM, and checks that the GPU's MMU translates every page as intended.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.device import layout, regs

PAGE_SIZES = {"4k": regs.SMALL_PAGE, "128k": regs.LARGE_PAGE}
ENTRIES_PER_PT = {"4k": regs.SMALL_PTES_PER_PT, "128k": regs.LARGE_PTES_PER_PT}

DEFAULT_VA = 4 * regs.GiB  # where the pinned range is mapped in each space (128 MiB aligned)
DEFAULT_PHYS = 4 * regs.GiB  # guest-physical (sysram) address of the pinned range


@dataclass(frozen=True)
class Footprint:
    """Page-table cost of mapping `nbytes` of pinned sysram in `spaces` address spaces."""

    page: str  # "4k" | "128k"
    nbytes: int
    spaces: int  # VMs or processes mapping the same memory
    shared: bool  # one owner's tables, the others' directory entries point at them
    ptes: int  # page-table entries written, all spaces
    pdes: int  # directory entries written, all spaces
    pts: int  # page tables allocated, all spaces
    pt_bytes: int  # VRAM of those tables (whole tables, as allocated)

    @property
    def pte_bytes(self) -> int:
        return self.ptes * regs.PTE_SIZE

    @property
    def pde_bytes(self) -> int:
        return self.pdes * regs.PDE_SIZE

    @property
    def entry_bytes(self) -> int:
        """(PTEs + PDEs) x 8: the entries themselves."""
        return self.pte_bytes + self.pde_bytes


def footprint(nbytes: int, page: str, spaces: int = 1, shared: bool = False,
              va: int = DEFAULT_VA) -> Footprint:
    """Exact counts for mapping [va, va+nbytes) with `page` pages in `spaces` spaces.

    Each directory entry covers regs.PDE_SPAN; each table it points at is allocated whole
    (the host driver never uses the large-table size field to shorten one)."""
    if page not in PAGE_SIZES:
        raise ValueError(f"page size {page!r} is not one of {', '.join(PAGE_SIZES)}")
    size = PAGE_SIZES[page]
    if nbytes <= 0 or nbytes % size:
        raise ValueError(f"{nbytes} bytes is not a positive multiple of the {page} page")
    if va % size or va < 0 or va + nbytes > regs.VA_LIMIT:
        raise ValueError(f"VA {va:#x} is not {page}-aligned inside the {regs.VA_BITS}-bit space")
    if spaces < 1:
        raise ValueError(f"{spaces} address spaces: need at least one")
    ptes_one = nbytes // size
    pdes_one = ((va + nbytes - 1) >> regs.PDE_SPAN_SHIFT) - (va >> regs.PDE_SPAN_SHIFT) + 1
    table_copies = 1 if shared else spaces
    return Footprint(page, nbytes, spaces, shared,
                     ptes=ptes_one * table_copies, pdes=pdes_one * spaces,
                     pts=pdes_one * table_copies,
                     pt_bytes=pdes_one * table_copies * ENTRIES_PER_PT[page] * regs.PTE_SIZE)


def footprint_table(nbytes: int, vm_counts: list[int]) -> list[Footprint]:
    rows = []
    for page in PAGE_SIZES:
        for spaces in vm_counts:
            for shared in ((False,) if spaces == 1 else (False, True)):
                rows.append(footprint(nbytes, page, spaces, shared))
    return rows


def vm_pt_footprint(pinned_bytes: int, processes: int = 1, vms: int = 1,
                    shared: bool = False) -> dict[str, dict[str, int]]:
    """VRAM of the GPU page tables that map `pinned_bytes` of a guest's pinned sysram,
    in 4 KiB and in 128 KiB pages, when `vms` x `processes` address spaces map the same
    memory each in their own tables (or, `shared`, through one owner's tables).

    The range is rounded up to whole 128 KiB pages so both page sizes map the same bytes;
    0 bytes map nothing.  Per page size: ptes, pdes, pts, pt_bytes (whole tables as
    allocated) and entry_bytes ((PTEs + PDEs) x 8); `gpuvm smi` and experiment rows use it."""
    out: dict[str, dict[str, int]] = {}
    nbytes = -(-max(0, pinned_bytes) // regs.LARGE_PAGE) * regs.LARGE_PAGE
    for page in PAGE_SIZES:
        if nbytes == 0:
            out[page] = {"ptes": 0, "pdes": 0, "pts": 0, "pt_bytes": 0, "entry_bytes": 0}
            continue
        f = footprint(nbytes, page, spaces=vms * processes, shared=shared)
        out[page] = {"ptes": f.ptes, "pdes": f.pdes, "pts": f.pts, "pt_bytes": f.pt_bytes,
                     "entry_bytes": f.entry_bytes}
    return out


# ------------------------------------------------------------------ cross-check
@dataclass(frozen=True)
class Built:
    """What building the tables for real used, read back from emulated VRAM."""

    allocated_bytes: int  # the host driver's VRAM allocations, directories excluded
    ptes: int  # non-zero entries in the distinct tables the directories point at
    pdes: int  # non-zero directory entries, all spaces
    pts: int  # distinct tables referenced
    pages_translated: int  # 4 KiB pages the MMU translated to the intended sysram frames


def build_and_count(nbytes: int, page: str, spaces: int = 1, shared: bool = False,
                    va: int = DEFAULT_VA, phys: int = DEFAULT_PHYS) -> Built:
    """Build the tables with the host driver in a fresh emulated GPU and count them."""
    import numpy as np

    from gpuvm.device.gpu import Gpu
    from gpuvm.device.host_driver import HostDriver
    from gpuvm.device.mmu import Space

    expect = footprint(nbytes, page, spaces, shared, va)  # validates the arguments
    gpu = Gpu()
    try:
        drv = HostDriver(gpu)
        drv.init()
        dirs = [drv.new_space() for _ in range(spaces)]
        start = drv.alloc(0)
        owners = dirs[:1] if shared else dirs
        for space in owners:
            if page == "4k":
                drv.map(space, va, phys, nbytes // regs.SMALL_PAGE, target=regs.TARGET_SYSRAM)
            else:
                _map_large(drv, space, va, phys, nbytes // regs.LARGE_PAGE)
        allocated = drv.alloc(0) - start
        first_pde = va >> regs.PDE_SPAN_SHIFT
        for space in dirs[1:] if shared else []:
            for i in range(first_pde, first_pde + expect.pdes // spaces):
                value = drv.vram_rd32(dirs[0].pd + i * regs.PDE_SIZE) | \
                    drv.vram_rd32(dirs[0].pd + i * regs.PDE_SIZE + 4) << 32
                drv.vram_wr64(space.pd + i * regs.PDE_SIZE, value)
        # read everything back from VRAM, not from the driver's bookkeeping
        u64 = gpu.vram.u64
        tables: set[tuple[int, int]] = set()
        pdes = 0
        for space in dirs:
            directory = u64[space.pd >> 3:(space.pd >> 3) + regs.PDE_COUNT]
            for raw in directory[directory != 0].tolist():
                pdes += 1
                small, large = layout.pde_tables(raw)
                if small is not None:
                    tables.add((small[0], regs.SMALL_PTES_PER_PT))
                if large is not None:
                    tables.add((large[0], regs.LARGE_PTES_PER_PT))
        ptes = sum(int(np.count_nonzero(u64[a >> 3:(a >> 3) + n])) for a, n in tables)
        want = np.uint64(phys) + np.arange(nbytes // regs.SMALL_PAGE, dtype=np.uint64) * \
            np.uint64(regs.SMALL_PAGE)
        translated = 0
        for space in dirs:
            pages = gpu.mmu.translate(Space(space.pd), va, nbytes, write=False)
            good = (pages.frames == want) & (pages.targets == regs.TARGET_SYSRAM)
            translated += int(np.count_nonzero(good))
        return Built(allocated, ptes, pdes, len(tables), translated)
    finally:
        gpu.release_memory()


def _map_large(drv, space, va: int, phys: int, npages: int) -> None:
    """Large-page mapping with the host driver's own VRAM writes and allocator.

    The host driver maps only 4 KiB pages; this fills the large half of each directory
    entry the same way (whole 1024-entry table, size field 0)."""
    tables: dict[int, int] = {}
    for i in range(npages):
        page_va = va + i * regs.LARGE_PAGE
        pde = page_va >> regs.PDE_SPAN_SHIFT
        table = tables.get(pde)
        if table is None:
            table = tables[pde] = drv.alloc(regs.LARGE_PTES_PER_PT * regs.PTE_SIZE)
            drv.vram_wr64(space.pd + pde * regs.PDE_SIZE, layout.pde_large(table))
        index = (page_va & (regs.PDE_SPAN - 1)) >> regs.LARGE_PAGE_SHIFT
        drv.vram_wr64(table + index * regs.PTE_SIZE,
                      layout.pte(phys + i * regs.LARGE_PAGE, regs.TARGET_SYSRAM))
