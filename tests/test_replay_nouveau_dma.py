"""nouveau_dma.c / nouveau_dma.h replayed: the IB-mode submission nouveau runs on GF100
(RING_SPACE -> nv50_dma_wait / nv50_dma_push_wait, OUT_RING, FIRE_RING -> nv50_dma_push),
which reuses pushbuffer space by polling DMA_GET (USERD 0x44 / 0x60, READ_GET) and IB
space by polling GP_GET (0x88) -- through a full wrap of both rings."""

from __future__ import annotations

import time

import numpy as np

from gpuvm.device import regs
from gpuvm.device.host_driver import HostChannel, HostDriver

from replay_rigs import target  # noqa: F401  (fixture)

EINVAL, EBUSY = -22, -16


class NouveauRing:
    """The fields of nouveau's struct nouveau_channel.dma and the functions on them, with
    the channel's pushbuffer and IB ring where HostDriver put them (small rings, so a
    handful of fences wraps both)."""

    def __init__(self, drv: HostDriver, ch: HostChannel, max_words: int) -> None:
        self.drv, self.ch = drv, ch
        self.userd = drv.poll_va + ch.chid * regs.USERD_STRIDE  # BAR1: nvif_rd32(userd)
        self.push_addr = ch.pushbuf_va
        self.max = max_words
        self.cur = self.put = 0
        self.free = self.max - self.cur
        self.ib_max = ch.gpfifo_entries - 1
        self.ib_put = 0
        self.ib_free = self.ib_max - self.ib_put
        self.deadline = time.monotonic() + 30

    def _rd(self, reg: int) -> int:
        return self.drv.gpu.mmio_read(regs.BAR1, self.userd + reg, 4)

    def _spin(self) -> None:
        assert time.monotonic() < self.deadline, "nouveau would spin here forever"
        time.sleep(0)

    def READ_GET(self, prev: list[int]) -> int:
        val = self._rd(0x44) | self._rd(0x60) << 32  # user_get, user_get_hi
        if val != prev[0]:
            prev[0] = val
        if val < self.push_addr or val > self.push_addr + (self.max << 2):
            return EINVAL
        return (val - self.push_addr) >> 2

    def nv50_dma_push_wait(self, count: int) -> None:
        while self.ib_free < count:
            self._spin()
            get = self._rd(0x88)
            self.ib_free = get - self.ib_put
            if self.ib_free <= 0:
                self.ib_free += self.ib_max

    def nv50_dma_wait(self, slots: int, count: int) -> None:
        self.nv50_dma_push_wait(slots + 1)
        prev = [0]
        while self.free < count:
            get = self.READ_GET(prev)
            if get < 0:
                self._spin()
                continue
            if get <= self.cur:
                self.free = self.max - self.cur
                if self.free >= count:
                    break
                self.FIRE_RING()
                while True:
                    get = self.READ_GET(prev)
                    if get > 0:  # (get < 0: EINVAL, continue)
                        break
                    self._spin()
                self.cur = self.put = 0
            self.free = get - self.cur - 1

    def RING_SPACE(self, size: int) -> None:
        self.nv50_dma_wait(1, size)  # nouveau_dma_wait, IB mode
        self.free -= size

    def OUT_RING(self, data: int) -> None:
        self.drv.vram_wr32(self.ch.pushbuf + 4 * self.cur, data)
        self.cur += 1

    def nv50_dma_push(self, offset: int, length: int) -> None:
        assert self.ib_free >= 1
        entry = self.ch.ring + 8 * self.ib_put
        self.drv.vram_wr32(entry, offset & 0xFFFFFFFF)
        self.drv.vram_wr32(entry + 4, (offset >> 32) | length << 8)
        self.ib_put = (self.ib_put + 1) & self.ib_max
        self.drv.gpu.mmio_write(regs.BAR1, self.userd + 0x8C, 4, self.ib_put)
        self.ib_free -= 1

    def FIRE_RING(self) -> None:
        if self.cur == self.put:
            return
        self.nv50_dma_push(self.push_addr + (self.put << 2), (self.cur - self.put) << 2)
        self.put = self.cur


def test_ring_wrap_like_nv50_dma_wait_and_nv50_dma_push(target):  # noqa: F811
    """Fences pushed nouveau's way until both the pushbuffer (64 words) and the IB ring
    (16 entries) have wrapped several times: every fence lands, in order; at the end
    GP_GET equals nouveau's ib_put and DMA_GET stands where the last segment ended."""
    drv, rig = target.drv, target.rig
    drv.wr(regs.PFIFO_CHAN_TABLE, 0)  # a channel with a 16-entry IB ring
    drv.GPFIFO_LOG2 = 4
    rig.ch = drv.create_channel(0, rig.space, rig.ch.gpfifo_va)
    drv.submit_runlist([0])
    ring = NouveauRing(drv, rig.ch, 64)
    slots_va, slots = rig.sys_va(2), rig.sys_base + 2 * rig.pages * 4096
    target.ram.write(slots, np.zeros(64, dtype=np.uint32))
    fences = 100
    for seq in range(1, fences + 1):
        va = slots_va + 4 * (seq % 64)
        ring.RING_SPACE(5)
        for word in (0x20000000 | 4 << 16 | 0x10 >> 2, va >> 32, va & 0xFFFFFFFF, seq,
                     regs.SEM_RELEASE | regs.SEM_SHORT):
            ring.OUT_RING(word)
        ring.FIRE_RING()
    last = slots + 4 * (fences % 64)
    assert target.wait(lambda: target.ram.read_u32(last) == fences, 10), target.faults()
    got = target.ram.read(slots, 256).view(np.uint32)
    expect = [max(s for s in range(1, fences + 1) if s % 64 == i) for i in range(64)]
    assert got.tolist() == expect  # nothing skipped, nothing replayed late
    assert ring._rd(0x88) == ring.ib_put
    assert ring.READ_GET([0]) == ring.put
    assert target.faults() == []
