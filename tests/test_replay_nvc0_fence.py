"""nvc0_fence.c replayed (with the uevent and interrupt handling of nvkm's fifo/gf100.c
that wakes its waiters): fences emitted and waited for with the host semaphore methods,
and the non-stall interrupt the emit raises, delivered to the guest that owns the
channel only."""

from __future__ import annotations

import os
import select
import time

import numpy as np

from gpuvm.device import regs

from replay_rigs import target  # noqa: F401  (fixture)

# cl906f.h
SEMAPHOREA, NON_STALL_INTERRUPT = 0x0010, 0x0020
SEMAPHORED_RELEASE_WFI_EN_16BYTE = 0x00000002  # OPERATION RELEASE, WFI EN, SIZE 16BYTE
SEMAPHORED_ACQ_GEQ_SWITCH = 0x00001004  # OPERATION ACQ_GEQ, ACQUIRE_SWITCH ENABLED


def PUSH_MTHD(subc: int, mthd: int, *values: int) -> list[int]:
    return [0x20000000 | (len(values) << 16) | (subc << 13) | (mthd >> 2), *values]


def nvc0_fence_emit32(virtual: int, sequence: int) -> list[int]:
    return PUSH_MTHD(0, SEMAPHOREA, virtual >> 32, virtual & 0xFFFFFFFF, sequence,
                     SEMAPHORED_RELEASE_WFI_EN_16BYTE, 0)  # ... NON_STALL_INTERRUPT, 0


def nvc0_fence_sync32(virtual: int, sequence: int) -> list[int]:
    return PUSH_MTHD(0, SEMAPHOREA, virtual >> 32, virtual & 0xFFFFFFFF, sequence,
                     SEMAPHORED_ACQ_GEQ_SWITCH)


def gf100_fifo_init_intr(drv) -> None:
    """gf100_fifo_init: ack everything, enable all but ENGINE, ENGINE_INTR_EN = 1; then
    gf100_fifo_uevent_init (a fence waiter) sets 0x2140 bit 31."""
    drv.wr(0x002100, 0xFFFFFFFF)
    drv.wr(0x002140, 0x7FFFFFFF)
    drv.wr(0x002628, 0x00000001)
    drv.wr(0x002140, drv.rd(0x002140) | 0x80000000)


def gf100_fifo_intr_engine(drv) -> list[int]:
    """gf100_fifo_intr's bit-31 branch: for each unit in 0x25a4, read 0x25a8 + 4u, write
    it back, and note which nibbles had NOTIFY (bit 0) under 0x2628."""
    notified = []
    mask = drv.rd(0x0025A4)
    while mask:
        unit = (mask & -mask).bit_length() - 1
        intr = drv.rd(0x0025A8 + unit * 4)
        inte = drv.rd(0x002628)
        drv.wr(0x0025A8 + unit * 4, intr)
        notified += [unit for unkn in range(8) if (intr >> (unkn * 4)) & inte & 1]
        mask &= ~(1 << unit)
    return notified


def test_fence_like_nvc0_fence_emit32_and_sync32(target):  # noqa: F811
    """emit32 releases {sequence, 0, timestamp} (16-byte release) and raises the
    non-stall interrupt: PFIFO_INTR bit 31 and PMC PFIFO, 0x25a4 bit 0, 0x25a8 NOTIFY,
    gone once gf100_fifo_intr_engine writes it back.  sync32 holds the channel until the
    fence value is >= its sequence."""
    drv, rig = target.drv, target.rig
    gf100_fifo_init_intr(drv)
    fence_va, fence = rig.sys_va(2), rig.sys_base + 2 * rig.pages * 4096
    target.ram.write(fence, np.full(4, 0xEEEEEEEE, dtype=np.uint32))
    assert target.run(nvc0_fence_emit32(fence_va, 7)), target.faults()
    seq, zero, lo, hi = target.ram.read(fence, 16).view(np.uint32).tolist()
    assert (seq, zero) == (7, 0) and (hi << 32 | lo) > 0
    assert drv.rd(regs.PFIFO_INTR) & 0x80000000
    assert drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PFIFO
    assert gf100_fifo_intr_engine(drv) == [0]
    assert not drv.rd(regs.PFIFO_INTR) & 0x80000000
    assert drv.rd(0x0025A4) == 0 and drv.rd(0x0025A8) == 0
    # sync32: wait for sequence 9 while the fence holds 7
    seq = rig.run(nvc0_fence_sync32(fence_va, 9))
    assert not target.wait(lambda: target.ram.read_u32(rig.fence) == seq, 0.3)
    target.ram.write(fence, np.array([9], dtype=np.uint32))  # the other channel's emit
    assert target.wait(lambda: target.ram.read_u32(rig.fence) == seq, 10), target.faults()
    assert target.faults() == []


def test_non_stall_interrupt_is_its_vms_own(target):  # noqa: F811
    """NON_STALL_INTERRUPT alone (no semaphore, nothing else that interrupts) sends the
    VM an MSI through its VFIO interrupt; it shows in no other VM's 0x25a4/0x25a8 nor
    PFIFO_INTR, the other VM gets no MSI, and its acknowledgement does not take it away."""
    if target.other is None:
        return  # one VM natively: nothing beside it
    drv, other = target.drv, target.other.drv
    gf100_fifo_init_intr(drv)
    gf100_fifo_init_intr(other)
    target.interrupts()
    other_fd = target.other.attached.irq_fd
    while select.select([other_fd], [], [], 0.5)[0]:  # the setup's runlist events, late
        os.eventfd_read(other_fd)                      # under load: drained till quiet
    drv.push(target.rig.ch, PUSH_MTHD(0, NON_STALL_INTERRUPT, 0))
    deadline = time.monotonic() + 5
    while not drv.rd(0x0025A8) & 1:
        assert time.monotonic() < deadline, "the notify never showed"
        time.sleep(0.001)
    while not target.interrupts():
        assert time.monotonic() < deadline, "no MSI reached the VM"
        time.sleep(0.01)
    assert not select.select([other_fd], [], [], 0.2)[0]  # no MSI for the other VM
    assert drv.rd(0x0025A8) & 1
    assert other.rd(0x0025A8) == 0 and other.rd(0x0025A4) == 0
    assert not other.rd(regs.PFIFO_INTR) & 0x80000000
    other.wr(0x0025A8, 1)
    assert drv.rd(0x0025A8) & 1 and drv.rd(regs.PFIFO_INTR) & 0x80000000
    assert gf100_fifo_intr_engine(drv) == [0]
