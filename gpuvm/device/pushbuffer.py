"""Pushbuffer decoding: GF100 commands into (subchannel, method, value) calls.

Every command form a GF100 DMA pusher decodes (envytools docs/hw/fifo/dma-pusher.rst,
"GF100 commands") is taken: increasing, non-increasing and increase-once methods in the
new form, the old (pre-GF100) increasing and non-increasing forms -- a zero word is an
old increasing command of no methods, the no-op nouveau and Gdev pad with -- the inline
(immediate) method, and the SLI commands, which on this single-GPU model with SLI off
gate nothing.  What the hardware has no command for (type 6 and 7, type 2 with bits
16-17 set) is refused.

The pusher's method state lives in the channel, not in one segment: a command whose
data words run past the end of its GPFIFO entry takes them from the next entry, as the
hardware's dma_state.mcnt does.  Decoding stops at the first invalid command; the calls
before it still execute (the hardware has already fetched them) and the error then
stops the channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuvm.device import regs
from gpuvm.device.faults import ChannelError


@dataclass(frozen=True)
class MethodCall:
    """One method a push buffer carries to an engine: subchannel, method offset and value."""

    subc: int
    method: int  # byte offset of the method
    value: int


@dataclass
class PushDecoder:
    """The DMA pusher's command state (dma_state): the method being fed, its subchannel,
    how many data words it still takes, and how the method moves from word to word."""

    method: int = 0
    subc: int = 0
    remaining: int = 0
    kind: int = regs.MTHD_TYPE_INC
    fed: int = 0  # data words this command has taken so far (increase-once)

    def reset(self) -> None:
        self.remaining = 0

    def decode(self, words: np.ndarray) -> tuple[list[MethodCall], ChannelError | None]:
        """The method calls in one pushbuffer segment, and the error that ended it early."""
        calls: list[MethodCall] = []
        data = words.tolist()
        i, n = 0, len(data)
        while i < n:
            if self.remaining:
                take = min(self.remaining, n - i)
                calls.extend(self._data(data[i:i + take]))
                i += take
                continue
            header = data[i]
            i += 1
            error = self._command(header, calls)
            if error is not None:
                return calls, error
        return calls, None

    def _data(self, values: list[int]) -> list[MethodCall]:
        out = []
        for v in values:
            if self.kind == regs.MTHD_TYPE_INC:
                m = self.method + 4 * self.fed
            elif self.kind == regs.MTHD_TYPE_INC_ONCE:
                m = self.method + (4 if self.fed else 0)
            else:
                m = self.method
            out.append(MethodCall(self.subc, m & 0x3FFC, v))
            self.fed += 1
        self.remaining -= len(values)
        return out

    def _start(self, kind: int, subc: int, method: int, count: int) -> None:
        self.kind, self.subc, self.method, self.remaining, self.fed = kind, subc, method, count, 0

    def _command(self, header: int, calls: list[MethodCall]) -> ChannelError | None:
        kind = header >> regs.MTHD_TYPE_SHIFT
        subc = (header >> regs.MTHD_SUBC_SHIFT) & regs.MTHD_SUBC_MASK
        tert = (header >> regs.MTHD_TERT_SHIFT) & regs.MTHD_TERT_MASK
        if kind in (regs.MTHD_TYPE_GRP0, regs.MTHD_TYPE_GRP2):
            if tert == regs.MTHD_TERT_OLD_METHODS:
                self._start(regs.MTHD_TYPE_INC if kind == regs.MTHD_TYPE_GRP0
                            else regs.MTHD_TYPE_NONINC, subc,
                            header & regs.MTHD_OLD_ADDR_MASK,
                            (header >> regs.MTHD_OLD_COUNT_SHIFT) & regs.MTHD_OLD_COUNT_MASK)
                return None
            if kind == regs.MTHD_TYPE_GRP0:
                return None  # SLI conditional / mask store: SLI is off on one GPU
            return ChannelError(regs.CHAN_ERR_BAD_METHOD_HEADER_EXT,
                                f"header {header:#010x}: type 2 with bits 16-17 = {tert}",
                                header)
        count = (header >> regs.MTHD_COUNT_SHIFT) & regs.MTHD_COUNT_MASK
        method = (header & regs.MTHD_ADDR_MASK) << 2
        if kind == regs.MTHD_TYPE_IMMD:
            calls.append(MethodCall(subc, method, count))
            return None
        if kind in (regs.MTHD_TYPE_INC, regs.MTHD_TYPE_NONINC, regs.MTHD_TYPE_INC_ONCE):
            self._start(kind, subc, method, count)
            return None
        return ChannelError(regs.CHAN_ERR_BAD_METHOD_HEADER_EXT,
                            f"header {header:#010x} has type {kind}", header)
