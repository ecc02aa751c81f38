"""Two faults a hostile guest found in the mediator (issue 76), each played as an attack:

- a channel briefly unbound while any VM's runlist is rebuilt (another VM's runlist
  submit) must be runnable again once its guest rebinds it -- it used to drop off the
  physical runlist for good;
- a BAR0 access that is not a 4-byte access to a register the trap table handles (a
  byte, a half word, a quad word, a misaligned word, a write to a register the mediator
  only reads) is refused: it never reaches the physical device at the guest's offset,
  which for the second VM's channel 0 is the first VM's channel 0.
"""

from __future__ import annotations

import time

import pytest

from gpuvm.device import layout, regs
from gpuvm.device.host_driver import HostDriver
from gpuvm.bench.fuzz import SYS_GPA, VA_SYS, World
from gpuvm.mediator.bar0_traps import PASSTHROUGH


@pytest.fixture
def world():
    w = World()
    yield w
    w.close()


def _rebind(t) -> None:
    t.drv.wr(regs.PFIFO_CHAN_TABLE, layout.chan_word(t.channel.inst))
    t.drv.wr(regs.PFIFO_CHAN_STATE, regs.PFIFO_CHAN_STATE_CREATE)
    t.channel.put = 0  # a rebound channel starts at GP_GET 0


def test_a_rebuild_while_unbound_keeps_the_channel_runnable_after_rebind(world):
    a, b = world.tenants
    pchid = a.vgpu.part.chid_base  # a's channel 0, on its runlist
    assert pchid in world.gpu.pfifo.runlist
    a.drv.wr(regs.PFIFO_CHAN_TABLE, 0)  # a unbinds it for a moment ...
    b.drv.submit_runlist([0])  # ... while b's runlist submit rebuilds the physical one
    _rebind(a)
    assert pchid in world.gpu.pfifo.runlist
    # and it runs: a semaphore release reaches a's RAM
    a.drv.push(a.channel, HostDriver.release(VA_SYS, 0x5EED))
    deadline = time.monotonic() + 10
    while a.ram.array[SYS_GPA:SYS_GPA + 4].view("<u4")[0] != 0x5EED:
        assert time.monotonic() < deadline, "the rebound channel never ran"
        time.sleep(0.001)


def test_a_vm_leaving_keeps_an_unbound_channel_runnable_after_rebind(world):
    a, _ = world.tenants
    pchid = a.vgpu.part.chid_base
    a.drv.wr(regs.PFIFO_CHAN_TABLE, 0)
    world.run_remove(1)  # the other VM leaves: its removal rebuilds the runlist
    _rebind(a)
    assert pchid in world.gpu.pfifo.runlist


class Recorder:
    """Every BAR0 access that reaches the physical device, by (offset, size)."""

    def __init__(self, gpu) -> None:
        self.seen: list[tuple[str, int, int]] = []
        read, write = gpu.mmio_read, gpu.mmio_write

        def mmio_read(bar, offset, size):
            if bar == regs.BAR0:
                self.seen.append(("read", offset, size))
            return read(bar, offset, size)

        def mmio_write(bar, offset, size, value):
            if bar == regs.BAR0:
                self.seen.append(("write", offset, size))
            write(bar, offset, size, value)

        gpu.mmio_read, gpu.mmio_write = mmio_read, mmio_write


def _odd_accesses(offset: int):
    """(offset, size) of every access to a register's word that is not one aligned
    4-byte access."""
    for size in (1, 2, 8):
        for shift in range(0, 4, size if size < 4 else 4):
            yield offset + shift, size
    for shift in (1, 2, 3):
        yield offset + shift, 4


def test_odd_size_bar0_accesses_never_reach_the_device(world):
    a, b = world.tenants
    rec = Recorder(world.gpu)
    refused_before = b.vgpu.counts["trap.refused.bar0"]
    targets = (regs.PFIFO_CHAN_TABLE, regs.PFIFO_CHAN_STATE, regs.PFIFO_KICK,
               regs.PMC_BOOT_0, regs.PFLUSH_FLUSH, regs.PBUS_PRAMIN_BASE, 0x0)
    n = 0
    for target in targets:
        for offset, size in _odd_accesses(target):
            b.vgpu.write(regs.BAR0, offset, size, 0x11223344)
            assert b.vgpu.read(regs.BAR0, offset, size) == (1 << (8 * size)) - 1
            n += 2
    raw = [s for s in rec.seen if s[2] != 4 or s[1] & 3]
    assert raw == [], f"forwarded raw: {raw[:5]}"
    assert b.vgpu.counts["trap.refused.bar0"] - refused_before == n
    # a's channel 0 (the physical channel at b's raw offset) is still bound and runnable
    ch = world.gpu.pfifo.channels[a.vgpu.part.chid_base]
    assert ch.valid and ch.runnable


def test_writes_to_registers_the_mediator_only_reads_are_refused(world):
    a, b = world.tenants
    rec = Recorder(world.gpu)
    reads = set(b.vgpu._r0) | {off for off, how in PASSTHROUGH if how == "read"}
    writes = set(b.vgpu._w0) | {off for off, how in PASSTHROUGH if how == "write"}
    read_only = sorted(reads - writes)
    assert regs.PFIFO_CHAN_ERROR_EXT in read_only and regs.PMC_BOOT_0 in read_only
    for offset in read_only:
        b.vgpu.write(regs.BAR0, offset, 4, 0xFFFFFFFF)
    assert [s for s in rec.seen if s[0] == "write" and s[1] in read_only] == []
    assert world.gpu.counts.total.get("mmio.unimplemented", 0) == 0
    # an offset the device has no register at is the trap table's too: refused
    rec.seen.clear()
    b.vgpu.write(regs.BAR0, 0x4, 4, 1)
    assert b.vgpu.read(regs.BAR0, 0x4, 4) == 0xFFFFFFFF
    assert rec.seen == []
