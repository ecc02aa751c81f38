"""What an engine class sees of the channel it runs for: its memory, through its page
table, and the channel itself (its counters, its id for an interrupt).

Apart from channel.py so the engine classes and the channel executor need not import
each other."""

from __future__ import annotations

from typing import Callable, Protocol

import numpy as np

from gpuvm.device import regs
from gpuvm.device.mmu import Mmu, Space


class RunningChannel(Protocol):
    """The channel an engine method runs for (gpuvm.device.channel.Channel)."""

    chid: int

    def count(self, name: str, n: int = 1) -> None: ...


class ChannelMemory:
    """A channel's view of GPU memory: every access translated through its page table.

    `unit` is the fault unit charged if a translation fails (the engine doing the access).
    """

    def __init__(self, mmu: Mmu, space: Space, notify: Callable[[RunningChannel], None]) -> None:
        self.mmu = mmu
        self.space = space
        self.notify = notify  # PGRAPH's NOTIFY interrupt, raised for a channel
        self.unit = regs.FAULT_UNIT_PFIFO

    def read_flagged(self, va: int, length: int) -> tuple[np.ndarray, bool]:
        pages = self.mmu.translate(self.space, va, length, write=False)
        return self.mmu.read(pages), bool((pages.targets != regs.TARGET_VRAM).any())

    def read(self, va: int, length: int) -> np.ndarray:
        return self.read_flagged(va, length)[0]

    def write(self, va: int, data: np.ndarray) -> bool:
        data = data.view(np.uint8).reshape(-1)
        pages = self.mmu.translate(self.space, va, data.size, write=True)
        self.mmu.write(pages, data)
        return bool((pages.targets != regs.TARGET_VRAM).any())

    def read_u32(self, va: int) -> int:
        return int(self.read(va, 4).view(np.uint32)[0])
