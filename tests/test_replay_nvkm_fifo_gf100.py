"""nvkm/engine/fifo/gf100.c replayed: gf100_fifo_intr and the handlers it calls read and
acknowledge PFIFO's interrupt registers exactly as nouveau does, and find the channel
that caused each interrupt; after one pass nothing enabled is left pending (no
interrupt storm).  A method the PBDMA will not pass on is recorded and skipped, and the
channel goes on."""

from __future__ import annotations

from gpuvm.device import regs
from gpuvm.device.host_driver import HostDriver

from replay_rigs import target  # noqa: F401  (fixture)
from test_replay_nvc0_fence import gf100_fifo_init_intr, gf100_fifo_intr_engine


def _ffs(mask: int) -> int:
    return (mask & -mask).bit_length() - 1


def gf100_fifo_intr_pbdma(drv, unit: int, log: list) -> None:
    stat = drv.rd(0x040108 + unit * 0x2000)
    addr = drv.rd(0x0400C0 + unit * 0x2000)
    data = drv.rd(0x0400C4 + unit * 0x2000)
    chid = drv.rd(0x040120 + unit * 0x2000) & 0x7F
    subc = (addr & 0x00070000) >> 16
    mthd = addr & 0x00003FFC
    log.append(("pbdma", unit, stat, chid, subc, mthd, data))
    drv.wr(0x0400C0 + unit * 0x2000, 0x80600008)
    drv.wr(0x040108 + unit * 0x2000, stat)


def gf100_fifo_intr_fault(drv, unit: int, log: list) -> None:
    inst, valo, vahi, kind = (drv.rd(0x002800 + unit * 0x10 + 4 * i) for i in range(4))
    log.append(("fault", unit, (vahi << 32) | valo, kind & 0xF, (kind >> 7) & 1,
                (kind >> 8) & 0x1F, (kind >> 6) & 1))


def gf100_fifo_intr(drv) -> list:
    """One pass of nvkm's handler; returns what it found."""
    log: list = []
    mask = drv.rd(0x002140)
    stat = drv.rd(0x002100) & mask
    for bit, status in ((0x00000001, 0x00252C), (0x00000100, 0x00254C),
                        (0x00010000, 0x00256C), (0x01000000, 0x00258C)):
        if stat & bit:
            log.append(("intr", bit, drv.rd(status)))
            drv.wr(0x002100, bit)
            stat &= ~bit
    if stat & 0x10000000:
        units = drv.rd(0x00259C)
        while units:
            unit = _ffs(units)
            gf100_fifo_intr_fault(drv, unit, log)
            drv.wr(0x00259C, 1 << unit)
            units &= ~(1 << unit)
        stat &= ~0x10000000
    if stat & 0x20000000:
        units = drv.rd(0x0025A0)
        while units:
            unit = _ffs(units)
            gf100_fifo_intr_pbdma(drv, unit, log)
            drv.wr(0x0025A0, 1 << unit)
            units &= ~(1 << unit)
        stat &= ~0x20000000
    if stat & 0x40000000:  # gf100_fifo_intr_runlist
        intr = drv.rd(0x002A00)
        if intr & 0x10000000:
            drv.wr(0x002A00, 0x10000000)
            intr &= ~0x10000000
        if intr:
            drv.wr(0x002A00, intr)
        log.append(("runlist",))
        stat &= ~0x40000000
    if stat & 0x80000000:
        log += [("engine", u) for u in gf100_fifo_intr_engine(drv)]
        stat &= ~0x80000000
    if stat:
        log.append(("unknown", stat))
        drv.wr(0x002140, drv.rd(0x002140) & ~stat)
        drv.wr(0x002100, stat)
    return log


def _quiet(drv) -> bool:
    return not drv.rd(0x002100) & drv.rd(0x002140) and \
        not drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PFIFO


def test_illegal_method_like_gf100_fifo_intr_pbdma(target):  # noqa: F811
    """A host method that does not exist (0x40) is ILLEGAL_MTHD (0x00200000): PBDMA 0
    names the channel, subchannel, method and data; the channel skips it and the fence
    after it lands; the handler's acks leave nothing pending."""
    drv = target.drv
    gf100_fifo_init_intr(drv)
    assert target.run([0x20000000 | 1 << 16 | 3 << 13 | 0x40 >> 2, 0xCAFE]), target.faults()
    assert drv.rd(regs.PFIFO_INTR) & 0x20000000
    assert drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PFIFO
    log = gf100_fifo_intr(drv)
    assert ("pbdma", 0, 0x00200000, 0, 3, 0x40, 0xCAFE) in log
    assert _quiet(drv)
    assert target.faults() == []  # a skipped method stops nothing
    if target.other is not None:  # the other VM sees none of it
        assert gf100_fifo_intr(target.other.drv) == []


def test_empty_subchannel_like_gf100_fifo_intr_pbdma(target):  # noqa: F811
    """An engine method on a subchannel with no object is EMPTY_SUBC (0x00800000), which
    nvkm offers to its software methods and then lets the channel go on."""
    drv = target.drv
    gf100_fifo_init_intr(drv)
    assert target.run([0x20000000 | 1 << 16 | 6 << 13 | 0x500 >> 2, 77]), target.faults()
    log = gf100_fifo_intr(drv)
    assert ("pbdma", 0, 0x00800000, 0, 6, 0x500, 77) in log
    assert _quiet(drv)


def test_vm_fault_like_gf100_fifo_intr_fault(target):  # noqa: F811
    """A copy from an unmapped VA: 0x2100 bit 28 while 0x259c names unit 0x15 (PCOPY0);
    gf100_fifo_intr_fault decodes the record (read, PAGE/PDE not present, hub client
    PCOPY0) and the ack of 0x259c alone clears bit 28 -- nvkm never writes it in 0x2100.
    """
    drv, rig = target.drv, target.rig
    gf100_fifo_init_intr(drv)
    words = HostDriver.bind(1, regs.CLASS_COPY, regs.ENGINE_PCOPY0) + \
        HostDriver.copy(1, 0x7000000, rig.sys_va(0), 4)
    assert not target.run(words)
    log = gf100_fifo_intr(drv)
    faults = [e for e in log if e[0] == "fault"]
    assert faults == [("fault", 0x15, 0x7000000, regs.FAULT_PDE_NOT_PRESENT, 0,
                       regs.FAULT_HUBCLIENT_PCOPY0, 1)]
    assert _quiet(drv)
    if target.other is not None:
        assert gf100_fifo_intr(target.other.drv) == []
        assert target.other.copy(target.other.rig.va(0), target.other.rig.sys_va(0), 4)


def test_stopped_channel_like_gf100_fifo_intr_pbdma(target):  # noqa: F811
    """A zero-length IB entry stops the channel (IB_EMPTY); the PBDMA shows it as the bit
    nvkm saw 'with null ib push' (0x00008000) for that channel, and the acks clear it."""
    drv, ch = target.drv, target.rig.ch
    gf100_fifo_init_intr(drv)
    entry = ch.ring + ch.put * regs.GPFIFO_ENTRY_SIZE
    drv.vram_wr32(entry, ch.pushbuf_va)
    drv.vram_wr32(entry + 4, 0)
    ch.put += 1
    drv.doorbell(ch)
    assert target.wait(lambda: bool(target.faults()), 10)
    log = gf100_fifo_intr(drv)
    assert [e[:4] for e in log if e[0] == "pbdma"] == [("pbdma", 0, 0x00008000, 0)]
    assert _quiet(drv)


def test_init_like_gf100_fifo_oneinit_and_init(target):  # noqa: F811
    """gf100_fifo_oneinit counts the PBDMAs by writing 0x2204 = ~0 and reading back (one
    here); gf100_fifo_init enables them, sets each up, enables PFIFO and the USERD area,
    acks and enables interrupts.  Every register it touches exists, and nothing is left
    pending."""
    drv = target.drv
    unimplemented = target.gpu.counters().get("mmio.unimplemented", 0)
    drv.wr(0x002204, 0xFFFFFFFF)
    pbdma_nr = bin(drv.rd(0x002204)).count("1")
    assert pbdma_nr == 1
    drv.wr(0x000204, (1 << pbdma_nr) - 1)
    drv.wr(0x002204, (1 << pbdma_nr) - 1)
    for i in range(pbdma_nr):
        drv.wr(0x04013C + i * 0x2000, drv.rd(0x04013C + i * 0x2000) & ~0x10000100)
        drv.wr(0x040108 + i * 0x2000, 0xFFFFFFFF)
        drv.wr(0x04010C + i * 0x2000, 0xFFFFFEFF)
    drv.wr(0x002200, drv.rd(0x002200) | 0x00000001)
    drv.wr(0x002254, 0x10000000 | drv.poll_va >> 12)
    drv.wr(0x002100, 0xFFFFFFFF)
    drv.wr(0x002140, 0x7FFFFFFF)
    drv.wr(0x002628, 0x00000001)
    assert target.gpu.counters().get("mmio.unimplemented", 0) == unimplemented
    assert drv.rd(0x04010C) == 0xFFFFFEFF and drv.rd(0x000204) == 1
    assert gf100_fifo_intr(drv) == [] and _quiet(drv)
    assert target.run([]), target.faults()  # the channel still runs
