"""nouveau_chan.c replayed: what nouveau pushes while it brings a channel up."""

from __future__ import annotations

from gpuvm.device import regs
from gpuvm.device.host_driver import HostDriver

from replay_rigs import target  # noqa: F401  (fixture)

NOUVEAU_DMA_SKIPS = 128 // 4  # nouveau_dma.h


def test_zero_words_like_nouveau_channel_init(target):  # noqa: F811
    """nouveau_channel_init: PUSH_DATA(push, 0x00000000) NOUVEAU_DMA_SKIPS times before
    the first command.  On GF100 a zero word is an old-form increasing command of no
    methods (envytools dma-pusher.rst), so the channel runs on: the fence after the
    padding lands and no fault is raised."""
    assert target.run([0x00000000] * NOUVEAU_DMA_SKIPS)
    assert target.faults() == []
    # padding between commands, as nouveau's jump spacing does, changes nothing either
    words = [0] * 3 + HostDriver.bind(1, regs.CLASS_COPY, regs.ENGINE_PCOPY0) + [0] * 5
    assert target.run(words)
    assert target.faults() == []
