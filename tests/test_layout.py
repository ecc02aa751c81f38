"""gpuvm/device/layout.py: its encodings checked against values written down independently
(nouveau's and the reference's formulas, as literals), its decoders against its encoders,
its numpy forms against its scalar ones -- and a grep of the tree for layout arithmetic
anywhere else, so that a PTE, PDE or RAMIN field is again shifted and masked in one
module only (issue 76, "layouts once")."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from gpuvm.device import layout, regs

ROOT = Path(__file__).resolve().parent.parent
PT = 0x1234_5000  # a page-aligned table/page address below 4 GiB
HIGH = 0x73_1234_5000  # one using bits 32-39


# ------------------------------------------------------------------ reference vectors
def test_pte_is_phys_shifted_by_8_with_flags():
    """fermi-mmio.md: PTE = phys >> 8 | flags; target in bits 33-34."""
    assert layout.pte(PT) == 0x123450 | 1
    assert layout.pte(HIGH, regs.TARGET_SYSRAM, read_only=True, supervisor=True) == \
        0x7312_3450 | 1 | 2 | 4 | (2 << 33)
    assert layout.pte_addr(0x7312_3450 | 1 | (3 << 33) | (0xFE << 36)) == HIGH
    assert layout.pte_target(0x123451 | (3 << 33)) == regs.TARGET_SYSRAM_NOSNOOP


def test_pde_halves_as_nouveau_writes_them():
    """nouveau gf100_vmm_pgd_pde: each half is addr >> 8 | target, the small one in the
    high word; coherent sysram adds VOL (bit 34 small, 35 large)."""
    assert layout.pde_small(PT) == (PT << 24) | (1 << 32)
    assert layout.pde_small(PT, regs.PDE_TARGET_SYSRAM, volatile=True) == \
        (PT << 24) | (2 << 32) | (1 << 34)
    assert layout.pde_large(PT) == (PT >> 8) | 1
    assert layout.pde_large(PT, regs.PDE_TARGET_SYSRAM_NOSNOOP, size=2, volatile=True) == \
        (PT >> 8) | 3 | (2 << 2) | (1 << 35)


def test_pde_tables_reads_both_halves_and_their_targets():
    raw = layout.pde_small(HIGH, regs.PDE_TARGET_SYSRAM) | \
        layout.pde_large(PT, regs.PDE_TARGET_VRAM, size=3)
    assert layout.pde_tables(raw) == ((HIGH, regs.TARGET_SYSRAM), (PT, regs.TARGET_VRAM, 3))
    # a half whose target is 0 is absent, whatever its address says
    assert layout.pde_tables(layout.pde_small(PT, regs.PDE_TARGET_ABSENT)) == (None, None)
    # the non-coherent target (3) is a table too, not only "bit 0 set"
    assert layout.pde_tables(layout.pde_small(PT, regs.PDE_TARGET_SYSRAM_NOSNOOP))[0] == \
        (PT, regs.TARGET_SYSRAM_NOSNOOP)
    assert layout.pde_size_bits(raw) == 3 << 2


def test_ramin_words():
    """fermi-mmio.md: pointers are target in bits 0-1 and address bits 12-31 in the low
    word, bits 32-39 in the high word; GPFIFO hi is log2(entries) << 16 | VA bits 32-39."""
    assert layout.ramin_ptr_words(HIGH, regs.TARGET_SYSRAM_NOSNOOP) == (0x1234_5003, 0x73)
    assert layout.ramin_ptr(0x1234_5003, 0xFF73) == HIGH
    assert layout.ramin_ptr_target(0x1234_5003) == regs.TARGET_SYSRAM_NOSNOOP
    assert layout.ramin_ptr_flags(0x1234_5ABC) == 0xABC
    assert layout.ramin_limit_words((1 << 40) - 1) == (0xFFFF_FFFF, 0xFF)
    assert layout.ramin_limit(0xFFFF_FFFF, 0xFF) == (1 << 40) - 1
    assert layout.ramin_gpfifo_words(0x12_3456_7000, 9) == (0x3456_7000, (9 << 16) | 0x12)
    assert layout.ramin_gpfifo(0x3456_7000, (9 << 16) | 0x12) == (0x12_3456_7000, 9)


def test_address_registers():
    """The values nouveau writes: 0x1704 = 0x80000000 | inst >> 12, the channel table
    bit 31 | inst >> 12, USERD poll bit 28 | addr >> 12, flush PD = PD >> 8."""
    assert layout.barvm_word(PT) == 0x8001_2345
    assert (layout.barvm_enabled(0x8001_2345), layout.barvm_inst(0xC001_2345),
            layout.barvm_target(0xB001_2345)) == (True, PT, 3)
    assert not layout.barvm_enabled(0x0001_2345)
    assert layout.chan_word(PT, regs.TARGET_SYSRAM) == 0x8001_2345 | (2 << 28)
    assert (layout.chan_valid(0xA001_2345), layout.chan_inst(0xA001_2345),
            layout.chan_target(0xA001_2345)) == (True, PT, 2)
    assert layout.runlist_word(PT) == 0x12345
    assert layout.runlist_entries([5, 9]).tolist() == [5, 4, 9, 4]  # {chid, 0x00000004}
    assert layout.runlist_chids(np.array([5, 4, 9, 4], dtype=np.uint32)) == [5, 9]
    assert (layout.runlist_addr(0x3001_2345), layout.runlist_target(0x3001_2345)) == (PT, 3)
    assert layout.userd_poll_word(0x100000) == 0x1000_0100
    assert layout.userd_poll_base(0x0000_0100) is None
    assert layout.userd_poll_slot(0x1000_0100, 0x100000 + 3 * 0x1000 + 0x8C, 4) == (3, 0x8C)
    assert layout.userd_poll_slot(0x1000_0100, 0x100000 + 4 * 0x1000, 4) is None
    assert layout.pcopy_chan_word(PT) == 0x12345 | (1 << 30)
    assert layout.fault_inst_word(PT) == 0x12345
    assert layout.flush_pd_word(HIGH, sysram=True) == (HIGH >> 8) | 2
    assert layout.flush_pd_addr(HIGH >> 8) == HIGH
    assert layout.flush_pd_sysram(2) and not layout.flush_pd_sysram(0x10)


def test_gpfifo_entry_as_nouveau_writes_it():
    """nouveau: word0 = lower 32 bits of the VA, word1 = upper 8 | bytes << 8."""
    assert layout.gpfifo_entry(0x12_3456_7800, 16) == (0x3456_7800, 0x12 | (64 << 8))
    assert layout.gpfifo_entry_decode(0x3456_7803, 0x12 | (64 << 8) | (1 << 9)) == \
        (0x12_3456_7800, 16, False)
    assert layout.addr40(0x1FF, 0x1234) == 0xFF_0000_1234
    assert layout.with_addr40_hi(0xAB_0000_1234, 0x1CD) == 0xCD_0000_1234
    assert layout.with_addr40_lo(0xAB_0000_1234, 0x5678) == 0xAB_0000_5678


def test_numpy_forms_agree_with_scalar_ones():
    rng = np.random.default_rng(76)
    raw = rng.integers(0, 1 << 63, 4096, dtype=np.int64).astype(np.uint64) * np.uint64(2) + \
        rng.integers(0, 2, 4096).astype(np.uint64)
    assert layout.ptes_addr(raw).tolist() == [layout.pte_addr(int(r)) for r in raw]
    assert layout.ptes_target(raw).tolist() == [layout.pte_target(int(r)) for r in raw]
    assert layout.ptes_present(raw).tolist() == [bool(int(r) & 1) for r in raw]
    phys = rng.integers(0, 1 << 28, 4096).astype(np.uint64) << np.uint64(12)
    assert layout.ptes(phys, regs.TARGET_SYSRAM).tolist() == \
        [layout.pte(int(p), regs.TARGET_SYSRAM) for p in phys]
    moved = layout.ptes_with_addr(raw, phys)
    assert layout.ptes_addr(moved).tolist() == phys.tolist()
    keep = ~np.uint64(((1 << 28) - 1) << 4)
    assert ((moved & keep) == (raw & keep)).all()


# ------------------------------------------------------------------ the grep
# Field constants only the layout module may shift and mask with (named single-bit
# flags such as regs.PTE_PRESENT may be tested anywhere; VA-index shifts like
# PDE_SPAN_SHIFT are not entry layouts).
_FIELDS = (
    r"PTE_ADDR_SHIFT|PTE_ADDR_FIELD_MASK|PTE_TARGET_SHIFT|PTE_TARGET_MASK|PTE_KIND_SHIFT"
    r"|PDE_(?:SMALL|LARGE)_(?:ADDR|TARGET)_SHIFT|PDE_(?:ADDR_FIELD|TARGET|SIZE)_MASK"
    r"|PDE_SIZE_SHIFT|PDE_(?:SMALL|LARGE)_PRESENT"
    r"|RAMIN_ADDR_MASK|RAMIN_ADDR_TARGET_MASK|RAMIN_GPFIFO_LOG2_(?:SHIFT|MASK)"
    r"|PFIFO_CHAN_INST_MASK|PFIFO_CHAN_TARGET_SHIFT"
    r"|PBUS_BARVM_INST_MASK|PBUS_BARVM_TARGET_(?:SHIFT|MASK)"
    r"|PFIFO_USERD_POLL_ADDR_MASK|PFIFO_RUNLIST_ADDR_MASK|PFIFO_RUNLIST_TARGET_SHIFT"
    r"|PFFB_FLUSH_PD_ADDR_SHIFT|GPFIFO_LEN_SHIFT|GPFIFO_LEN_MASK|GPFIFO_VA_HI_MASK")
PATTERNS = {
    "a layout field constant": re.compile(rf"\b(?:{_FIELDS})\b"),
    "a PTE built as phys >> 8 | flags": re.compile(r">>\s*(?:np\.uint64\()?8\b\)*\s*\|"),
    "an address re-encoded into a field ((x >> 12) << ...)": re.compile(r">>\s*12\)\s*<<"),
    "an instance/table frame OR'ed into a word": re.compile(
        r"\|\s*\(?[\w.]+\s*>>\s*(?:np\.uint64\()?12\b|>>\s*12\)?\s*\|"),
    "a small-PT address decoded (>> 36)": re.compile(r">>\s*(?:np\.uint64\()?36\b"),
    "a small-PT address encoded (addr << 24)": re.compile(r"\b[a-z_]\w*\s*<<\s*24\b"),
    "an instance block's frame (inst >> 12)": re.compile(r"inst\w*\)?\s*>>\s*12\b"),
    "a field decoded as (x >> 4) << 12": re.compile(r">>\s*4\)?\s*<<\s*12\b"),
    "the high word of a 40-bit pointer (& 0xFF) << 32": re.compile(r"0xFF\)\s*<<\s*32"),
    "a RAMIN pointer's address mask": re.compile(r"0xFFFFF000\)?\s*\|"),
    "a memory target OR'ed into a pointer word": re.compile(r"\|\s*regs\.TARGET_\w+"),
    "a runlist entry's words": re.compile(r"\bRUNLIST_ENTRY_WORD1\b|\[[01]::2\]"),
}
EXEMPT = {
    "gpuvm/device/layout.py": "the layout module",
    "gpuvm/device/regs.py": "the register map and field constants the layout module uses",
    "gpuvm/calibrate/mmu_v2.py": "another GPU's MMU format (the footprint study's), in its "
                                 "own one module",
    "tests/test_layout.py": "the independent vectors and these patterns",
}
# A replay transcribes a driver's own code (nvkm, nouveau, Gdev) as written, arithmetic
# included: that independence from this project's encoders is what it tests.
EXEMPT_GLOBS = ("tests/test_replay_*.py",)


def _checked_files() -> list[Path]:
    out = []
    for top in ("gpuvm", "shadow", "tests"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel in EXEMPT or any(Path(rel).match(g) for g in EXEMPT_GLOBS):
                continue
            out.append(path)
    return out


def layout_arithmetic(text: str) -> list[tuple[int, str, str]]:
    """(line, what, source line) of every layout-arithmetic match in Python source."""
    hits = []
    for n, line in enumerate(text.splitlines(), 1):
        code = line.split("#", 1)[0]
        for what, pattern in PATTERNS.items():
            if pattern.search(code):
                hits.append((n, what, line.strip()))
    return hits


def test_no_layout_arithmetic_outside_the_layout_module():
    found = [f"{path.relative_to(ROOT)}:{n}: {what}: {line}"
             for path in _checked_files()
             for n, what, line in layout_arithmetic(path.read_text())]
    assert not found, "layout arithmetic outside gpuvm/device/layout.py:\n" + "\n".join(found)


@pytest.mark.parametrize("line", [
    "return (phys >> 8) | regs.PTE_PRESENT",
    "entries = (frames >> np.uint64(8)) | np.uint64(1)",
    "v = regs.PDE_SMALL_PRESENT | ((pt >> 12) << regs.PDE_SMALL_ADDR_SHIFT)",
    "drv.wr(regs.PBUS_BAR3_VM, regs.PBUS_BARVM_ENABLE | (inst >> 12))",
    "return (inst >> 12) | regs.PCOPY_CHAN_VALID",
    "pt = (int(raw) >> 36) << 12",
    "pd = (flush_pd >> 4) << 12",
    "pd = (lo & 0xFFFFF000) | ((hi & 0xFF) << 32)",
    "drv.vram_wr32(inst + regs.RAMIN_PD_LO, pd | regs.TARGET_VRAM)",
    "target = (value >> regs.PFIFO_CHAN_TARGET_SHIFT) & 0x3",
    "pde = (target << 32) | (pt_addr << 24)",
    "inst = (ch.guest_inst >> 12) if ch and ch.guest_inst else 0",
])
def test_the_grep_catches_what_the_tree_had(line):
    """Each pattern catches the kind of site the tree had before the layout module (so
    the check above can fail)."""
    assert layout_arithmetic(line)


@pytest.mark.parametrize("line", [
    "first, last = va >> 12, end >> 12",
    "if ptes & regs.PTE_PRESENT:",
    "index = va >> regs.PDE_SPAN_SHIFT",
    "fmt = (3 << 0) | (6 << 12) | (3 << 24)",
    "is_sys = (target == np.uint64(regs.TARGET_SYSRAM)) | \\",
])
def test_the_grep_leaves_other_arithmetic_alone(line):
    assert not layout_arithmetic(line)
