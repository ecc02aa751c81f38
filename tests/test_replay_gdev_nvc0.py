"""Gdev's common/gdev_nvidia_nvc0.c replayed: nvc0_init (padding, the four subchannel
binds, the compute setup methods), nvc0_launch, nvc0_fence_write, nvc0_membar,
nvc0_memcpy_m2mf and nvc0_notify_intr, word for word (the kernel object the code address
names stands in for SASS)."""

from __future__ import annotations

import time

import numpy as np

from gpuvm.device import regs
from gpuvm.device.kernels import kernel_object

from replay_rigs import target  # noqa: F401  (fixture)

COMPUTE, M2MF, PCOPY0, PCOPY1 = 1, 2, 3, 4  # gdev_nvidia.h GDEV_SUBCH_NV_*


class Ring(list):
    """Gdev's __gdev_begin_ring_nvc0 / _const and __gdev_out_ring into a word list."""

    def begin(self, subc: int, mthd: int, n: int) -> None:
        self.append((0x2 << 28) | (n << 16) | (subc << 13) | (mthd >> 2))

    def begin_const(self, subc: int, mthd: int, n: int) -> None:
        self.append((0x6 << 28) | (n << 16) | (subc << 13) | (mthd >> 2))

    def out(self, word: int) -> None:
        self.append(word & 0xFFFFFFFF)


def nvc0_init(mp_limit: int = 14) -> Ring:
    r = Ring()
    for _ in range(128 // 4):
        r.out(0)
    r.begin(M2MF, 0, 1); r.out(0x9039)  # noqa: E702
    r.begin(COMPUTE, 0, 1); r.out(0x90C0)  # noqa: E702
    r.begin(PCOPY0, 0, 1); r.out(0x490B5)  # noqa: E702
    r.begin(PCOPY1, 0, 1); r.out(0x590B8)  # noqa: E702  (GDEV_NVIDIA_USE_PCOPY1)
    r.begin(COMPUTE, 0x100, 1); r.out(0)  # noqa: E702
    r.begin(COMPUTE, 0x758, 1); r.out(mp_limit)  # noqa: E702
    r.begin(COMPUTE, 0xD64, 1); r.out(0xF)  # noqa: E702
    r.begin(COMPUTE, 0x2A0, 1); r.out(0x8000)  # noqa: E702
    r.begin(COMPUTE, 0x238, 2); r.out((1 << 16) | 1); r.out(1)  # noqa: E702
    r.begin(COMPUTE, 0x3AC, 2); r.out((1 << 16) | 1); r.out(1)  # noqa: E702
    r.begin(COMPUTE, 0x2C4, 1); r.out(0)  # noqa: E702
    for i in range(0xFF):
        r.begin(COMPUTE, 0x2C8, 1); r.out((0xC << 28) | (i << 16) | i)  # noqa: E702
    r.begin(COMPUTE, 0x2C4, 1); r.out(1)  # noqa: E702
    return r


def nvc0_launch(code_addr: int, cb_addr: int, params: list[int]) -> Ring:
    """nvc0_launch for one block of 32 threads, c0[] at cb_addr holding the parameters
    at offset 0 (fewer than 8 words: nvcc's header words are not filled in)."""
    r = Ring()
    r.begin(COMPUTE, 0x790, 5)
    for w in (0, 0x100000, 0, 0x100000, 0x200):  # TEMP address/size, WARP_TEMP_ALLOC
        r.out(w)
    r.begin(COMPUTE, 0x77C, 1); r.out(0x1000000)  # noqa: E702  LOCAL_BASE
    r.begin(COMPUTE, 0x204, 3); r.out(0x10); r.out(0); r.out(0x400)  # noqa: E702
    r.begin(COMPUTE, 0x308, 1); r.out(1)  # noqa: E702  CACHE_SPLIT
    r.begin(COMPUTE, 0x214, 1); r.out(0)  # noqa: E702  SHARED_BASE
    r.begin(COMPUTE, 0x24C, 1); r.out(0)  # noqa: E702  SHARED_SIZE
    r.begin(COMPUTE, 0x1698, 1); r.out(0x0001)  # noqa: E702  FLUSH_CODE
    r.begin(COMPUTE, 0x1608, 2); r.out(code_addr >> 32); r.out(code_addr)  # noqa: E702
    r.begin(COMPUTE, 0x3B4, 1); r.out(0)  # noqa: E702  CP_START_ID
    r.begin(COMPUTE, 0x2380, 3); r.out(0x100); r.out(cb_addr >> 32); r.out(cb_addr)  # noqa
    r.begin(COMPUTE, 0x1694, 1); r.out((0 << 8) | 1)  # noqa: E702  CB_BIND
    r.begin(COMPUTE, 0x238C, 1); r.out(0)  # noqa: E702  CB_POS
    r.begin_const(COMPUTE, 0x2390, len(params))
    for p in params:
        r.out(p)
    r.begin(COMPUTE, 0x1698, 1); r.out(0x1000)  # noqa: E702  FLUSH_CB
    r.begin(COMPUTE, 0x238, 2); r.out((1 << 16) | 1); r.out(1)  # noqa: E702
    r.begin(COMPUTE, 0x3AC, 2); r.out((1 << 16) | 32); r.out(1)  # noqa: E702
    r.begin(COMPUTE, 0x250, 1); r.out(32)  # noqa: E702  TH_ALLOC
    r.begin(COMPUTE, 0x2C0, 1); r.out(8)  # noqa: E702  CP_GPR_ALLOC
    r.begin(COMPUTE, 0x254, 1); r.out(0)  # noqa: E702  BARRIER_ALLOC
    r.begin(COMPUTE, 0x780, 1); r.out(1)  # noqa: E702  GRIDID
    r.begin(COMPUTE, 0x36C, 1); r.out(0)  # noqa: E702
    r.begin(COMPUTE, 0x1698, 1); r.out(0x0110)  # noqa: E702
    r.begin(COMPUTE, 0x29C, 1); r.out(0)  # noqa: E702  BEGIN
    r.begin(COMPUTE, 0xA08, 1); r.out(0)  # noqa: E702
    r.begin(COMPUTE, 0x368, 1); r.out(0x1000)  # noqa: E702  LAUNCH
    r.begin(COMPUTE, 0xA04, 1); r.out(0)  # noqa: E702  END
    r.begin(COMPUTE, 0x360, 1); r.out(1)  # noqa: E702
    return r


def nvc0_fence_write(subch: int, vm_addr: int, sequence: int) -> Ring:
    r = Ring()
    if subch == COMPUTE:
        r.begin(COMPUTE, 0x110, 1); r.out(0)  # noqa: E702  SERIALIZE
        r.begin(COMPUTE, 0x1B00, 4)
        for w in (vm_addr >> 32, vm_addr, sequence, 0 << 20):
            r.out(w)
    elif subch == M2MF:
        r.begin(M2MF, 0x32C, 3); r.out(vm_addr >> 32); r.out(vm_addr); r.out(sequence)  # noqa
    else:
        r.begin(subch, 0x338, 3); r.out(vm_addr >> 32); r.out(vm_addr); r.out(sequence)  # noqa
    return r


def nvc0_membar() -> Ring:
    r = Ring()
    r.begin_const(COMPUTE, 0x21C, 2); r.out(4); r.out(0x1111)  # noqa: E702
    return r


def nvc0_memcpy_m2mf(dst: int, src: int, size: int) -> Ring:
    r = Ring()
    page, mode1, mode2 = 0x1000, 0x102110, 0x100110
    pages, rem = size // page, size % page
    while pages:
        lines = min(pages, 2047)
        r.begin(M2MF, 0x238, 2); r.out(dst >> 32); r.out(dst)  # noqa: E702
        r.begin(M2MF, 0x30C, 6)
        for w in (src >> 32, src, page, page, page, lines):
            r.out(w)
        r.begin(M2MF, 0x300, 1)
        r.out(mode1 if pages == lines and rem == 0 else mode2)
        pages -= lines
        dst += page * lines
        src += page * lines
    if rem:
        r.begin(M2MF, 0x238, 2); r.out(dst >> 32); r.out(dst)  # noqa: E702
        r.begin(M2MF, 0x30C, 6)
        for w in (src >> 32, src, rem, rem, rem, 1):
            r.out(w)
        r.begin(M2MF, 0x300, 1); r.out(mode1)  # noqa: E702
    return r


def nvc0_notify_intr(addr: int, cid: int) -> Ring:
    r = Ring()
    r.begin(COMPUTE, 0x110, 1); r.out(0)  # noqa: E702  SERIALIZE
    r.begin(COMPUTE, 0x104, 3); r.out(addr >> 32); r.out(addr); r.out(1)  # noqa: E702
    r.begin(COMPUTE, 0x100, 1); r.out(cid)  # noqa: E702  NOP
    return r


def _query(target, i: int) -> tuple[int, int]:
    rig = target.rig
    return rig.sys_va(2) + 16 * i, rig.sys_base + 2 * rig.pages * 4096 + 16 * i


def test_init_and_launch_like_gdev_nvc0_init_and_nvc0_launch(target):  # noqa: F811
    """nvc0_init runs through (no fault), then nvc0_launch of a memset kernel, a membar
    and nvc0_fence_write on COMPUTE: the buffer is set, the 16-byte query written."""
    rig, drv = target.rig, target.drv
    assert target.run(list(nvc0_init())), target.faults()
    drv.vram_write(rig.code, kernel_object(regs.KERNEL_MEMSET))
    dst = rig.sys_va(1)
    qva, qaddr = _query(target, 0)
    target.ram.write(qaddr, np.full(4, 0xEEEEEEEE, dtype=np.uint32))
    words = nvc0_launch(rig.va(3), rig.va(3) + 0x1000, [dst & 0xFFFFFFFF, dst >> 32,
                                                          0x5A5A5A5A, 64]) \
        + nvc0_membar() + nvc0_fence_write(COMPUTE, qva, 3)
    assert target.run(list(words)), target.faults()
    out = rig.sys_base + rig.pages * 4096
    assert (target.ram.read(out, 256).view(np.uint32) == 0x5A5A5A5A).all()
    seq, pad, lo, hi = target.ram.read(qaddr, 16).view(np.uint32).tolist()
    assert (seq, pad) == (3, 0) and (hi << 32 | lo) > 0
    assert target.faults() == []


def test_memcpy_like_gdev_nvc0_memcpy_m2mf(target):  # noqa: F811
    """nvc0_memcpy_m2mf of a page and a tail, fenced with nvc0_fence_write on M2MF (the
    last EXEC carries QUERY_SHORT|QUERY_YES: only the sequence word is written)."""
    rig = target.rig
    assert target.run(list(nvc0_init())), target.faults()
    data = np.random.default_rng(5).integers(0, 256, 0x1000, dtype=np.uint8)
    target.ram.write(rig.sys_base, data)
    qva, qaddr = _query(target, 1)
    target.ram.write(qaddr, np.full(4, 0xEEEEEEEE, dtype=np.uint32))
    words = nvc0_fence_write(M2MF, qva, 8) + nvc0_memcpy_m2mf(rig.sys_va(1), rig.sys_va(0),
                                                              0x0C40)
    assert target.run(list(words)), target.faults()
    out = rig.sys_base + rig.pages * 4096
    assert np.array_equal(target.ram.read(out, 0x0C40), data[:0x0C40])
    assert target.ram.read(qaddr, 8).view(np.uint32).tolist() == [8, 0xEEEEEEEE]


def test_notify_like_gdev_nvc0_notify_intr(target):  # noqa: F811
    """The notifier is written {time, 0, status 0} and PGRAPH raises NOTIFY (0x400100
    bit 0, PMC bit 12, the VM's MSI); nvkm's gf100_gr_intr acks it by writing bit 0
    back.  Another VM sees none of it."""
    rig, drv = target.rig, target.drv
    assert target.run(list(nvc0_init())), target.faults()
    nva, naddr = _query(target, 2)
    target.ram.write(naddr, np.full(4, 0xFFFFFFFF, dtype=np.uint32))
    if target.irq_fd is not None:
        target.interrupts()
    drv.push(rig.ch, list(nvc0_notify_intr(nva, 7)))
    deadline = time.monotonic() + 10
    while target.ram.read_u32(naddr + 12) != 0:
        assert time.monotonic() < deadline, target.faults()
        time.sleep(0.001)
    lo, hi, info, status = target.ram.read(naddr, 16).view(np.uint32).tolist()
    assert (hi << 32 | lo) > 0 and (info, status) == (0, 0)
    assert drv.rd(regs.PGRAPH_INTR) & 1 and drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PGRAPH
    if target.irq_fd is not None:
        deadline = time.monotonic() + 5
        while not target.interrupts():
            assert time.monotonic() < deadline, "no MSI reached the VM"
            time.sleep(0.001)
        assert target.other.drv.rd(regs.PGRAPH_INTR) == 0
        assert not target.other.drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PGRAPH
    drv.wr(regs.PGRAPH_INTR, 0x00000001)
    assert not drv.rd(regs.PGRAPH_INTR) & 1
    assert not drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PGRAPH
