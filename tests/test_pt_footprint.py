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
