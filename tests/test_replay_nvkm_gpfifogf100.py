"""nvkm/engine/fifo/gpfifogf100.c replayed: gf100_fifo_gpfifo_fini and
gf100_fifo_gpfifo_init, as nouveau runs them around suspend/resume, unbind a channel and
bind it again; it goes on from where it was (RAMFC), with its subchannel objects."""

from __future__ import annotations

import numpy as np

from gpuvm.device import regs
from gpuvm.device.host_driver import HostDriver

from replay_rigs import target  # noqa: F401  (fixture)
from test_replay_nvc0_fence import gf100_fifo_intr_engine

SUB = 4


def gf100_fifo_runlist_commit(drv, chids: list[int]) -> None:
    rl = drv.alloc(max(1, len(chids)) * 8)
    for nr, chid in enumerate(chids):
        drv.vram_wr32(rl + nr * 8, chid)
        drv.vram_wr32(rl + nr * 8 + 4, 0x00000004)
    drv.wr(0x002270, rl >> 12 | 0 << 28)
    drv.wr(0x002274, 0x01F00000 | len(chids))
    drv.wait_runlist()  # until !(0x227c & 0x100000), the event acked


def gf100_fifo_gpfifo_fini(drv, chid: int) -> None:
    coff = chid * 8
    drv.wr(0x003004 + coff, drv.rd(0x003004 + coff) & ~0x00000001)
    gf100_fifo_runlist_commit(drv, [])
    gf100_fifo_intr_engine(drv)
    drv.wr(0x003000 + coff, 0x00000000)


def gf100_fifo_gpfifo_init(drv, chid: int, inst: int) -> None:
    coff = chid * 8
    drv.wr(0x003000 + coff, 0xC0000000 | inst >> 12)
    drv.wr(0x003004 + coff, 0x001F0001)
    gf100_fifo_runlist_commit(drv, [chid])


def test_rebind_like_gf100_fifo_gpfifo_fini_and_init(target):  # noqa: F811
    """Work done before the unbind is not done again after the bind (GP_GET comes back
    from RAMFC, not 0), and the copy object bound before it still serves its subchannel."""
    drv, rig = target.drv, target.rig
    marker_va, marker = rig.sys_va(2), rig.sys_base + 2 * rig.pages * 4096
    words = HostDriver.bind(SUB, regs.CLASS_COPY, regs.ENGINE_PCOPY0) + \
        HostDriver.release(marker_va, 1)
    assert target.run(words), target.faults()
    assert target.run([])  # one more entry: GP_GET moves on
    target.ram.write(marker, np.array([99], dtype=np.uint32))
    gp_get = drv.gpu.mmio_read(regs.BAR1, drv.poll_va + regs.USERD_GP_GET, 4)
    gf100_fifo_gpfifo_fini(drv, 0)
    gf100_fifo_gpfifo_init(drv, 0, rig.ch.inst)
    assert drv.gpu.mmio_read(regs.BAR1, drv.poll_va + regs.USERD_GP_GET, 4) == gp_get
    target.ram.write(rig.sys_base, np.arange(16, dtype=np.uint32))
    assert target.run(HostDriver.copy(SUB, rig.sys_va(0), rig.sys_va(1), 64)), target.faults()
    assert target.ram.read_u32(marker) == 99  # the first entries did not run again
    out = rig.sys_base + rig.pages * 4096
    assert target.ram.read(out, 64).view(np.uint32).tolist() == list(range(16))
    assert target.faults() == []


def test_new_channel_on_a_zeroed_block_starts_at_entry_0(target):  # noqa: F811
    """A driver that makes a new channel zeroes its instance block (nvkm's
    gf100_fifo_gpfifo_new): it starts at GP_GET 0 with no objects, whatever ran before."""
    drv, rig = target.drv, target.rig
    assert target.run(HostDriver.bind(SUB, regs.CLASS_COPY, regs.ENGINE_PCOPY0))
    gf100_fifo_gpfifo_fini(drv, 0)
    rig.ch = drv.create_channel(0, rig.space, rig.ch.gpfifo_va)  # fresh RAMIN, USERD
    gf100_fifo_runlist_commit(drv, [0])
    assert target.run([]), target.faults()
    assert drv.gpu.mmio_read(regs.BAR1, drv.poll_va + regs.USERD_GP_GET, 4) == 1
    # the subchannel is empty again: a copy method there is skipped (EMPTY_SUBC)
    assert target.run(HostDriver.copy(SUB, rig.sys_va(0), rig.sys_va(1), 4))
    assert drv.rd(0x040108) & 0x00800000
