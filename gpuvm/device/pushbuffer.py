"""Pushbuffer decoding: GF100 method headers into (subchannel, method, value) calls.

Decoding stops at the first malformed header; the calls before it still execute (the
hardware has already fetched them) and the error then stops the channel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuvm.device import regs
from gpuvm.device.faults import ChannelError


@dataclass(frozen=True)
class MethodCall:
    subc: int
    method: int  # byte offset of the method
    value: int


def decode(words: np.ndarray) -> tuple[list[MethodCall], ChannelError | None]:
    """All method calls in a pushbuffer segment, and the error that ended it early."""
    calls: list[MethodCall] = []
    data = words.tolist()
    i, n = 0, len(data)
    while i < n:
        header = data[i]
        kind = header >> regs.MTHD_TYPE_SHIFT
        count = (header >> regs.MTHD_COUNT_SHIFT) & regs.MTHD_COUNT_MASK
        subc = (header >> regs.MTHD_SUBC_SHIFT) & regs.MTHD_SUBC_MASK
        method = (header & regs.MTHD_ADDR_MASK) << 2
        i += 1
        if kind == regs.MTHD_TYPE_IMMD:
            calls.append(MethodCall(subc, method, count))
            continue
        if kind not in (regs.MTHD_TYPE_INC, regs.MTHD_TYPE_NONINC, regs.MTHD_TYPE_INC_ONCE):
            return calls, ChannelError(regs.CHAN_ERR_BAD_METHOD_HEADER_EXT,
                                       f"header {header:#010x} has type {kind}", header)
        if i + count > n:
            return calls, ChannelError(regs.CHAN_ERR_BAD_METHOD_HEADER_EXT,
                                       f"header {header:#010x} wants {count} words, "
                                       f"{n - i} remain", header)
        for k in range(count):
            if kind == regs.MTHD_TYPE_INC:
                m = method + 4 * k
            elif kind == regs.MTHD_TYPE_INC_ONCE:
                m = method + (4 if k else 0)
            else:
                m = method
            calls.append(MethodCall(subc, m, data[i + k]))
        i += count
    return calls, None
