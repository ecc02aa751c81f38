"""GPU page-table VRAM for pinned sysram: the arithmetic, and the same tables built for real.

The layout facts come from regs.py (a PDE covers 128 MiB; a small-page table holds 32768
entries, a large-page one 1024); the literal numbers below are those facts worked out for
1 GiB, so a change of layout shows up here.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from gpuvm import cli
from gpuvm.calibrate import mmu_v2
from gpuvm.calibrate.footprint import build_and_count, footprint, footprint_table
from gpuvm.device import regs

GiB, MiB, KiB = 1 << 30, 1 << 20, 1 << 10


def test_layout_facts_the_numbers_below_rest_on():
    assert regs.PDE_SPAN == 128 * MiB
    assert regs.SMALL_PTES_PER_PT == 32768 and regs.LARGE_PTES_PER_PT == 1024
    assert regs.PTE_SIZE == regs.PDE_SIZE == 8


@pytest.mark.parametrize("page, spaces, shared, ptes, pdes, pts, pt_bytes", [
    # 1 GiB in 4 KiB pages: 262,144 PTEs (2 MiB) in 8 full tables of 32768
    ("4k", 1, False, 262_144, 8, 8, 2 * MiB),
    ("4k", 8, False, 2_097_152, 64, 64, 16 * MiB),
    ("4k", 8, True, 262_144, 64, 8, 2 * MiB),
    # 1 GiB in 128 KiB pages: 8,192 PTEs (64 KiB) in 8 full tables of 1024
    ("128k", 1, False, 8_192, 8, 8, 64 * KiB),
    ("128k", 8, False, 65_536, 64, 64, 512 * KiB),
    ("128k", 8, True, 8_192, 64, 8, 64 * KiB),
])
def test_one_gib_exact_counts(page, spaces, shared, ptes, pdes, pts, pt_bytes):
    f = footprint(GiB, page, spaces, shared)
    assert (f.ptes, f.pdes, f.pts, f.pt_bytes) == (ptes, pdes, pts, pt_bytes)
    assert f.pte_bytes == ptes * 8 and f.entry_bytes == (ptes + pdes) * 8


def test_sharing_removes_all_but_the_directory_entries():
    own, shared = footprint(GiB, "4k", 8), footprint(GiB, "4k", 8, shared=True)
    one = footprint(GiB, "4k", 1)
    assert own.entry_bytes - shared.entry_bytes == 7 * one.pte_bytes
    assert shared.pdes == own.pdes  # every space still points at the tables


def test_small_and_unaligned_mappings_pay_whole_tables():
    one_page = footprint(4 * KiB, "4k")
    assert (one_page.ptes, one_page.pts, one_page.pt_bytes) == (1, 1, 256 * KiB)
    # 1 GiB starting 64 MiB into a PDE's span touches 9 PDEs, not 8
    straddling = footprint(GiB, "4k", va=4 * GiB + 64 * MiB)
    assert (straddling.pdes, straddling.pts, straddling.ptes) == (9, 9, 262_144)


@pytest.mark.parametrize("args, message", [
    ((GiB, "2m"), "not one of 4k, 128k"),
    ((GiB + 4096, "128k"), "not a positive multiple of the 128k page"),
    ((0, "4k"), "not a positive multiple"),
    ((GiB, "4k", 0), "at least one"),
])
def test_bad_requests_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        footprint(*args)


def test_table_rows_for_one_and_eight_vms():
    rows = footprint_table(GiB, [1, 8])
    assert [(r.page, r.spaces, r.shared) for r in rows] == [
        ("4k", 1, False), ("4k", 8, False), ("4k", 8, True),
        ("128k", 1, False), ("128k", 8, False), ("128k", 8, True)]


# ------------------------------------------------------------------ built for real
def assert_built_matches(nbytes, page, spaces, shared, va=4 * GiB):
    want = footprint(nbytes, page, spaces, shared, va)
    got = build_and_count(nbytes, page, spaces, shared, va=va)
    assert (got.allocated_bytes, got.ptes, got.pdes, got.pts) == \
        (want.pt_bytes, want.ptes, want.pdes, want.pts)
    assert got.pages_translated == spaces * nbytes // regs.SMALL_PAGE


@pytest.mark.parametrize("page, spaces, shared", [
    ("4k", 1, False), ("4k", 8, True), ("128k", 1, False), ("128k", 8, False),
    ("128k", 8, True)])
def test_one_gib_built_in_emulated_vram_matches(page, spaces, shared):
    assert_built_matches(GiB, page, spaces, shared)


def test_eight_vms_with_own_small_tables_built_match():
    assert_built_matches(256 * MiB, "4k", 8, False)


@settings(max_examples=15, deadline=None)
@given(page=st.sampled_from(["4k", "128k"]), pages=st.integers(1, 300),
       first_pde=st.integers(1, 30), start_page=st.integers(0, 2000),
       spaces=st.integers(1, 3), shared=st.booleans())
def test_any_mapping_built_matches_the_arithmetic(page, pages, first_pde, start_page, spaces,
                                                  shared):
    size = regs.SMALL_PAGE if page == "4k" else regs.LARGE_PAGE
    span_pages = regs.PDE_SPAN // size
    va = first_pde * regs.PDE_SPAN + (start_page % span_pages) * size
    assert_built_matches(pages * size, page, spaces, shared, va=va)


# ------------------------------------------------------------------ the command
def test_command_json_reports_the_rows(capsys):
    rc = cli.main(["calibrate", "--pt-footprint", "--json", "--no-cross-check"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and len(rows) == 6
    assert rows[0]["ptes"] == 262_144 and rows[0]["pte_bytes"] == 2 * MiB
    assert not any(r["cross_checked"] for r in rows)


def test_command_table_with_cross_check(capsys):
    rc = cli.main(["calibrate", "--pt-footprint", "--map-size", "128M", "--vms", "1,2"])
    out = capsys.readouterr().out
    assert rc == 0 and "32,768" in out and "not built" not in out


@pytest.mark.parametrize("argv, culprit", [
    (["--vms", "0"], "bad VM counts '0'"), (["--vms", "x"], "bad VM counts 'x'"),
    (["--map-size", "6K"], "not a positive multiple")])
def test_command_bad_input_is_one_line(capsys, argv, culprit):
    rc = cli.main(["calibrate", "--pt-footprint", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and culprit in err


# ------------------------------------------------------------------ version-2 format
@pytest.mark.parametrize("page, spaces, shared", [
    ("2m", 1, False), ("2m", 3, False), ("2m", 3, True), ("64k", 2, False),
    ("64k", 2, True), ("4k", 1, False), ("4k", 3, True)])
def test_v2_tables_built_and_read_back_match_the_counts(page, spaces, shared):
    """1 GiB + 6 MiB (crossing PD0 tables' 512 MiB and a partial last one), built in
    emulated VRAM and walked back from each root; every page translates."""
    nbytes = GiB + 6 * MiB
    f = mmu_v2.footprint(nbytes, page, spaces, shared, 1 << 38)
    b = mmu_v2.build(nbytes, page, spaces, shared, sample=512)
    assert mmu_v2.agrees(f, b), (f, b)
    assert b.pages_checked >= 512 * spaces
    assert b.vram_used <= mmu_v2.vram_needed(f)


def test_v2_one_tib_at_2m_vs_the_seeds_arithmetic():
    """The seed: 4 MB per TB at 2 MiB pages (8 B a page), 2 GiB at 4 KiB.  The format puts
    a 2 MiB page in a 16-byte PD0 slot: 8 MiB of PD0 plus the directories."""
    f = mmu_v2.footprint(1 << 40, "2m", 1, False, 1 << 38)
    assert f.entries["pte"] * mmu_v2.SEED_PTE_BYTES == 4 * MiB
    assert f.tables == {"pd3": 1, "pd2": 1, "pd1": 4, "pd0": 2048}
    assert f.table_bytes == 32 + 4096 * (1 + 4 + 2048)
    four = mmu_v2.footprint(1 << 40, "4k", 1, False, 1 << 38)
    assert four.pte_bytes == 2 * GiB and four.table_bytes == 2 * GiB + f.table_bytes
    shared = mmu_v2.footprint(1 << 40, "2m", 8, True, 1 << 38)
    assert shared.table_bytes == f.table_bytes + 7 * (32 + 4096)  # a PD3 and a PD2 each
    assert mmu_v2.agrees(f, mmu_v2.build(1 << 40, "2m"))


def test_v2_reading_back_sees_a_corrupted_entry():
    """The read-back walks VRAM, not the builder's bookkeeping: a zeroed page entry is
    one page fewer and fails to translate."""
    vram = mmu_v2.Vram(64 * 4096)
    try:
        b = mmu_v2.Builder(vram)
        root = b.space()
        b.map(root, 1 << 38, 1 << 40, 4 * MiB, "4k")
        good = mmu_v2.read_back(vram, [root], b.next, 1 << 38, 1 << 40, 4 * MiB, "4k")
        assert good.entries["pte"] == 1024 and good.pages_translated == 1024
        vram.u64[((b.next - 4096) >> 3) + 7] = 0  # the last table's 8th entry: page 519
        bad = mmu_v2.read_back(vram, [root], b.next, 1 << 38, 1 << 40, 4 * MiB, "4k")
        assert bad.entries["pte"] == 1023 and bad.pages_translated == 1023
    finally:
        vram.close()


def test_v2_refuses_what_it_cannot_map():
    with pytest.raises(ValueError, match="not one of"):
        mmu_v2.footprint(GiB, "1g")
    with pytest.raises(ValueError, match="whole 2m pages"):
        mmu_v2.footprint(GiB + 4096, "2m")
    with pytest.raises(ValueError, match="256 GiB boundary"):
        mmu_v2.build(2 * MiB, "2m", 2, True, va=2 * MiB)


def test_pt_footprint_v2_cli(capsys):
    assert cli.main(["calibrate", "--pt-footprint", "--mmu", "v2", "--map-size", "64M",
                     "--vms", "1,2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 3 * 3 and all(r["built"] for r in rows)
    two = next(r for r in rows if r["page"] == "2m" and r["spaces"] == 1)
    assert two["seed_bytes"] == 32 * 8 and two["pages_translated"] == "32/32"
    assert cli.main(["calibrate", "--pt-footprint", "--mmu", "v2", "--map-size", "64M",
                     "--build-limit", "4K", "--json"]) == 0
    assert not any(r["built"] for r in json.loads(capsys.readouterr().out))