"""The engine classes a channel can bind: copy (0x90b5 on engine 0, 0x90b8 on engine 1),
compute (0x90c0), M2MF (0x9039).

A class object keeps its method state per bound object and turns a launch method into
(duration, completion) -- the channel then occupies the engine for that long and runs the
completion (query/semaphore write) when it is over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.channel_memory import ChannelMemory, RunningChannel
from gpuvm.device.faults import ChannelError
from gpuvm.device.kernels import parse_kernel_object

if TYPE_CHECKING:
    from gpuvm.device.profile import DeviceProfile

Completion = Callable[[int], None]  # called with the device time the work finished
Launch = tuple[int, Completion | None]


@dataclass
class BoundObject:
    """An object a channel bound to a subchannel (a class on an engine) and the method
    state the class accumulated, e.g. a copy's addresses before its launch."""
    cls: int
    engine_id: int
    state: dict[int, int] = field(default_factory=dict)


def _addr(state: dict[int, int], hi: int, lo: int) -> int:
    return layout.addr40(state.get(hi, 0), state.get(lo, 0))


def _release(mem: ChannelMemory, va: int, seq: int, long_form: bool, now: int) -> None:
    if long_form:
        mem.write(va, np.array([seq, 0, now & 0xFFFFFFFF, now >> 32], dtype=np.uint32).view(np.uint8))
    else:
        mem.write(va, np.array([seq], dtype=np.uint32).view(np.uint8))


class EngineClass:
    """One object class (M2MF, compute, copy) as the engines run it: the methods it knows
    and what a launch does.  A method the class lacks is the engine's ILLEGAL_MTHD, as on
    the card."""
    cls = 0
    engines: tuple[int, ...] = ()
    methods: frozenset[int] = frozenset()

    def __init__(self, profile: "DeviceProfile") -> None:
        self.profile = profile

    def method(self, ch: RunningChannel, obj: BoundObject, mem: ChannelMemory, method: int,
               value: int, now: int) -> Launch | None:
        if method not in self.methods:
            raise ChannelError(regs.CHAN_ERR_UNKNOWN_METHOD_EXT,
                               f"method {method:#x} of class {self.cls:#x}", method)
        obj.state[method] = value
        return self.on_method(ch, obj, mem, method, value, now)

    def on_method(self, ch: RunningChannel, obj: BoundObject, mem: ChannelMemory, method: int,
                  value: int, now: int) -> Launch | None:
        return None


def _copy_cost(profile: "DeviceProfile", nbytes: int, sysram: bool) -> int:
    rate = profile.copy.pcie_bytes_per_s if sysram else profile.copy.vram_bytes_per_s
    return int(profile.copy.launch_ns + 1e9 * nbytes / rate)


def _pitched_copy(mem: ChannelMemory, src: int, dst: int, line: int, lines: int,
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
    """The copy engine as nouveau's firmware (nvkm/engine/ce/fuc/com.fuc) runs it.

    Method values are checked against the firmware's field widths when they arrive (a
    wider value is its INVALID_BITFIELD).  EXEC (COPY_LAUNCH) takes FORMAT, SRC_LINEAR,
    DST_LINEAR, QUERY and QUERY_SHORT; the line count (YCNT) is always used, and XCNT
    counts bytes unless FORMAT asks for components.  Tiled surfaces are not modelled: a
    launch without both LINEAR bits stops the channel as such.
    """

    cls = regs.CLASS_COPY
    engines = (regs.ENGINE_PCOPY0,)
    widths = {regs.COPY_SRC_HI: 0xFF, regs.COPY_SRC_LO: 0xFFFFFFFF, regs.COPY_DST_HI: 0xFF,
              regs.COPY_DST_LO: 0xFFFFFFFF, regs.COPY_PITCH_IN: regs.COPY_PITCH_MASK,
              regs.COPY_PITCH_OUT: regs.COPY_PITCH_MASK, regs.COPY_LINE_BYTES: regs.COPY_XCNT_MASK,
              regs.COPY_LINE_COUNT: regs.COPY_YCNT_MASK, regs.COPY_FORMAT: regs.COPY_FORMAT_MASK,
              regs.COPY_SWZ_CONST0: 0xFFFFFFFF, regs.COPY_SWZ_CONST1: 0xFFFFFFFF,
              regs.COPY_QUERY_ADDR_HI: 0xFF, regs.COPY_QUERY_ADDR_LO: 0xFFFFFFFF,
              regs.COPY_QUERY_SEQUENCE: 0xFFFFFFFF, regs.COPY_LAUNCH: 0xFFFFFFFF,
              regs.COPY_WRCACHE_FLUSH: 0xFFFFFFFF}
    methods = frozenset(widths)

    def on_method(self, ch, obj, mem, method, value, now):
        if value & ~self.widths[method]:
            raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT,
                               f"copy method {method:#x} value {value:#x} has bits outside "
                               f"{self.widths[method]:#x} (INVALID_BITFIELD)", value)
        if method != regs.COPY_LAUNCH:
            return None
        if not (value & regs.COPY_LAUNCH_SRC_LINEAR and value & regs.COPY_LAUNCH_DST_LINEAR):
            raise ChannelError(regs.CHAN_ERR_UNSUPPORTED_EXT,
                               f"copy launch {value:#x}: tiled surfaces", value)
        s = obj.state
        xcnt, lines = s.get(regs.COPY_LINE_BYTES, 0), s.get(regs.COPY_LINE_COUNT, 0)
        src = _addr(s, regs.COPY_SRC_HI, regs.COPY_SRC_LO)
        dst = _addr(s, regs.COPY_DST_HI, regs.COPY_DST_LO)
        pitch_in, pitch_out = s.get(regs.COPY_PITCH_IN, 0), s.get(regs.COPY_PITCH_OUT, 0)
        total, sysram = 0, False
        if xcnt and lines:
            if value & regs.COPY_LAUNCH_FORMAT:
                total, sysram = _remap_copy(mem, s, src, dst, xcnt, lines, pitch_in, pitch_out)
            else:
                total = xcnt * lines
                sysram = _pitched_copy(mem, src, dst, xcnt, lines, pitch_in, pitch_out)
        ch.count("copy.launches")
        ch.count("copy.bytes", total)
        done = None
        if value & regs.COPY_LAUNCH_QUERY:
            va = _addr(s, regs.COPY_QUERY_ADDR_HI, regs.COPY_QUERY_ADDR_LO)
            seq = s.get(regs.COPY_QUERY_SEQUENCE, 0)
            long_form = not value & regs.COPY_LAUNCH_QUERY_SHORT
            done = lambda t: _release(mem, va, seq, long_form, t)  # noqa: E731
        return _copy_cost(self.profile, total, sysram), done


class Copy1Class(CopyClass):
    """Copy engine 1's class, 0x90b8: the same firmware and methods as 0x90b5 (nouveau's
    nouveau_bo_move_init binds it as "COPY1" on engine 5 and moves buffers with
    nvc0_bo_move_copy either way).  Each GF100 copy engine serves only its own class."""

    cls = regs.CLASS_COPY1
    engines = (regs.ENGINE_PCOPY1,)


def _remap_copy(mem: ChannelMemory, s: dict[int, int], src: int, dst: int, xcnt: int,
                lines: int, pitch_in: int, pitch_out: int) -> tuple[int, bool]:
    """A FORMAT copy: each destination component is a source component, a constant, or
    left alone (selector 6 and up), per the 4-bit selectors of COPY_FORMAT."""
    fmt = s.get(regs.COPY_FORMAT, 0)
    size = ((fmt >> 16) & 3) + 1
    n_src, n_dst = ((fmt >> 20) & 3) + 1, ((fmt >> 24) & 3) + 1
    line_in, line_out = xcnt * size * n_src, xcnt * size * n_dst
    if lines > 1 and (pitch_in < line_in or pitch_out < line_out):
        raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, "pitch smaller than the line", pitch_in)
    span_in = pitch_in * (lines - 1) + line_in
    span_out = pitch_out * (lines - 1) + line_out
    data, s_sys = mem.read_flagged(src, span_in)
    out, d_sys = mem.read_flagged(dst, span_out)
    src_el = np.lib.stride_tricks.as_strided(data, (lines, xcnt, n_src, size),
                                             (pitch_in, n_src * size, size, 1))
    dst_el = np.lib.stride_tricks.as_strided(out, (lines, xcnt, n_dst, size),
                                             (pitch_out, n_dst * size, size, 1))
    consts = {regs.COPY_SWZ_CONST0_SEL: s.get(regs.COPY_SWZ_CONST0, 0),
              regs.COPY_SWZ_CONST1_SEL: s.get(regs.COPY_SWZ_CONST1, 0)}
    for comp in range(n_dst):
        sel = (fmt >> (4 * comp)) & 0xF
        if sel < 4:
            if sel >= n_src:
                raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT,
                                   f"FORMAT selects source component {sel} of {n_src}", fmt)
            dst_el[:, :, comp, :] = src_el[:, :, sel, :]
        elif sel in consts:
            dst_el[:, :, comp, :] = np.frombuffer(
                (consts[sel] & ((1 << (8 * size)) - 1)).to_bytes(size, "little"), np.uint8)
    mem.write(dst, out)
    return line_out * lines, s_sys or d_sys


class M2mfClass(EngineClass):
    """Memory-to-memory format 0x9039 (envytools rnndb/graph/gf100_m2mf.xml), the way
    Gdev's nvc0_memcpy_m2mf drives it: pitched lines, EXEC with the LINEAR bits, and a
    query written when the copy is done (QUERY = 2; QUERY_SHORT: the sequence only)."""

    cls = regs.CLASS_M2MF
    engines = (regs.ENGINE_PGRAPH,)
    methods = frozenset({regs.M2MF_EXEC, regs.M2MF_OUT_HI, regs.M2MF_OUT_LO, regs.M2MF_IN_HI,
                         regs.M2MF_IN_LO, regs.M2MF_PITCH_IN, regs.M2MF_PITCH_OUT,
                         regs.M2MF_LINE_LENGTH, regs.M2MF_LINE_COUNT, regs.M2MF_QUERY_ADDR_HI,
                         regs.M2MF_QUERY_ADDR_LO, regs.M2MF_QUERY_SEQUENCE})

    def on_method(self, ch, obj, mem, method, value, now):
        if method != regs.M2MF_EXEC:
            return None
        if value & regs.M2MF_EXEC_PUSH or not (value & regs.M2MF_EXEC_LINEAR_IN and
                                                value & regs.M2MF_EXEC_LINEAR_OUT):
            raise ChannelError(regs.CHAN_ERR_UNSUPPORTED_EXT,
                               f"m2mf exec {value:#x}: pushed data or block-linear layout",
                               value)
        s = obj.state
        line, lines = s.get(regs.M2MF_LINE_LENGTH, 0), s.get(regs.M2MF_LINE_COUNT, 0)
        total = line * lines
        if total > regs.COPY_MAX_BYTES:
            raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, f"m2mf of {total} bytes", total)
        sysram = False
        if total:
            sysram = _pitched_copy(mem, _addr(s, regs.M2MF_IN_HI, regs.M2MF_IN_LO),
                                   _addr(s, regs.M2MF_OUT_HI, regs.M2MF_OUT_LO), line, lines,
                                   s.get(regs.M2MF_PITCH_IN, 0), s.get(regs.M2MF_PITCH_OUT, 0))
        ch.count("copy.bytes", total)
        done = None
        if (value >> regs.M2MF_EXEC_QUERY_SHIFT) & regs.M2MF_EXEC_QUERY_MASK == \
                regs.M2MF_EXEC_QUERY_YES:
            va = _addr(s, regs.M2MF_QUERY_ADDR_HI, regs.M2MF_QUERY_ADDR_LO)
            seq = s.get(regs.M2MF_QUERY_SEQUENCE, 0)
            long_form = not value & regs.M2MF_EXEC_QUERY_SHORT
            done = lambda t: _release(mem, va, seq, long_form, t)  # noqa: E731
        return _copy_cost(self.profile, total, sysram), done


class ComputeClass(EngineClass):
    """Compute 0x90c0 the way Gdev's nvc0_init and nvc0_launch drive it: the code
    address names a kernel object (standing in for SASS), the constant buffer carries the
    parameters, LAUNCH runs the library kernel; the setup methods for SASS (local and
    shared memory, registers, g[] windows, flushes) are accepted and kept.  A NOP with a
    notifier armed writes it and raises PGRAPH's NOTIFY interrupt for the channel."""

    cls = regs.CLASS_COMPUTE
    engines = (regs.ENGINE_PGRAPH,)
    methods = frozenset({regs.COMPUTE_GRID_XY, regs.COMPUTE_GRID_Z, regs.COMPUTE_LAUNCH,
                         regs.COMPUTE_BLOCK_XY, regs.COMPUTE_BLOCK_Z, regs.COMPUTE_CODE_OFFSET,
                         regs.COMPUTE_CODE_ADDR_HI, regs.COMPUTE_CODE_ADDR_LO,
                         regs.COMPUTE_CB_BIND, regs.COMPUTE_QUERY_ADDR_HI,
                         regs.COMPUTE_QUERY_ADDR_LO, regs.COMPUTE_QUERY_SEQUENCE,
                         regs.COMPUTE_QUERY_GET, regs.COMPUTE_CB_SIZE, regs.COMPUTE_CB_ADDR_HI,
                         regs.COMPUTE_CB_ADDR_LO, regs.COMPUTE_CB_POS, regs.COMPUTE_CB_DATA,
                         regs.COMPUTE_NOP, *regs.COMPUTE_SETUP_METHODS})

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
            if value & regs.QUERY_GET_INTR:
                mem.notify(ch)
        elif method == regs.COMPUTE_NOP and \
                s.get(regs.COMPUTE_NOTIFY_TYPE) == regs.COMPUTE_NOTIFY_WRITTEN_AND_AWAKEN:
            # the notifier Gdev's nvc0_notify_intr arms: written when the NOP gets here
            # (everything before it is done: the channel runs in order), then the interrupt
            s[regs.COMPUTE_NOTIFY_TYPE] = 0
            mem.write(_addr(s, regs.COMPUTE_NOTIFY_ADDR_HI, regs.COMPUTE_NOTIFY_ADDR_LO),
                      np.array([now & 0xFFFFFFFF, now >> 32, 0, 0], dtype=np.uint32))
            mem.notify(ch)
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
    return {c.cls: c(profile) for c in (CopyClass, Copy1Class, ComputeClass, M2mfClass)}
