"""Every bit layout the emulated Fermi keeps in memory or in an address register, encoded
and decoded here and nowhere else.

Why one module: the device walks page tables, the shadow layer translates them, the
mediator reads guest instance blocks and BAR VM registers, the benches and tests build
them -- when each spelled the PTE or PDE out for itself, a field read one way in one place
and another way elsewhere was a bug waiting (a PDE half "present" when its target's low
bit is set is not the same test as "its target names memory").  Register NUMBERS and the
field constants stay in gpuvm/device/regs.py (the C guest driver is generated from it);
this module is the only Python that shifts and masks those fields.  A test in the suite
(tests/test_layout.py) greps the tree for layout arithmetic anywhere else.

Scalar functions serve single entries (a BAR access, one PDE); the `*s` forms take and
return numpy uint64 arrays for the shadow scans and the walker, which touch thousands of
entries at once.  Encoders are exact inverses of the decoders for page-aligned addresses
below 1 TiB; they do not mask their inputs (a caller that passes garbage gets the same
garbage the formula gives, as the driver code they were written after would).
"""

from __future__ import annotations

import numpy as np

from gpuvm.device import regs

_PAGE_SHIFT = regs.SMALL_PAGE_SHIFT  # table and instance addresses are stored >> 12
_ADDR_HI_MASK = 0xFF  # the high word of a 40-bit address pointer: bits 32-39
_LO_MASK = 0xFFFFFFFF
_TARGET_FIELD = 0x3  # a 2-bit memory target (regs.TARGET_*) in an address register

# --------------------------------------------------------------------------------------
# 40-bit addresses split over two 32-bit words (method data, RAMFC)
# --------------------------------------------------------------------------------------


def addr40(hi: int, lo: int) -> int:
    """A 40-bit address from its high word (bits 0-7 used) and its low word."""
    return ((hi & _ADDR_HI_MASK) << 32) | lo


def with_addr40_hi(addr: int, hi: int) -> int:
    """`addr` with bits 32-39 replaced by a new high word's bits 0-7."""
    return addr40(hi, addr & _LO_MASK)


def with_addr40_lo(addr: int, lo: int) -> int:
    """`addr` with bits 0-31 replaced by a new low word."""
    return (addr & ~_LO_MASK) | lo


# --------------------------------------------------------------------------------------
# PTE (64-bit): bit 0 present, 1 supervisor, 2 read-only, bits 4-31 address >> 12,
# bit 32 volatile, bits 33-34 target, bits 36-43 kind
# --------------------------------------------------------------------------------------
_PTE_ADDR_FIELD = regs.PTE_ADDR_FIELD_MASK << regs.PTE_ADDR_SHIFT
_PTE_PHYS_SHIFT = _PAGE_SHIFT - regs.PTE_ADDR_SHIFT  # PTE = phys >> 8 | flags (nouveau)


def pte(phys: int, target: int = regs.TARGET_VRAM, read_only: bool = False,
        supervisor: bool = False) -> int:
    """A present PTE for the page at `phys` in `target` memory."""
    return (phys >> _PTE_PHYS_SHIFT) | regs.PTE_PRESENT | (target << regs.PTE_TARGET_SHIFT) | \
        (regs.PTE_READ_ONLY if read_only else 0) | (regs.PTE_SUPERVISOR if supervisor else 0)


def pte_addr(raw: int) -> int:
    """The page address a PTE names."""
    return ((raw >> regs.PTE_ADDR_SHIFT) & regs.PTE_ADDR_FIELD_MASK) << _PAGE_SHIFT


def pte_target(raw: int) -> int:
    """The memory (regs.TARGET_*) a PTE's page is in."""
    return (raw >> regs.PTE_TARGET_SHIFT) & regs.PTE_TARGET_MASK


_U_PHYS_SHIFT = np.uint64(_PTE_PHYS_SHIFT)
_U_PRESENT = np.uint64(regs.PTE_PRESENT)
_U_ADDR_FIELD = np.uint64(_PTE_ADDR_FIELD)
_U_ADDR_SHIFT = np.uint64(regs.PTE_ADDR_SHIFT)
_U_PAGE_SHIFT = np.uint64(_PAGE_SHIFT)
_U_TARGET_SHIFT = np.uint64(regs.PTE_TARGET_SHIFT)
_U_TARGET_MASK = np.uint64(regs.PTE_TARGET_MASK)


def ptes(phys: np.ndarray, target: int = regs.TARGET_VRAM) -> np.ndarray:
    """Present PTEs (uint64) for the pages at the addresses in `phys`."""
    flags = regs.PTE_PRESENT | (target << regs.PTE_TARGET_SHIFT)
    return (phys.astype(np.uint64, copy=False) >> _U_PHYS_SHIFT) | np.uint64(flags)


def ptes_present(entries: np.ndarray) -> np.ndarray:
    """Which PTEs are present (bool)."""
    return (entries & _U_PRESENT) != 0


def ptes_addr(entries: np.ndarray) -> np.ndarray:
    """The page addresses PTEs name (uint64)."""
    return ((entries & _U_ADDR_FIELD) >> _U_ADDR_SHIFT) << _U_PAGE_SHIFT


def ptes_target(entries: np.ndarray) -> np.ndarray:
    """The memory (regs.TARGET_*) PTEs' pages are in (uint64)."""
    return (entries >> _U_TARGET_SHIFT) & _U_TARGET_MASK


def ptes_with_addr(entries: np.ndarray, phys: np.ndarray) -> np.ndarray:
    """PTEs keeping every field but the address, which becomes `phys` (the shadow layer's
    translation: a guest entry pointed at host memory)."""
    return (entries & ~_U_ADDR_FIELD) | ((phys >> _U_PAGE_SHIFT) << _U_ADDR_SHIFT)


# --------------------------------------------------------------------------------------
# PDE (64-bit), two halves (nouveau gf100_vmm_pgd_pde): large PT -- bits 0-1 target,
# 2-3 size, 4-31 address >> 12, bit 35 volatile; small PT -- bits 32-33 target,
# bit 34 volatile, 36-63 address >> 12
# --------------------------------------------------------------------------------------
_PDE_SIZE_FIELD = regs.PDE_SIZE_MASK << regs.PDE_SIZE_SHIFT

# PDE target (2 bits per half) -> the memory the table lives in; absent is missing
PDE_TABLE_TARGET = {regs.PDE_TARGET_VRAM: regs.TARGET_VRAM,
                    regs.PDE_TARGET_SYSRAM: regs.TARGET_SYSRAM,
                    regs.PDE_TARGET_SYSRAM_NOSNOOP: regs.TARGET_SYSRAM_NOSNOOP}


def pde_small(table: int, target: int = regs.PDE_TARGET_VRAM, volatile: bool = False) -> int:
    """The small-PT half of a PDE naming the table at `table` (OR it with a large half)."""
    return (target << regs.PDE_SMALL_TARGET_SHIFT) | \
        ((table >> _PAGE_SHIFT) << regs.PDE_SMALL_ADDR_SHIFT) | \
        (regs.PDE_SMALL_VOLATILE if volatile else 0)


def pde_large(table: int, target: int = regs.PDE_TARGET_VRAM, size: int = 0,
              volatile: bool = False) -> int:
    """The large-PT half of a PDE; `size` is the PT size field (0 full, 1 1/2, 2 1/4,
    3 1/8)."""
    return (target << regs.PDE_LARGE_TARGET_SHIFT) | (size << regs.PDE_SIZE_SHIFT) | \
        ((table >> _PAGE_SHIFT) << regs.PDE_LARGE_ADDR_SHIFT) | \
        (regs.PDE_LARGE_VOLATILE if volatile else 0)


def pde_tables(raw: int) -> tuple[tuple[int, int] | None, tuple[int, int, int] | None]:
    """(small PT (address, target), large PT (address, target, size field)) of a PDE; a
    half whose target is absent is None.  Targets are regs.TARGET_* (memory kinds)."""
    small = large = None
    st = PDE_TABLE_TARGET.get((raw >> regs.PDE_SMALL_TARGET_SHIFT) & regs.PDE_TARGET_MASK)
    if st is not None:
        small = (((raw >> regs.PDE_SMALL_ADDR_SHIFT) & regs.PDE_ADDR_FIELD_MASK) << _PAGE_SHIFT,
                 st)
    lt = PDE_TABLE_TARGET.get((raw >> regs.PDE_LARGE_TARGET_SHIFT) & regs.PDE_TARGET_MASK)
    if lt is not None:
        large = (((raw >> regs.PDE_LARGE_ADDR_SHIFT) & regs.PDE_ADDR_FIELD_MASK) << _PAGE_SHIFT,
                 lt, (raw >> regs.PDE_SIZE_SHIFT) & regs.PDE_SIZE_MASK)
    return small, large


def pde_size_bits(raw: int) -> int:
    """A PDE's large-PT size field, left in place (what a shadow PDE keeps of the guest's)."""
    return raw & _PDE_SIZE_FIELD


# --------------------------------------------------------------------------------------
# RAMIN (channel and BAR VM instance blocks): address pointers (USERD, page directory,
# PGRAPH context) are a word pair -- lo: target bits 0-1, address bits 12-31; hi: address
# bits 32-39 -- the VM limit a plain 40-bit pair, GPFIFO log2(entries) << 16 | VA 32-39
# --------------------------------------------------------------------------------------
_RAMIN_FLAGS = _LO_MASK & ~regs.RAMIN_ADDR_MASK  # bits 0-11 beside the address


def ramin_ptr(lo: int, hi: int) -> int:
    """The address a RAMIN pointer word pair names."""
    return (lo & regs.RAMIN_ADDR_MASK) | ((hi & _ADDR_HI_MASK) << 32)


def ramin_ptr_target(lo: int) -> int:
    """The memory (regs.TARGET_*) a RAMIN pointer's low word names."""
    return lo & regs.RAMIN_ADDR_TARGET_MASK


def ramin_ptr_flags(lo: int) -> int:
    """The bits of a RAMIN pointer's low word beside the address (target and the rest)."""
    return lo & _RAMIN_FLAGS


def ramin_ptr_lo(addr: int, flags: int = regs.TARGET_VRAM) -> int:
    """The low word of a RAMIN pointer to `addr`; `flags` fills bits 0-11 (the target)."""
    return (addr & regs.RAMIN_ADDR_MASK) | flags


def ramin_ptr_words(addr: int, flags: int = regs.TARGET_VRAM) -> tuple[int, int]:
    """(lo, hi) words of a RAMIN pointer to `addr`."""
    return ramin_ptr_lo(addr, flags), addr >> 32


def ramin_limit(lo: int, hi: int) -> int:
    """The VM limit (last valid byte) a RAMIN limit word pair holds."""
    return lo | ((hi & _ADDR_HI_MASK) << 32)


def ramin_limit_words(limit: int) -> tuple[int, int]:
    return limit & _LO_MASK, limit >> 32


def ramin_gpfifo(lo: int, hi: int) -> tuple[int, int]:
    """(GPFIFO VA, log2 of its entries) of the RAMIN GPFIFO word pair."""
    return addr40(hi, lo), (hi >> regs.RAMIN_GPFIFO_LOG2_SHIFT) & regs.RAMIN_GPFIFO_LOG2_MASK


def ramin_gpfifo_words(va: int, log2: int) -> tuple[int, int]:
    return va & _LO_MASK, (log2 << regs.RAMIN_GPFIFO_LOG2_SHIFT) | (va >> 32)


# --------------------------------------------------------------------------------------
# Address registers that hold an instance/table address >> 12: the channel table word,
# the BAR1/BAR3 VM registers, the runlist address, the USERD poll area, PCOPY's channel
# registers, the fault record's instance word; and the TLB flush's PD register (>> 8)
# --------------------------------------------------------------------------------------


def chan_word(inst: int, target: int = regs.TARGET_VRAM) -> int:
    """The PFIFO channel table word binding a channel to its instance block."""
    return regs.PFIFO_CHAN_VALID | (target << regs.PFIFO_CHAN_TARGET_SHIFT) | (inst >> _PAGE_SHIFT)


def chan_valid(word: int) -> bool:
    return bool(word & regs.PFIFO_CHAN_VALID)


def chan_inst(word: int) -> int:
    return (word & regs.PFIFO_CHAN_INST_MASK) << _PAGE_SHIFT


def chan_target(word: int) -> int:
    return (word >> regs.PFIFO_CHAN_TARGET_SHIFT) & _TARGET_FIELD


def barvm_word(inst: int, target: int = regs.TARGET_VRAM) -> int:
    """A PBUS_BAR1_VM / PBUS_BAR3_VM value: through the VM whose instance block is `inst`."""
    return regs.PBUS_BARVM_ENABLE | (target << regs.PBUS_BARVM_TARGET_SHIFT) | \
        (inst >> _PAGE_SHIFT)


def barvm_enabled(reg: int) -> bool:
    """MODE: through the BAR VM (else plain VRAM access)."""
    return bool(reg & regs.PBUS_BARVM_ENABLE)


def barvm_inst(reg: int) -> int:
    return (reg & regs.PBUS_BARVM_INST_MASK) << _PAGE_SHIFT


def barvm_target(reg: int) -> int:
    return (reg >> regs.PBUS_BARVM_TARGET_SHIFT) & regs.PBUS_BARVM_TARGET_MASK


def runlist_word(addr: int, target: int = regs.TARGET_VRAM) -> int:
    """A PFIFO_RUNLIST_ADDR value naming the runlist at `addr`."""
    return (addr >> _PAGE_SHIFT) | (target << regs.PFIFO_RUNLIST_TARGET_SHIFT)


def runlist_addr(reg: int) -> int:
    return (reg & regs.PFIFO_RUNLIST_ADDR_MASK) << _PAGE_SHIFT


def runlist_target(reg: int) -> int:
    return (reg >> regs.PFIFO_RUNLIST_TARGET_SHIFT) & _TARGET_FIELD


def runlist_entries(chids: list[int]) -> np.ndarray:
    """A runlist's words (uint32): one 8-byte entry {chid, RUNLIST_ENTRY_WORD1} a channel."""
    words = np.empty(2 * len(chids), dtype=np.uint32)
    words[0::2] = chids
    words[1::2] = regs.RUNLIST_ENTRY_WORD1
    return words


def runlist_chids(words: np.ndarray) -> list[int]:
    """The channel ids a runlist's words (uint32) name, in order."""
    return words[0::2].tolist()


def userd_poll_word(base: int) -> int:
    """A PFIFO_USERD_POLL value: polling on, the area at BAR1-VM address `base`."""
    return regs.PFIFO_USERD_POLL_ENABLE | (base >> _PAGE_SHIFT)


def userd_poll_base(poll: int) -> int | None:
    """The BAR1-VM address of the USERD poll area a PFIFO_USERD_POLL value names, or None
    when polling is off."""
    if not poll & regs.PFIFO_USERD_POLL_ENABLE:
        return None
    return (poll & regs.PFIFO_USERD_POLL_ADDR_MASK) << _PAGE_SHIFT


def userd_poll_slot(poll: int, bar1_offset: int, channels: int) -> tuple[int, int] | None:
    """(channel, USERD register) a BAR1 offset addresses in the poll area of `channels`
    channels, or None when it is outside (or polling is off)."""
    base = userd_poll_base(poll)
    if base is None:
        return None
    rel = bar1_offset - base
    if 0 <= rel < channels * regs.USERD_STRIDE:
        return rel // regs.USERD_STRIDE, rel % regs.USERD_STRIDE
    return None


def pcopy_chan_word(inst: int) -> int:
    """PCOPY's current/next channel register naming the instance block at `inst`."""
    return (inst >> _PAGE_SHIFT) | regs.PCOPY_CHAN_VALID


def fault_inst_word(inst: int) -> int:
    """A VM fault record's instance word (PFIFO_FAULT_INST): the instance block >> 12."""
    return inst >> _PAGE_SHIFT


def flush_pd_word(pd: int, sysram: bool = False) -> int:
    """A PFFB_FLUSH_PD value naming the directory at `pd` (PD >> 8: bits 4-31 hold PD >> 12)."""
    return (pd >> regs.PFFB_FLUSH_PD_ADDR_SHIFT) | (regs.PFFB_FLUSH_PD_SYSRAM if sysram else 0)


def flush_pd_addr(reg: int) -> int:
    """The directory address a PFFB_FLUSH_PD value names (40 bits)."""
    return ((reg >> (_PAGE_SHIFT - regs.PFFB_FLUSH_PD_ADDR_SHIFT)) << _PAGE_SHIFT) & \
        (regs.VA_LIMIT - 1)


def flush_pd_sysram(reg: int) -> bool:
    return bool(reg & regs.PFFB_FLUSH_PD_SYSRAM)


# --------------------------------------------------------------------------------------
# GPFIFO entry (8 bytes): word0 pushbuffer VA bits 2-31; word1 bits 0-7 VA bits 32-39,
# bit 9 not-main, bits 10-30 length in 32-bit words
# --------------------------------------------------------------------------------------
_GPFIFO_VA_LO = _LO_MASK & ~3


def gpfifo_entry(va: int, words: int) -> tuple[int, int]:
    """(word0, word1) of a GPFIFO entry for `words` pushbuffer words at `va`."""
    return va & _GPFIFO_VA_LO, (va >> 32) | (words << regs.GPFIFO_LEN_SHIFT)


def gpfifo_entry_decode(word0: int, word1: int) -> tuple[int, int, bool]:
    """(pushbuffer VA, length in words, main pushbuffer) of a GPFIFO entry."""
    return (((word1 & regs.GPFIFO_VA_HI_MASK) << 32) | (word0 & _GPFIFO_VA_LO),
            (word1 >> regs.GPFIFO_LEN_SHIFT) & regs.GPFIFO_LEN_MASK,
            not word1 & regs.GPFIFO_NOT_MAIN)
