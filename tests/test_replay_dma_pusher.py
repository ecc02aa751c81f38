"""envytools docs/hw/fifo/dma-pusher.rst ("GF100 commands") and nouveau_dma.h's header
macros replayed: every command form a GF100 decodes, written the way nouveau's BEGIN_*
macros write them, and the forms the hardware has no command for."""

from __future__ import annotations

import numpy as np

from gpuvm.device import regs

from replay_rigs import target  # noqa: F401  (fixture)

SEM_HI, SEM_LO, SEM_SEQ, SEM_TRIG = 0x10, 0x14, 0x18, 0x1C
RELEASE_SHORT = regs.SEM_RELEASE | regs.SEM_SHORT


# nouveau_dma.h, literally (subchannel, method byte address, count)
def BEGIN_NV04(subc: int, mthd: int, size: int) -> int:
    return 0x00000000 | (size << 18) | (subc << 13) | mthd


def BEGIN_NI04(subc: int, mthd: int, size: int) -> int:
    return 0x40000000 | (size << 18) | (subc << 13) | mthd


def BEGIN_NVC0(subc: int, mthd: int, size: int) -> int:
    return 0x20000000 | (size << 16) | (subc << 13) | (mthd >> 2)


def BEGIN_NIC0(subc: int, mthd: int, size: int) -> int:
    return 0x60000000 | (size << 16) | (subc << 13) | (mthd >> 2)


def BEGIN_IMC0(subc: int, mthd: int, data: int) -> int:
    return 0x80000000 | (data << 16) | (subc << 13) | (mthd >> 2)


def BEGIN_1IC0(subc: int, mthd: int, size: int) -> int:  # increase-once (type 5)
    return 0xA0000000 | (size << 16) | (subc << 13) | (mthd >> 2)


def _slots(target, n: int) -> list[tuple[int, int]]:
    """n 16-byte semaphore slots in the rig's sysram: (GPU VA, guest-physical)."""
    rig = target.rig
    base_va, base = rig.sys_va(2), rig.sys_base + 2 * rig.pages * 4096
    target.ram.write(base, np.zeros(4 * n, dtype=np.uint32))
    return [(base_va + 16 * i, base + 16 * i) for i in range(n)]


def test_every_gf100_header_form_like_nouveau_dma_h(target):  # noqa: F811
    """BEGIN_NV04 (old increasing), BEGIN_NI04 (old non-increasing), BEGIN_NVC0 (new
    increasing), BEGIN_NIC0 (new non-increasing), BEGIN_IMC0 (inline) and the GF100
    increase-once form each deliver their methods: each releases its own semaphore."""
    s = _slots(target, 4)
    words = [BEGIN_NV04(0, SEM_HI, 4), s[0][0] >> 32, s[0][0] & 0xFFFFFFFF, 1, RELEASE_SHORT]
    words += [BEGIN_NVC0(0, SEM_HI, 2), s[1][0] >> 32, s[1][0] & 0xFFFFFFFF,
              BEGIN_NI04(0, SEM_SEQ, 3), 7, 8, 2,  # the last word sent wins
              BEGIN_NVC0(0, SEM_TRIG, 1), RELEASE_SHORT]
    words += [BEGIN_NVC0(0, SEM_HI, 1), s[2][0] >> 32,
              BEGIN_1IC0(0, SEM_LO, 3), s[2][0] & 0xFFFFFFFF, 9, 3,  # 0x14, 0x18, 0x18
              BEGIN_IMC0(0, SEM_TRIG, regs.SEM_RELEASE)]  # inline: long release
    words += [BEGIN_NVC0(0, SEM_HI, 2), s[3][0] >> 32, s[3][0] & 0xFFFFFFFF,
              BEGIN_NIC0(0, SEM_SEQ, 2), 5, 4, BEGIN_NVC0(0, SEM_TRIG, 1), RELEASE_SHORT]
    assert target.run(words), target.faults()
    got = [target.ram.read_u32(addr) for _, addr in s]
    assert got == [1, 2, 3, 4]
    assert target.ram.read_u32(s[2][1] + 12) | target.ram.read_u32(s[2][1] + 8)  # timestamp
    assert target.faults() == []


def test_sli_commands_gate_nothing_with_sli_off(target):  # noqa: F811
    """dma-pusher.rst: type 0 with bits 16-17 = 1, 2, 3 are the SLI conditional, user
    mask store and conditional-from-mask commands; on one GPU (SLI off) they are
    accepted and the methods after them run."""
    (va, addr), = _slots(target, 1)
    words = [0x00010000 | (0x001 << 4), 0x00020000 | (0x002 << 4), 0x00030000,
             BEGIN_NVC0(0, SEM_HI, 4), va >> 32, va & 0xFFFFFFFF, 6, RELEASE_SHORT]
    assert target.run(words), target.faults()
    assert target.ram.read_u32(addr) == 6


def test_method_data_continues_in_the_next_gpfifo_entry(target):  # noqa: F811
    """dma-pusher.rst: the pusher's method state (dma_state.mthd / mcnt) is not reset
    between IB entries, so a command's data words may come from the next entry."""
    (va, addr), = _slots(target, 1)
    drv, ch = target.drv, target.rig.ch
    drv.push(ch, [BEGIN_NVC0(0, SEM_HI, 4), va >> 32])  # three data words still owed
    assert target.run([va & 0xFFFFFFFF, 11, RELEASE_SHORT]), target.faults()
    assert target.ram.read_u32(addr) == 11


def test_forms_without_a_command_stop_only_that_channel(target):  # noqa: F811
    """dma-pusher.rst lists no command for types 6 and 7, nor for type 2 with bits 16-17
    set: the channel stops with a bad-header error (PBDMA interrupt), the fault is its
    VM's only, and a fresh channel of the same driver runs."""
    for header in (0xC0000000, 0xE0000000, 0x40010000):
        assert not target.run([header])
        fault = target.faults()[-1]
        assert fault.code == regs.CHAN_ERR_BAD_METHOD_HEADER_EXT
        assert target.drv.rd(regs.PFIFO_INTR) & regs.PFIFO_INTR_PBDMA
        target.drv.wr(regs.PFIFO_CHAN_TABLE, 0)
        target.rig.ch = target.drv.create_channel(0, target.rig.space, target.rig.ch.gpfifo_va)
        target.drv.submit_runlist([0])
    if target.other is not None:
        assert target.other.vgpu.faults() == []
        assert target.other.copy(target.other.rig.va(0), target.other.rig.sys_va(0), 4)


def test_random_words_fault_only_their_channel(target):  # noqa: F811
    """Whatever a pushbuffer holds, the device answers as hardware would -- a method run,
    skipped with a PBDMA record, or the channel stopped with a reason -- never with an
    internal error, and another VM's channel, faults and interrupt registers stay its
    own."""
    rng = np.random.default_rng(74)
    drv = target.drv
    for round_ in range(4):
        words = rng.integers(0, 1 << 32, 48, dtype=np.uint64).astype(np.uint32).tolist()
        for i in range(0, 48, 6):  # some headers of each form, among the noise
            words[i] = (int(rng.integers(0, 8)) << 29) | (int(rng.integers(0, 8)) << 16) | \
                (int(rng.integers(0, 8)) << 13) | int(rng.integers(0, 0x800))
        target.run(words, timeout=0.5)  # the fence may be eaten as data, or wait
        assert not any("internal error" in f.reason for f in target.faults()), target.faults()
        drv.wr(regs.PFIFO_CHAN_TABLE, 0)  # a fresh channel each round, as a driver would
        target.rig.ch = drv.create_channel(0, target.rig.space, target.rig.ch.gpfifo_va)
        drv.submit_runlist([0])
    if target.other is not None:
        other = target.other
        assert other.vgpu.faults() == []
        assert other.drv.rd(0x0025A0) == 0 and other.drv.rd(0x0025A8) == 0
        assert other.drv.rd(regs.PGRAPH_INTR) == 0
        assert other.copy(other.rig.va(0), other.rig.sys_va(0), 4)
