"""nouveau_bo90b5.c (with the binding nouveau_bo.c / nouveau_bo9039.c give it) replayed:
GF100 buffer moves on copy engine 1 (class 0x90b8) and copy engine 0 (0x90b5)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import regs

from replay_rigs import target  # noqa: F401  (fixture)

NV_SUB_COPY = 4  # nouveau_dma.h NvSubCopy
PAGE_SIZE = 4096


def PUSH_NVSQ(subc: int, *pairs: int) -> list[int]:
    """nvif/push.h PUSH_NVSQ with consecutive methods: one increasing header."""
    mthd, values = pairs[0], list(pairs[1::2])
    assert list(pairs[0::2]) == [mthd + 4 * i for i in range(len(values))]
    return [0x20000000 | (len(values) << 16) | (subc << 13) | (mthd >> 2), *values]


def PUSH_NVIM(subc: int, mthd: int, data: int) -> list[int]:
    """nvif/push.h PUSH_NVIM: an inline (immediate) method."""
    return [0x80000000 | (data << 16) | (subc << 13) | (mthd >> 2)]


def nvc0_bo_move_init(handle: int) -> list[int]:
    """nouveau_bo9039.c nvc0_bo_move_init: SET_OBJECT (0x0000) = the handle
    nouveau_bo_move_init built as oclass | engine << 16."""
    return PUSH_NVSQ(NV_SUB_COPY, 0x0000, handle)


def nvc0_bo_move_copy(src_offset: int, dst_offset: int, page_count: int) -> list[int]:
    words: list[int] = []
    while page_count:
        line_count = min(page_count, 8191)
        words += PUSH_NVSQ(NV_SUB_COPY, 0x030C, src_offset >> 32, 0x0310, src_offset & 0xFFFFFFFF,
                           0x0314, dst_offset >> 32, 0x0318, dst_offset & 0xFFFFFFFF,
                           0x031C, PAGE_SIZE, 0x0320, PAGE_SIZE, 0x0324, PAGE_SIZE,
                           0x0328, line_count)
        words += PUSH_NVIM(NV_SUB_COPY, 0x0300, 0x0110)
        page_count -= line_count
        src_offset += PAGE_SIZE * line_count
        dst_offset += PAGE_SIZE * line_count
    return words


@pytest.mark.parametrize("name,engine,oclass", [("COPY1", 5, 0x90B8), ("COPY0", 4, 0x90B5)])
def test_move_like_nvc0_bo_move_copy_on_copy1_and_copy0(target, name, engine,  # noqa: F811
                                                        oclass):
    """nouveau_bo_move_init tries "COPY1" (engine 5, class 0x90b8) before "COPY0"
    (engine 4, 0x90b5) on GF100; either moves the pages nvc0_bo_move_copy names."""
    rig = target.rig
    data = np.random.default_rng(engine).integers(0, 256, PAGE_SIZE, dtype=np.uint8)
    target.ram.write(rig.sys_base, data)
    engine_obj = target.gpu.engines.copy1 if engine == 5 else target.gpu.engines.copy0
    busy = engine_obj.busy_ns
    words = nvc0_bo_move_init(oclass | engine << 16) + nvc0_bo_move_copy(rig.sys_va(0),
                                                                         rig.sys_va(1), 1)
    assert target.run(words), target.faults()
    out = rig.sys_base + rig.pages * 4096
    assert np.array_equal(target.ram.read(out, PAGE_SIZE), data)
    assert engine_obj.busy_ns > busy  # the named engine did the work


@pytest.mark.parametrize("engine,oclass", [(4, 0x90B8), (5, 0x90B5), (0, 0x90B8)])
def test_class_on_the_wrong_engine_is_refused(target, engine, oclass):  # noqa: F811
    """Each GF100 copy engine has its own class (nvkm gf100 ce0 0x90b5, ce1 0x90b8):
    naming the other engine is an unknown class for the engine named -- a fault of
    this channel only."""
    assert not target.run(nvc0_bo_move_init(oclass | engine << 16))
    assert target.faults()[-1].code == regs.CHAN_ERR_UNKNOWN_CLASS_EXT
    if target.other is not None:
        assert target.other.vgpu.faults() == []
