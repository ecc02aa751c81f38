"""The engine classes a channel can bind: copy (0x90b5), compute (0x90c0), M2MF (0x9039).

A class object keeps its method state per bound object and turns a launch method into
(duration, completion) -- the channel then occupies the engine for that long and runs the
completion (query/semaphore write) when it is over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from gpuvm.device import regs
from gpuvm.device.faults import ChannelError
from gpuvm.device.kernels import parse_kernel_object

if TYPE_CHECKING:
    from gpuvm.device.channel import Channel, ChannelMemory
    from gpuvm.device.profile import DeviceProfile

Completion = Callable[[int], None]  # called with the device time the work finished
Launch = tuple[int, Completion | None]


@dataclass
class BoundObject:
    cls: int
    engine_id: int
    state: dict[int, int] = field(default_factory=dict)


def _addr(state: dict[int, int], hi: int, lo: int) -> int:
    return ((state.get(hi, 0) & 0xFF) << 32) | state.get(lo, 0)


def _release(mem: "ChannelMemory", va: int, seq: int, long_form: bool, now: int) -> None:
    if long_form:
        mem.write(va, np.array([seq, 0, now & 0xFFFFFFFF, now >> 32], dtype=np.uint32).view(np.uint8))
    else:
        mem.write(va, np.array([seq], dtype=np.uint32).view(np.uint8))


class EngineClass:
    cls = 0
    engines: tuple[int, ...] = ()
    methods: frozenset[int] = frozenset()

    def __init__(self, profile: "DeviceProfile") -> None:
        self.profile = profile

    def method(self, ch: "Channel", obj: BoundObject, mem: "ChannelMemory", method: int,
               value: int, now: int) -> Launch | None:
        if method not in self.methods:
            raise ChannelError(regs.CHAN_ERR_UNKNOWN_METHOD_EXT,
                               f"method {method:#x} of class {self.cls:#x}", method)
        obj.state[method] = value
        return self.on_method(ch, obj, mem, method, value, now)

    def on_method(self, ch: "Channel", obj: BoundObject, mem: "ChannelMemory", method: int,
                  value: int, now: int) -> Launch | None:
        return None


def _copy_cost(profile: "DeviceProfile", nbytes: int, sysram: bool) -> int:
    rate = profile.copy.pcie_bytes_per_s if sysram else profile.copy.vram_bytes_per_s
    return int(profile.copy.launch_ns + 1e9 * nbytes / rate)


def _pitched_copy(mem: "ChannelMemory", src: int, dst: int, line: int, lines: int,
                  pitch_in: int, pitch_out: int) -> bool:
    """Copy `lines` lines of `line` bytes; returns whether either side touched sysram."""
    if lines == 1 or (pitch_in == line and pitch_out == line):
        data, s_sys = mem.read_flagged(src, line * lines)
        d_sys = mem.write(dst, data)
        return s_sys or d_sys
    if pitch_in < line or pitch_out < line:
        raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, "pitch smaller than the line", line)
    span_in = pitch_in * (lines - 1) + line
    span_out = pitch_out * (lines - 1) + line
    data, s_sys = mem.read_flagged(src, span_in)
    src_lines = np.lib.stride_tricks.as_strided(data, (lines, line), (pitch_in, 1))
    out, d_sys = mem.read_flagged(dst, span_out)
    np.lib.stride_tricks.as_strided(out, (lines, line), (pitch_out, 1))[:] = src_lines
    mem.write(dst, out)
    return s_sys or d_sys


class CopyClass(EngineClass):
    cls = regs.CLASS_COPY
    engines = (regs.ENGINE_PCOPY0, regs.ENGINE_PCOPY1)
    methods = frozenset({regs.COPY_LAUNCH, regs.COPY_SRC_HI, regs.COPY_SRC_LO, regs.COPY_DST_HI,
                         regs.COPY_DST_LO, regs.COPY_PITCH_IN, regs.COPY_PITCH_OUT,
                         regs.COPY_LINE_BYTES, regs.COPY_LINE_COUNT, regs.COPY_QUERY_ADDR_HI,
                         regs.COPY_QUERY_ADDR_LO, regs.COPY_QUERY_SEQUENCE})

    def on_method(self, ch, obj, mem, method, value, now):
        if method != regs.COPY_LAUNCH:
            return None
        s = obj.state
        line = s.get(regs.COPY_LINE_BYTES, 0)
        lines = s.get(regs.COPY_LINE_COUNT, 1) if value & regs.COPY_LAUNCH_MULTI_LINE else 1
        total = line * lines
        if total == 0 or total > regs.COPY_MAX_BYTES:
            raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, f"copy of {total} bytes", total)
        sysram = _pitched_copy(mem, _addr(s, regs.COPY_SRC_HI, regs.COPY_SRC_LO),
                               _addr(s, regs.COPY_DST_HI, regs.COPY_DST_LO), line, lines,
                               s.get(regs.COPY_PITCH_IN, line), s.get(regs.COPY_PITCH_OUT, line))
        ch.count("copy.launches")
        ch.count("copy.bytes", total)
        sem = (value >> regs.COPY_LAUNCH_SEM_SHIFT) & regs.COPY_LAUNCH_SEM_MASK
        done = None
        if sem != regs.COPY_LAUNCH_SEM_NONE:
            va = _addr(s, regs.COPY_QUERY_ADDR_HI, regs.COPY_QUERY_ADDR_LO)
            seq = s.get(regs.COPY_QUERY_SEQUENCE, 0)
            done = lambda t: _release(mem, va, seq, sem == regs.COPY_LAUNCH_SEM_LONG, t)  # noqa: E731
        return _copy_cost(self.profile, total, sysram), done


class M2mfClass(EngineClass):
    cls = regs.CLASS_M2MF
    engines = (regs.ENGINE_PGRAPH,)
    methods = frozenset({regs.M2MF_EXEC, regs.M2MF_OUT_HI, regs.M2MF_OUT_LO, regs.M2MF_IN_HI,
                         regs.M2MF_IN_LO, regs.M2MF_LINE_LENGTH, regs.M2MF_LINE_COUNT})

    def on_method(self, ch, obj, mem, method, value, now):
        if method != regs.M2MF_EXEC:
            return None
        s = obj.state
        line, lines = s.get(regs.M2MF_LINE_LENGTH, 0), s.get(regs.M2MF_LINE_COUNT, 1)
        total = line * lines
        if total == 0 or total > regs.COPY_MAX_BYTES:
            raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, f"m2mf of {total} bytes", total)
        sysram = _pitched_copy(mem, _addr(s, regs.M2MF_IN_HI, regs.M2MF_IN_LO),
                               _addr(s, regs.M2MF_OUT_HI, regs.M2MF_OUT_LO), total, 1, total, total)
        ch.count("copy.bytes", total)
        return _copy_cost(self.profile, total, sysram), None


class ComputeClass(EngineClass):
    cls = regs.CLASS_COMPUTE
    engines = (regs.ENGINE_PGRAPH,)
    methods = frozenset({regs.COMPUTE_GRID_XY, regs.COMPUTE_GRID_Z, regs.COMPUTE_LAUNCH,
                         regs.COMPUTE_BLOCK_XY, regs.COMPUTE_BLOCK_Z, regs.COMPUTE_CODE_OFFSET,
                         regs.COMPUTE_CODE_ADDR_HI, regs.COMPUTE_CODE_ADDR_LO,
                         regs.COMPUTE_CB_BIND, regs.COMPUTE_QUERY_ADDR_HI,
                         regs.COMPUTE_QUERY_ADDR_LO, regs.COMPUTE_QUERY_SEQUENCE,
                         regs.COMPUTE_QUERY_GET, regs.COMPUTE_CB_SIZE, regs.COMPUTE_CB_ADDR_HI,
                         regs.COMPUTE_CB_ADDR_LO, regs.COMPUTE_CB_POS, regs.COMPUTE_CB_DATA})

    def on_method(self, ch, obj, mem, method, value, now):
        s = obj.state
        if method == regs.COMPUTE_CB_DATA:
            pos = s.get(regs.COMPUTE_CB_POS, 0)
            size = min(s.get(regs.COMPUTE_CB_SIZE, 0), regs.CB_MAX_SIZE)
            if pos + 4 > size:
                raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT,
                                   f"constant buffer write at {pos} past size {size}", pos)
            mem.write(_addr(s, regs.COMPUTE_CB_ADDR_HI, regs.COMPUTE_CB_ADDR_LO) + pos,
                      np.array([value], dtype=np.uint32).view(np.uint8))
            s[regs.COMPUTE_CB_POS] = pos + 4
        elif method == regs.COMPUTE_QUERY_GET:
            va = _addr(s, regs.COMPUTE_QUERY_ADDR_HI, regs.COMPUTE_QUERY_ADDR_LO)
            _release(mem, va, s.get(regs.COMPUTE_QUERY_SEQUENCE, 0),
                     not value & regs.QUERY_GET_SHORT, now)
        elif method == regs.COMPUTE_LAUNCH:
            return self._launch(ch, s, mem)
        return None

    def _launch(self, ch, s, mem) -> Launch:
        code = _addr(s, regs.COMPUTE_CODE_ADDR_HI, regs.COMPUTE_CODE_ADDR_LO) + \
            s.get(regs.COMPUTE_CODE_OFFSET, 0)
        kernel = parse_kernel_object(mem.read(code, regs.KOBJ_HEADER_BYTES).tobytes())
        cb_size = s.get(regs.COMPUTE_CB_SIZE, 0)
        if cb_size < 4 * kernel.param_words:
            raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT,
                               f"constant buffer of {cb_size} bytes holds fewer than "
                               f"{kernel.param_words} parameter words", cb_size)
        params = mem.read(_addr(s, regs.COMPUTE_CB_ADDR_HI, regs.COMPUTE_CB_ADDR_LO),
                          4 * kernel.param_words).view(np.uint32).tolist()
        duration = kernel.run(mem, params, self.profile.compute)
        ch.count("compute.kernels")
        ch.count(f"compute.kernel.{kernel.name}")
        return duration, None


def engine_classes(profile: "DeviceProfile") -> dict[int, EngineClass]:
    return {c.cls: c(profile) for c in (CopyClass, ComputeClass, M2mfClass)}
