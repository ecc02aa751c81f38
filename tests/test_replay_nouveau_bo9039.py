"""nouveau_bo9039.c replayed: nvc0_bo_move_init binding M2MF (0x9039, engine 0) and
nvc0_bo_move_m2mf moving pages with LAUNCH_DMA 0x100110."""

from __future__ import annotations

import numpy as np

from replay_rigs import target  # noqa: F401  (fixture)
from test_replay_nouveau_bo90b5 import NV_SUB_COPY, PAGE_SIZE, PUSH_NVSQ, nvc0_bo_move_init

# cl9039.h LAUNCH_DMA: SRC_INLINE FALSE, SRC/DST_MEMORY_LAYOUT PITCH (bits 4, 8),
# COMPLETION_TYPE FLUSH_DISABLE, INTERRUPT_TYPE NONE, SEMAPHORE_STRUCT_SIZE ONE_WORD (20)
LAUNCH_DMA = 0x00100110


def nvc0_bo_move_m2mf(src_offset: int, dst_offset: int, page_count: int) -> list[int]:
    words: list[int] = []
    while page_count:
        line_count = min(page_count, 2047)
        words += PUSH_NVSQ(NV_SUB_COPY, 0x0238, dst_offset >> 32, 0x023C, dst_offset & 0xFFFFFFFF)
        words += PUSH_NVSQ(NV_SUB_COPY, 0x030C, src_offset >> 32, 0x0310, src_offset & 0xFFFFFFFF,
                           0x0314, PAGE_SIZE, 0x0318, PAGE_SIZE, 0x031C, PAGE_SIZE,
                           0x0320, line_count)
        words += PUSH_NVSQ(NV_SUB_COPY, 0x0300, LAUNCH_DMA)
        page_count -= line_count
        src_offset += PAGE_SIZE * line_count
        dst_offset += PAGE_SIZE * line_count
    return words


def test_move_like_nvc0_bo_move_m2mf(target):  # noqa: F811
    """The M2MF path nouveau falls back to: the page arrives; the graph engine did it."""
    rig = target.rig
    data = np.random.default_rng(9).integers(0, 256, PAGE_SIZE, dtype=np.uint8)
    target.ram.write(rig.sys_base, data)
    busy = target.gpu.engines.graph.busy_ns
    words = nvc0_bo_move_init(0x9039 | 0 << 16) + nvc0_bo_move_m2mf(rig.sys_va(0), rig.va(1), 1) \
        + nvc0_bo_move_m2mf(rig.va(1), rig.sys_va(1), 1)
    assert target.run(words), target.faults()
    assert np.array_equal(target.ram.read(rig.sys_base + rig.pages * 4096, PAGE_SIZE), data)
    assert target.gpu.engines.graph.busy_ns > busy
