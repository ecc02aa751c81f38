"""nvkm/engine/gr/gf100.c's interrupt handler (gf100_gr_intr) replayed against what a
channel's graph-engine methods raise: a method the bound class does not have is
ILLEGAL_MTHD -- recorded with its subchannel, method and data, skipped, the channel going
on -- and a notifier is NOTIFY; the handler's acks leave PGRAPH quiet."""

from __future__ import annotations

import numpy as np

from gpuvm.device import regs

from replay_rigs import target  # noqa: F401  (fixture)
from test_replay_gdev_nvc0 import COMPUTE, M2MF, nvc0_fence_write, nvc0_init, nvc0_notify_intr


def gf100_gr_intr(drv) -> list:
    log = []
    stat = drv.rd(0x400100)
    addr = drv.rd(0x400704)
    mthd, subc = addr & 0x00003FFC, (addr & 0x00070000) >> 16
    data = drv.rd(0x400708)
    if stat & 0x00000001:
        log.append(("notify",))
        drv.wr(0x400100, 0x00000001)
        stat &= ~0x00000001
    if stat & 0x00000010:
        log.append(("illegal_mthd", subc, mthd, data))
        drv.wr(0x400100, 0x00000010)
        stat &= ~0x00000010
    if stat:
        log.append(("unknown", stat))
        drv.wr(0x400100, stat)
    drv.wr(0x400500, 0x00010001)
    return log


def test_illegal_method_like_gf100_gr_intr(target):  # noqa: F811
    """Compute method 0x0ff0 and M2MF method 0x0544 do not exist: each is ILLEGAL_MTHD on
    PGRAPH (0x400100 bit 4, PMC bit 12) naming subchannel, method and data, and the
    fence after them still lands.  Another VM's PGRAPH stays quiet."""
    drv, rig = target.drv, target.rig
    qva, qaddr = rig.sys_va(2), rig.sys_base + 2 * rig.pages * 4096
    target.ram.write(qaddr, np.zeros(4, dtype=np.uint32))
    words = list(nvc0_init()) + [0x20010000 | COMPUTE << 13 | 0x0FF0 >> 2, 0xABCD] \
        + list(nvc0_fence_write(COMPUTE, qva, 5))
    assert target.run(words), target.faults()
    assert target.ram.read_u32(qaddr) == 5  # the query after the bad method was written
    assert drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PGRAPH
    if target.other is not None:
        assert target.other.drv.rd(0x400100) == 0
    assert gf100_gr_intr(drv) == [("illegal_mthd", COMPUTE, 0x0FF0, 0xABCD)]
    assert drv.rd(0x400100) == 0 and not drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PGRAPH
    assert target.run([0x20010000 | M2MF << 13 | 0x0544 >> 2, 7]), target.faults()
    assert gf100_gr_intr(drv) == [("illegal_mthd", M2MF, 0x0544, 7)]
    assert target.faults() == []


def test_notify_like_gf100_gr_intr(target):  # noqa: F811
    """Gdev's notifier raises NOTIFY; gf100_gr_intr acks it at 0x400100 bit 0."""
    drv, rig = target.drv, target.rig
    nva = rig.sys_va(2)
    assert target.run(list(nvc0_init()) + list(nvc0_notify_intr(nva, 1))), target.faults()
    assert target.wait(lambda: bool(drv.rd(0x400100) & 1), 5)
    assert gf100_gr_intr(drv) == [("notify",)]
    assert drv.rd(0x400100) == 0
