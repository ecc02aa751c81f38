"""MemslotTable bookkeeping against a recording fake VM (no /dev/kvm needed), plus a
property test that the table always matches what the kernel was told."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuvm.vmm.kvm import kvm_api as api
from gpuvm.vmm.kvm.memslots import PAGE, MemslotError, MemslotTable

BASE = 0xD0000000
HOST = 0x7F0000000000


class FakeVm:
    """Records KVM_SET_USER_MEMORY_REGION calls and keeps the resulting slot set."""

    def __init__(self, max_memslots: int = 64, readonly_mem: bool = True,
                 fail_gpa: int | None = None) -> None:
        self.max_memslots = max_memslots
        self.readonly_mem = readonly_mem
        self.fail_gpa = fail_gpa
        self.slots: dict[int, tuple[int, int, int, int]] = {}
        self.calls = 0

    def set_memory_region(self, slot: int, gpa: int, size: int, host_address: int,
                          flags: int = 0) -> None:
        self.calls += 1
        if size == 0:
            assert slot in self.slots, f"delete of unused slot {slot}"
            del self.slots[slot]
            return
        assert slot not in self.slots, f"slot {slot} reused while live"
        for g, s, _h, _f in self.slots.values():
            assert gpa + size <= g or g + s <= gpa, "overlapping slots"
        if gpa == self.fail_gpa:
            raise OSError("refused")
        self.slots[slot] = (gpa, size, host_address, flags)


def kernel_view(vm: FakeVm) -> list[tuple[int, int, int, int]]:
    return sorted(vm.slots.values())


def table_view(table: MemslotTable) -> list[tuple[int, int, int, int]]:
    return [(m.gpa, m.size, m.host_address, api.KVM_MEM_READONLY if m.readonly else 0)
            for m in table.mappings()]


def test_page_by_page_maps_coalesce_into_one_slot() -> None:
    vm = FakeVm()
    t = MemslotTable()
    t.bind(vm)
    for i in (0, 2, 1, 3):  # out of order: 0 and 2 separate until 1 bridges them
        t.map(BASE + i * PAGE, HOST + i * PAGE, PAGE)
    assert t.slots_in_use == 1
    assert kernel_view(vm) == [(BASE, 4 * PAGE, HOST, 0)]


def test_no_coalescing_across_host_gaps_or_readonly() -> None:
    vm = FakeVm()
    t = MemslotTable()
    t.bind(vm)
    t.map(BASE, HOST, PAGE)
    t.map(BASE + PAGE, HOST + 5 * PAGE, PAGE)  # guest-contiguous, host is not
    t.map(BASE + 2 * PAGE, HOST + 6 * PAGE, PAGE, readonly=True)  # flags differ
    assert t.slots_in_use == 3
    assert kernel_view(vm)[2] == (BASE + 2 * PAGE, PAGE, HOST + 6 * PAGE,
                                  api.KVM_MEM_READONLY)


def test_partial_unmap_splits() -> None:
    vm = FakeVm()
    t = MemslotTable()
    t.bind(vm)
    t.map(BASE, HOST, 8 * PAGE)
    t.unmap(BASE + 3 * PAGE, 2 * PAGE)
    assert t.slots_in_use == 2
    assert kernel_view(vm) == [(BASE, 3 * PAGE, HOST, 0),
                               (BASE + 5 * PAGE, 3 * PAGE, HOST + 5 * PAGE, 0)]
    assert t.lookup(BASE + 4 * PAGE) is None
    assert t.lookup(BASE + 7 * PAGE).host_at(BASE + 7 * PAGE) == HOST + 7 * PAGE
    t.unmap(BASE, 16 * PAGE)  # covering unmapped holes is fine
    assert t.slots_in_use == 0 and vm.slots == {}


def test_overlap_is_an_error_unless_replace() -> None:
    t = MemslotTable()
    t.map(BASE, HOST, 4 * PAGE)
    with pytest.raises(MemslotError, match="overlaps mapped"):
        t.map(BASE + PAGE, HOST + 0x100000, PAGE)
    t.map(BASE + PAGE, HOST + 0x100000, PAGE, replace=True)
    assert [(m.gpa, m.size) for m in t.mappings()] == [
        (BASE, PAGE), (BASE + PAGE, PAGE), (BASE + 2 * PAGE, 2 * PAGE)]


def test_bad_requests() -> None:
    t = MemslotTable(reserved=((0, 0x10000000),))
    with pytest.raises(MemslotError, match="whole pages"):
        t.map(BASE + 1, HOST, PAGE)
    with pytest.raises(MemslotError, match="whole pages"):
        t.unmap(BASE, 0)
    with pytest.raises(MemslotError, match="not page aligned"):
        t.map(BASE, HOST + 8, PAGE)
    with pytest.raises(MemslotError, match="reserved"):
        t.map(0x0FFFF000, HOST, 2 * PAGE)
    vm = FakeVm(readonly_mem=False)
    t.bind(vm)
    with pytest.raises(MemslotError, match="READONLY"):
        t.map(BASE, HOST, PAGE, readonly=True)


def test_table_filled_before_bind_is_applied_on_bind_and_kept_after_unbind() -> None:
    t = MemslotTable()
    t.map(BASE, HOST, 2 * PAGE)
    t.map(BASE + 2 * PAGE, HOST + 2 * PAGE, PAGE)
    vm = FakeVm()
    t.bind(vm)
    assert kernel_view(vm) == [(BASE, 3 * PAGE, HOST, 0)]
    t.unbind()
    t.unmap(BASE, PAGE)  # no VM: only the table changes
    assert kernel_view(vm) == [(BASE, 3 * PAGE, HOST, 0)]
    assert t.slots_in_use == 1


def test_kernel_refusal_leaves_the_range_unmapped() -> None:
    vm = FakeVm(fail_gpa=BASE)
    t = MemslotTable()
    t.bind(vm)
    t.map(BASE + PAGE, HOST + PAGE, PAGE)
    with pytest.raises(MemslotError, match="failed"):
        t.map(BASE, HOST, PAGE)  # would merge into BASE..+2 pages: refused
    # the neighbour was deleted for the merge; nothing is mapped, table agrees
    assert t.slots_in_use == 0 and vm.slots == {}


def test_slot_limit_and_reuse() -> None:
    vm = FakeVm(max_memslots=4)
    t = MemslotTable(first_slot=1)
    t.bind(vm)
    for i in range(3):  # slots 1..3 (host gaps: no coalescing)
        t.map(BASE + 2 * i * PAGE, HOST + 4 * i * PAGE, PAGE)
    with pytest.raises(MemslotError, match="out of KVM memslots"):
        t.map(BASE + 10 * PAGE, HOST + 40 * PAGE, PAGE)
    t.unmap(BASE, PAGE)
    t.map(BASE + 10 * PAGE, HOST + 40 * PAGE, PAGE)  # slot 1 reused
    assert sorted(vm.slots) == [1, 2, 3]


ops = st.lists(st.tuples(st.booleans(), st.integers(0, 15), st.integers(1, 4),
                         st.integers(0, 2), st.booleans()), max_size=30)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_table_matches_kernel_and_page_map(seq) -> None:
    """After any sequence of map/unmap, the kernel's slots are the table's mappings and
    every page resolves to the host address the last map gave it."""
    vm = FakeVm(max_memslots=1000)
    t = MemslotTable()
    t.bind(vm)
    model: dict[int, tuple[int, bool]] = {}  # page -> (host, readonly)
    for is_map, page, npages, host_shift, ro in seq:
        gpa, size = BASE + page * PAGE, npages * PAGE
        if is_map:
            host = HOST + (page + 64 * host_shift) * PAGE
            t.map(gpa, host, size, readonly=ro, replace=True)
            for i in range(npages):
                model[page + i] = (host + i * PAGE, ro)
        else:
            t.unmap(gpa, size)
            for i in range(npages):
                model.pop(page + i, None)
    assert kernel_view(vm) == table_view(t)
    for page in range(20):
        m = t.lookup(BASE + page * PAGE)
        got = None if m is None else (m.host_at(BASE + page * PAGE), m.readonly)
        assert got == model.get(page)
    # maximal coalescing: no two neighbouring slots could have been one
    maps = t.mappings()
    for a, b in zip(maps, maps[1:]):
        assert not (a.end == b.gpa and a.readonly == b.readonly
                    and a.host_at(a.end) == b.host_address)
