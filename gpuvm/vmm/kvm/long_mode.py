"""Long mode at CPL3, set up entirely by the host (no boot code in the guest).

Why CPL3: the KVM here is KVM-PVM, which runs CPL0 guest code through the instruction
emulator (~1 µs per instruction, no SSE) but runs CPL3 code natively.  CPL3 works on a
VMX host too, so one recipe serves both.  The guest never reloads segments and takes no
exception, so no GDT, IDT or TSS is needed; an exception triple-faults into
KVM_EXIT_SHUTDOWN with RIP at the faulting instruction, which is what we report.
"""

from __future__ import annotations

import numpy as np

from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.kvm import kvm_api as api

PAGE = 0x1000
PTE_PRESENT = 1 << 0
PTE_WRITE = 1 << 1
PTE_USER = 1 << 2  # CPL3 may use the mapping
PTE_PS = 1 << 7  # 2 MiB page in a page directory
HUGE = 2 << 20

CR0_PE, CR0_MP, CR0_ET, CR0_NE, CR0_WP, CR0_AM, CR0_PG = (
    1 << 0, 1 << 1, 1 << 4, 1 << 5, 1 << 16, 1 << 18, 1 << 31)
CR4_PAE, CR4_OSFXSR, CR4_OSXMMEXCPT = 1 << 5, 1 << 9, 1 << 10
EFER_LME, EFER_LMA = 1 << 8, 1 << 10
RFLAGS_RESERVED = 1 << 1
RFLAGS_IOPL3 = 3 << 12  # `in`/`out` at CPL3 without an I/O bitmap

CR0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_AM | CR0_PG
CR4 = CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT  # SSE needs OSFXSR (gcc -O2 emits SSE)
EFER = EFER_LME | EFER_LMA
assert CR0 == 0x80050033 and EFER == 0x500

PML4 = abi.GUEST_PAGE_TABLES
PDPT = PML4 + PAGE
PD0 = PDPT + PAGE
N_PD = abi.GUEST_IDENTITY_MAP_TOP // (512 * HUGE)  # one PD maps 1 GiB
TABLES_END = PD0 + N_PD * PAGE
assert TABLES_END <= abi.GUEST_BOOT_PARAMS, "page tables overlap the boot parameters"


def write_identity_page_tables(ram: GuestRam) -> int:
    """Identity-map 0..GUEST_IDENTITY_MAP_TOP with user-accessible 2 MiB pages; returns
    CR3.  The map covers the BAR windows too: a BAR access reaches a guest-physical
    address with no memslot (or a BAR memslot) and so exits as MMIO (or doesn't)."""
    if ram.size < TABLES_END:
        raise ValueError(f"guest RAM of {ram.size:#x} bytes cannot hold the page tables")
    flags = PTE_PRESENT | PTE_WRITE | PTE_USER
    tables = ram.array[PML4:TABLES_END].view(np.uint64)
    tables[:] = 0
    tables[0] = PDPT | flags  # PML4[0]
    pdpt = tables[512:1024]
    pdpt[:N_PD] = PD0 + PAGE * np.arange(N_PD, dtype=np.uint64) | flags
    pds = tables[1024:1024 + 512 * N_PD]
    pds[:] = (np.arange(512 * N_PD, dtype=np.uint64) * HUGE) | (flags | PTE_PS)
    return PML4


def _flat_segment(seg: api.KvmSegment, selector: int, seg_type: int, code: bool,
                  cpl: int) -> None:
    seg.base = 0
    seg.limit = 0xFFFFFFFF
    seg.selector = selector | cpl
    seg.type = seg_type
    seg.present = 1
    seg.dpl = cpl
    seg.s = 1
    seg.l = 1 if code else 0
    seg.db = 0 if code else 1
    seg.g = 1
    seg.avl = 0
    seg.unusable = 0


def configure_sregs(sregs: api.KvmSregs, cr3: int, cpl: int = 3) -> None:
    """Turn KVM's reset-state sregs into 64-bit flat segments at `cpl` (in place).  TR and
    LDT keep KVM's defaults (KVM_SET_SREGS accepts them)."""
    sregs.cr0 = CR0
    sregs.cr3 = cr3
    sregs.cr4 = CR4
    sregs.efer = EFER
    _flat_segment(sregs.cs, 0x8, 11, True, cpl)  # execute/read, accessed
    for name in ("ds", "es", "fs", "gs", "ss"):
        _flat_segment(getattr(sregs, name), 0x10, 3, False, cpl)  # read/write, accessed


def entry_regs(rip: int, rsp: int, rdi: int) -> api.KvmRegs:
    """Registers for a C function entry: rsp % 16 == 8 as after a `call`."""
    if rsp % 16 != 8:
        raise ValueError(f"entry rsp {rsp:#x} is not 8 mod 16")
    regs = api.KvmRegs()
    regs.rip = rip
    regs.rsp = rsp
    regs.rdi = rdi
    regs.rflags = RFLAGS_RESERVED | RFLAGS_IOPL3
    return regs
