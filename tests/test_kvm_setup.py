"""Host-side VM setup: ABI sizes, page tables, layout checks (no /dev/kvm needed), and VM
creation through signals (with it)."""

from __future__ import annotations

import ctypes
import signal
from pathlib import Path

import numpy as np
import pytest

from gpuvm.device import regs
from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.kvm import kvm_api as api
from gpuvm.vmm.kvm import kvm_usable, long_mode
from gpuvm.vmm.kvm.runner import GuestImageError, bar_windows, load_image
from gpuvm.vmm.kvm.vm import KvmVm


def test_struct_sizes_match_linux_headers() -> None:
    assert ctypes.sizeof(api.KvmRegs) == 144
    assert ctypes.sizeof(api.KvmSregs) == 312
    assert ctypes.sizeof(api.KvmSegment) == 24
    assert ctypes.sizeof(api.KvmUserspaceMemoryRegion) == 32
    assert api.KvmSregs.cr0.offset == 224 and api.KvmRegs.rip.offset == 128
    assert (api.KVM_RUN, api.KVM_CREATE_VM, api.KVM_GET_SREGS) == (0xAE80, 0xAE01, 0x8138AE83)


def _walk(tables: np.ndarray, va: int) -> tuple[int, int] | None:
    """Software walk of the identity tables: (physical address, accumulated flags)."""
    def entry(table_pa: int, index: int) -> int:
        return int(tables[(table_pa + index * 8) // 8])
    e4 = entry(long_mode.PML4, (va >> 39) & 511)
    e3 = entry(e4 & ~0xFFF, (va >> 30) & 511) if e4 & 1 else 0
    e2 = entry(e3 & ~0xFFF, (va >> 21) & 511) if e3 & 1 else 0
    if not e2 & 1:
        return None
    assert e2 & long_mode.PTE_PS
    return (e2 & ~0x1FFFFF & ((1 << 52) - 1)) | (va & 0x1FFFFF), e4 & e3 & e2 & 7


def test_identity_tables_cover_ram_and_bars_for_cpl3() -> None:
    ram = GuestRam(8 * regs.MiB)
    assert long_mode.write_identity_page_tables(ram) == abi.GUEST_PAGE_TABLES
    tables = ram.array.view(np.uint64)
    for va in (0x0, abi.GUEST_IMAGE_BASE + 0x123, abi.GUEST_BAR0_BASE + regs.PMC_INTR_EN,
               abi.GUEST_BAR3_BASE + 0xFFFFFFC, abi.GUEST_IDENTITY_MAP_TOP - 4):
        assert _walk(tables, va) == (va, 7), hex(va)  # present, writable, user
    assert _walk(tables, abi.GUEST_IDENTITY_MAP_TOP) is None
    assert not ram.array[:abi.GUEST_PAGE_TABLES].any()  # page 0 stays zero
    ram.close()


def test_sregs_and_entry_registers() -> None:
    s = api.KvmSregs()
    long_mode.configure_sregs(s, 0x1000)
    assert (s.cr0, s.cr4, s.efer, s.cr3) == (0x80050033, 0x620, 0x500, 0x1000)
    assert (s.cs.selector, s.cs.dpl, s.cs.l, s.cs.db, s.cs.type) == (0xB, 3, 1, 0, 11)
    assert (s.ss.selector, s.ss.dpl, s.ss.db, s.ss.type) == (0x13, 3, 1, 3)
    r = long_mode.entry_regs(abi.GUEST_IMAGE_BASE, abi.GUEST_STACK_TOP - 8,
                             abi.GUEST_BOOT_PARAMS)
    assert r.rflags & (3 << 12) == 3 << 12  # IOPL 3: `out` works at CPL3
    with pytest.raises(ValueError, match="8 mod 16"):
        long_mode.entry_regs(0, abi.GUEST_STACK_TOP, 0)


def test_images_that_do_not_fit_are_rejected(tmp_path: Path) -> None:
    ram = GuestRam(abi.GUEST_IMAGE_BASE + 0x1000)
    small = tmp_path / "small.bin"
    small.write_bytes(b"\x90" * 0x1000)
    assert load_image(small, ram, "vm") == b"\x90" * 0x1000
    bigger = tmp_path / "bigger.bin"
    bigger.write_bytes(b"\x90" * 0x1001)
    with pytest.raises(GuestImageError, match="does not fit"):
        load_image(bigger, ram, "vm")
    huge = tmp_path / "huge.bin"
    huge.write_bytes(b"\x90" * (abi.GUEST_IMAGE_MAX + 1))
    with pytest.raises(GuestImageError, match="layout allows"):
        load_image(huge, GuestRam(16 * regs.MiB), "vm")
    with pytest.raises(GuestImageError, match="cannot read"):
        load_image(tmp_path / "missing.bin", ram, "vm")
    ram.close()


def test_bar_windows_are_checked_against_the_layout() -> None:
    w = bar_windows({3: 0x1000, 0: regs.BAR0_SIZE}, 256 * regs.MiB)
    assert [(x.bar, x.base) for x in w] == [(0, abi.GUEST_BAR0_BASE), (3, abi.GUEST_BAR3_BASE)]
    with pytest.raises(ValueError, match="BAR4 has no guest-physical window"):
        bar_windows({4: 0x1000}, 256 * regs.MiB)
    with pytest.raises(ValueError, match="does not fit its window"):
        bar_windows({1: abi.GUEST_BAR3_BASE - abi.GUEST_BAR1_BASE + 0x1000}, 0x1000)
    with pytest.raises(ValueError, match="overlaps the BAR windows"):
        bar_windows({0: 0x1000}, abi.GUEST_BAR0_BASE + 0x1000)


def test_kvm_usable_answers_with_a_reason() -> None:
    ok, why = kvm_usable()
    assert isinstance(ok, bool) and why and "\n" not in why


def test_vm_creation_goes_on_through_signals() -> None:
    """KVM_CREATE_VM gives up (EINTR) when a signal is pending as it takes the process's
    memory locks -- under a 200 us interval timer 26 of 300 bare tries did (at 20 us,
    297: so often that no try ends, on a loaded host) -- so a VMM must try again, as
    QEMU does; a profiler attaching made `gpuvm` say KVM was not usable."""
    ok, why = kvm_usable()
    if not ok:
        pytest.skip(why)
    old = signal.signal(signal.SIGALRM, lambda *_: None)
    signal.setitimer(signal.ITIMER_REAL, 200e-6, 200e-6)
    try:
        for _ in range(100):
            assert kvm_usable()[0]
            KvmVm.create().close()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
