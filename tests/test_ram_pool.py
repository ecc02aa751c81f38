"""Guest RAM populated up front is kept after its VM and scrubbed for the next one
(gpuvm.vmm.ram_pool) -- never where another process or a view may still reach it."""

import os

import pytest

from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.ram_pool import POOL, RamPool

SIZE = 4 << 20


@pytest.fixture
def pool():
    kept = RamPool(limit_bytes=2 * SIZE)
    yield kept
    kept.drain()


def _dirty(ram: GuestRam) -> None:
    ram.array[::4096] = 0xAB
    ram.write(SIZE - 8, b"secrets!")


def test_the_next_vm_gets_the_kept_pages_zeroed(pool):
    first = GuestRam(SIZE, prealloc=True, pool=pool)
    _dirty(first)
    first.close()
    assert pool.kept_bytes == SIZE
    second = GuestRam(SIZE, prealloc=True, pool=pool)
    assert pool.kept_bytes == 0  # taken, not made anew
    assert not second.array.any()
    second.close()


def test_only_the_same_size_and_backing_is_reused(pool):
    GuestRam(SIZE, prealloc=True, pool=pool).close()
    other = GuestRam(2 * SIZE, prealloc=True, pool=pool)
    four_k = GuestRam(SIZE, backing="4k", prealloc=True, pool=pool)
    assert pool.kept_bytes == SIZE
    other.close()  # does not fit beside the first: freed
    assert pool.kept_bytes == SIZE
    four_k.close()
    assert pool.kept_bytes == 2 * SIZE


def test_ram_whose_fd_left_the_process_is_freed(pool):
    ram = GuestRam(SIZE, prealloc=True, pool=pool)
    assert ram.share_fd() >= 0  # as a vfio-user server is given it
    ram.close()
    assert pool.kept_bytes == 0


def test_ram_with_a_view_left_is_freed_and_the_view_keeps_its_bytes(pool):
    ram = GuestRam(SIZE, prealloc=True, pool=pool)
    ram.write(0, b"kept")
    view = ram.read(0, 4)
    ram.close()
    assert pool.kept_bytes == 0
    assert bytes(view) == b"kept"


def test_ram_allocated_on_demand_is_not_kept(pool):
    GuestRam(SIZE, prealloc=False, pool=pool).close()
    assert pool.kept_bytes == 0


def test_a_forked_child_starts_with_an_empty_pool():
    ram = GuestRam(SIZE, prealloc=True)
    ram.close()
    try:
        assert POOL.kept_bytes >= SIZE
        child = os.fork()
        if child == 0:
            os._exit(0 if POOL.kept_bytes == 0 else 1)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert POOL.kept_bytes >= SIZE  # the parent's are still the parent's
    finally:
        POOL.drain()


def test_ram_advised_small_pages_is_freed(pool):
    ram = GuestRam(SIZE, backing="thp", prealloc=True, pool=pool)
    ram.advise_nohugepage(0, 4096)
    ram.close()
    assert pool.kept_bytes == 0
