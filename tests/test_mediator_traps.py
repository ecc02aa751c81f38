"""Every BAR0 register a guest can reach is classified, and shared ones never pass through.

The device's own register map (every handler its MMIO bus blocks register) is enumerated
and each (offset, direction) must be in the vGPU's trap table -- virtual, translated,
faked or refused -- or in bar0_traps.PASSTHROUGH, which names why sharing it is harmless.
"""

from __future__ import annotations

import threading
import time

import pytest

from gpuvm.device import regs
from gpuvm.device.gpu import Gpu
from gpuvm.mediator.bar0_traps import PASSTHROUGH
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import PartitionSpec


@pytest.fixture
def two():
    gpu = Gpu(time_scale=1000, vram_size=1024 * regs.MiB)
    med = Mediator(gpu)
    spec = PartitionSpec(vram_size=128 * regs.MiB, channels=4)
    a, b = med.add_vm("a", MODES["fv"], spec), med.add_vm("b", MODES["pv"], spec)
    yield gpu, med, a, b
    med.close()
    gpu.release_memory()


def device_registers(gpu: Gpu) -> list[tuple[int, str, str]]:
    """(offset, direction, block) of every register the device implements."""
    out = []
    for offset in range(0, regs.BAR0_SIZE, 4):
        block = gpu.mmio_bus.block_at(offset)
        if block is None:
            continue
        if offset in block.readers:
            out.append((offset, "read", block.name))
        if offset in block.writers:
            out.append((offset, "write", block.name))
    return out


def test_every_device_register_is_classified(two):
    gpu, med, a, b = two
    registers = device_registers(gpu)
    assert len(registers) > 200  # the whole map, channels included
    for vgpu in (a, b):
        unclassified = [f"{off:#x} {how} ({block})" for off, how, block in registers
                        if off not in (vgpu._r0 if how == "read" else vgpu._w0)
                        and (off, how) not in PASSTHROUGH]
        assert unclassified == [], f"{vgpu.name}: not in the trap table: {unclassified}"


def test_shared_registers_do_not_pass_through(two):
    gpu, med, a, b = two
    for off in (regs.BLOCK_PCOPY0 + regs.PCOPY_NEXT_CHAN, regs.BLOCK_PCOPY1 + regs.PCOPY_NEXT_CHAN,
                regs.PGRAPH_INTR, regs.PGRAPH_STATUS):
        assert (off, "read") not in PASSTHROUGH and (off, "write") not in PASSTHROUGH
        assert a._r0[off][0] != "trap.bar0.passthrough.read"
    # one VM's mailbox write is not another's signal, nor the device's
    off = regs.BLOCK_PCOPY0 + regs.PCOPY_NEXT_CHAN
    a.write(regs.BAR0, off, 4, 0x1234)
    assert a.read(regs.BAR0, off, 4) == 0x1234
    assert b.read(regs.BAR0, off, 4) == 0
    assert gpu.mmio_read(regs.BAR0, off, 4) == 0
    assert a.counters().get("trap.bar0.passthrough.write", 0) == 0


def test_passthrough_is_only_what_is_listed(two):
    gpu, med, a, b = two
    for (off, how), why in PASSTHROUGH.items():
        assert why
        table = a._r0 if how == "read" else a._w0
        assert table[off][0] == f"trap.bar0.passthrough.{how}"
    passed = {(off, how) for how, table in (("read", a._r0), ("write", a._w0))
              for off, handler in table.items() if "passthrough" in handler[0]}
    assert passed == set(PASSTHROUGH)


def _locked_read(vgpu) -> int:
    """A BAR0 register whose trapped read runs under the mediator's lock."""
    return next(off for off, handler in vgpu._r0.items() if handler[2])


class LockHolder:
    """Another thread holding `lock` from construction until `let_go()`, and 20 ms after
    it: the caller's next take of the lock is then sure to wait."""

    def __init__(self, lock) -> None:
        self._held, self._done = threading.Event(), threading.Event()
        self._lock = lock
        self._thread = threading.Thread(target=self._hold)
        self._thread.start()
        self._held.wait(5)

    def _hold(self) -> None:
        with self._lock:
            self._held.set()
            self._done.wait(5)
            time.sleep(0.02)

    @property
    def holding(self) -> bool:
        """Not yet let go (the holder still has the lock)."""
        return not self._done.is_set() and self._thread.is_alive()

    def let_go(self) -> None:
        self._done.set()

    def join(self) -> None:
        self._thread.join()


def test_a_wait_for_the_mediator_lock_is_counted_for_the_waiting_vm(two):
    from gpuvm.mediator.host_port import MEDIATOR_LOCK_WAIT_NS, MEDIATOR_LOCK_WAITS
    gpu, med, a, b = two
    offset = _locked_read(a)
    a.read(regs.BAR0, offset, 4)  # uncontended: nothing counted
    assert a.counts.get(MEDIATOR_LOCK_WAITS, 0) == 0
    holder = LockHolder(med.lock)
    holder.let_go()
    a.read(regs.BAR0, offset, 4)  # waits for the holder's ~20 ms
    holder.join()
    assert a.counts[MEDIATOR_LOCK_WAITS] == 1
    assert a.counts[MEDIATOR_LOCK_WAIT_NS] >= 15_000_000
    assert b.counts.get(MEDIATOR_LOCK_WAITS, 0) == 0
    assert not med.lock._is_owned()  # given back
