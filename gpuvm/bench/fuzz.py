"""`gpuvm bench fuzz`: hostile guest operation sequences against two vGPUs, the reference
monitor on.

Operations are driven straight into the vGPUs' VFIO interface (`read`/`write(region,
...)`, the hypercall port), in-process and without a guest binary, so a million of them
take minutes: MMIO to every trapped BAR0 register, page-table and RAMIN edits through
the PRAMIN window, TLB flushes, channel bind/unbind/rebind, doorbells, BAR1/BAR3
accesses, PV hypercalls (free included), copy and kernel launches (some that hang), and
removing a VM mid-run.  Each VM starts from a working channel set up as a driver would,
so the garbage lands on live state.  Every device access is judged by the reference
monitor (an escape), and after every operation the world checks what the monitor cannot
see (a violation): no BAR0 access reached the device at a guest's raw offset (the device
counted none it does not implement), a write of one VM's register is not read back by
the other, every bound channel on a VM's runlist is on the physical one, and a new VM's
slice is all zeros.  Any escape, violation or host-side exception is a failure, reported
with the operations that led to it (tests/test_fuzz.py lets hypothesis shrink such
sequences; tests/test_fuzz_planted.py shows each fault the project has had is caught).
"""

from __future__ import annotations

import argparse
import random
import time
import traceback
from dataclasses import dataclass, field

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.gpu import Gpu
from gpuvm.device.host_driver import HostChannel, HostDriver, method
from gpuvm.device.layout import pte
from gpuvm.device.kernels import kernel_object
from gpuvm.mediator import monitor, planted
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import PartitionSpec
from gpuvm.mediator.submission import WatchdogLimits
from gpuvm.mediator.vgpu import VGpu
from gpuvm.vfio import abi as vfio
from gpuvm.vfio.device import PostedStores
from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam

VRAM = 1024 * regs.MiB
SPEC = PartitionSpec(vram_size=64 * regs.MiB, channels=4, bar1_size=4 * regs.MiB,
                     bar3_size=2 * regs.MiB, shadow_size=8 * regs.MiB)
RAM = 4 * regs.MiB
VA_DATA, VA_SYS, VA_GPFIFO = 0x10000000, 0x20000000, 0x30000000
HCALL_GPA = 0x200000
SYS_GPA = 0x100000
KINDS = ("reg_write", "reg_read", "vram_write", "flush", "bind", "unbind", "state", "kick",
         "doorbell", "submit", "bar", "hypercall", "revive", "repoint", "remove_vm")
WEIGHTS = (15, 6, 20, 6, 4, 3, 3, 3, 6, 15, 8, 8, 4, 3, 0.02)
# BAR0 access sizes and misalignments a reg_read/reg_write draws (op.c % 8)
_SIZES = (4, 4, 4, 4, 1, 2, 8, 4)
_UNANSWERED = -1  # a hypercall record's status until the hypervisor writes one


@dataclass(frozen=True)
class Op:
    """One guest operation: `kind` on VM `vm` (0 or 1) with kind-specific arguments."""

    kind: str
    vm: int
    a: int = 0
    b: int = 0
    c: int = 0

    def __repr__(self) -> str:
        return f"Op({self.kind!r}, vm={self.vm}, a={self.a:#x}, b={self.b:#x}, c={self.c:#x})"


class _Port:
    """HostDriver's view of a vGPU (its mmio calls are the VFIO region accesses)."""

    def __init__(self, vgpu: VGpu) -> None:
        self.mmio_read = vgpu.read
        self.mmio_write = vgpu.write


@dataclass
class FuzzVm:
    """One VM: its vGPU, its RAM, and the driver state of a working channel."""

    vgpu: VGpu
    ram: GuestRam
    drv: HostDriver
    hot: list[int]  # guest VRAM pages worth corrupting: tables, RAMIN, USERD, GPFIFO
    channel: HostChannel
    keys: list[int] = field(default_factory=list)  # PV keys

    @property
    def pv(self) -> bool:
        return self.vgpu.mode.pv


def _tenant(med: Mediator, name: str, mode: str, violations: list[str]) -> FuzzVm:
    vgpu = med.add_vm(name, MODES[mode], SPEC)
    part = vgpu.part
    if med.gpu.vram.u8[part.vram_base:part.vram_base + part.vram_size].any():
        violations.append(f"{name}: its new slice holds what an earlier tenant left")
    ram = GuestRam(RAM)
    vgpu.dma_map(0, ram.array, vfio.VFIO_DMA_MAP_FLAG_READ | vfio.VFIO_DMA_MAP_FLAG_WRITE)
    drv = HostDriver(_Port(vgpu))
    drv.init()
    drv.setup_bar1(SPEC.bar1_size)
    space = drv.new_space()
    data = drv.alloc(16 * regs.SMALL_PAGE)
    code = drv.alloc(2 * regs.SMALL_PAGE)
    drv.vram_write(code, kernel_object(regs.KERNEL_LOOP))
    drv.map(space, VA_DATA, data, 16)
    drv.map(space, VA_DATA + 0x100000, code, 2)
    drv.map(space, VA_SYS, SYS_GPA, 16, target=regs.TARGET_SYSRAM)
    drv.flush(space)
    ch = drv.create_channel(0, space, VA_GPFIFO)
    drv.submit_runlist([0])
    hot = [space.pd, *space.pts.values(), ch.inst, ch.userd, ch.ring, drv.bar1_inst,
           drv.bar1_space.pd, *drv.bar1_space.pts.values(), data]
    return FuzzVm(vgpu, ram, drv, hot, ch)


class World:
    """A GPU, its mediator (monitor on), and two tenants: one fv-opt, one pv."""

    MODES = ("fv-opt", "pv")

    def __init__(self) -> None:
        monitor.enable()
        self.gpu = Gpu(time_scale=1e6, vram_size=VRAM).start()
        # hung work is cut off after 20 ms of wall time, not 2 s: the GPU is handed on, so
        # the other VM's work runs within a world's second too
        self.med = Mediator(self.gpu, watchdog=WatchdogLimits(wall_floor_s=0.02))
        self.generation = 0
        self.violations: list[str] = []  # what the checks found since last taken
        self.tenants = [_tenant(self.med, f"vm{i}", m, self.violations)
                        for i, m in enumerate(self.MODES)]
        # every offset the trap table names, less the channels far beyond both partitions
        v = self.tenants[0].vgpu
        far = {base + c * stride for c in range(2 * SPEC.channels, regs.NUM_CHANNELS)
               for base, stride in ((regs.PFIFO_CHAN_TABLE, regs.PFIFO_CHAN_STRIDE),
                                    (regs.PFIFO_CHAN_STATE, regs.PFIFO_CHAN_STRIDE),
                                    (regs.PFIFO_CHAN_ERROR_EXT,
                                     regs.PFIFO_CHAN_ERROR_STRIDE_EXT))}
        self.regs = sorted((set(v._r0) | set(v._w0)) - far)
        self._unimplemented = self.gpu.counts.total.get("mmio.unimplemented", 0)

    def close(self) -> None:
        self.med.close()
        self.gpu.release_memory()

    # ------------------------------------------------------------------ values
    def _address(self, t: FuzzVm, pick: int) -> int:
        """A guest VRAM address: mostly on a hot page, sometimes anywhere (or beyond)."""
        if pick % 8 == 7:
            return (pick >> 3) % (2 * SPEC.vram_size) & ~3
        page = t.hot[(pick >> 3) % len(t.hot)]
        return page + ((pick >> 8) % regs.SMALL_PAGE & ~3)

    def _value(self, t: FuzzVm, pick: int) -> int:
        """A word a hostile guest would write: an entry naming its own pages, another
        VM's, hypervisor VRAM, sysram in or out of its RAM, or noise."""
        kind = pick % 6
        frame = (pick >> 3) & 0xFFFFF000
        if kind == 0:
            return pte(frame % SPEC.vram_size)
        if kind == 1:
            return pte(frame)  # anywhere, mostly outside the slice
        if kind == 2:
            return pte(frame % (2 * RAM), regs.TARGET_SYSRAM)
        if kind == 3:
            pt = t.hot[(pick >> 3) % len(t.hot)]
            return layout.pde_small(pt)
        if kind == 4:
            return layout.ramin_ptr_lo(pick >> 3)  # a RAMIN-style pointer
        return (pick * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF

    # ------------------------------------------------------------------ operations
    def run(self, op: Op) -> None:
        t = self.tenants[op.vm % len(self.tenants)]
        v, drv = t.vgpu, t.drv
        kind = op.kind
        if kind == "reg_write":
            offset, size = self._reg(op)
            if size == 4 and not offset & 3:
                self._write_unseen(op.vm % len(self.tenants), offset, op.b & 0xFFFFFFFF)
            else:
                v.write(regs.BAR0, offset, size, op.b & ((1 << (8 * size)) - 1))
        elif kind == "reg_read":
            v.read(regs.BAR0, *self._reg(op))
        elif kind == "vram_write":
            addr = self._address(t, op.a)
            value = self._value(t, op.b)
            v.write(regs.BAR0, regs.PBUS_PRAMIN_BASE, 4, addr >> 16)
            off = regs.PRAMIN_WINDOW + (addr & 0xFFFF)
            v.write(regs.BAR0, off, 4, value & 0xFFFFFFFF)
            if op.c & 1 and (addr & 0xFFFF) + 8 <= 0x10000:
                v.write(regs.BAR0, off + 4, 4, value >> 32)
        elif kind == "flush":
            pd = t.hot[op.a % len(t.hot)] if op.b % 4 else op.a & 0xFFFFF000
            v.write(regs.BAR0, regs.PFFB_FLUSH_PD, 4, layout.flush_pd_word(pd))
            trig = regs.PFFB_TRIGGER_GO | (regs.PFFB_TRIGGER_ALL_PDS if op.c & 1 else 0)
            v.write(regs.BAR0, regs.PFFB_FLUSH_TRIGGER, 4,
                    regs.PFFB_TRIGGER_BAR_VM if op.c & 2 else trig)
        elif kind == "bind":
            inst = t.channel.inst if op.b % 3 else self._address(t, op.b) & ~0xFFF
            v.write(regs.BAR0, regs.PFIFO_CHAN_TABLE + (op.a % 6) * regs.PFIFO_CHAN_STRIDE, 4,
                    layout.chan_word(inst, op.c % 4 if op.c % 5 == 0 else regs.TARGET_VRAM))
        elif kind == "unbind":
            v.write(regs.BAR0, regs.PFIFO_CHAN_TABLE + (op.a % 6) * regs.PFIFO_CHAN_STRIDE, 4, 0)
        elif kind == "state":
            v.write(regs.BAR0, regs.PFIFO_CHAN_STATE + (op.a % 6) * regs.PFIFO_CHAN_STRIDE, 4,
                    op.b & 0xFFFFFFFF)
        elif kind == "kick":
            v.write(regs.BAR0, regs.PFIFO_KICK, 4, op.a % 8)
        elif kind == "doorbell":
            base = drv.poll_va + (op.a % 5) * regs.USERD_STRIDE
            v.write(regs.BAR1, base + regs.USERD_GP_PUT, 4, op.b % 600)
        elif kind == "submit":
            self._submit(t, op)
        elif kind == "bar":
            bar = regs.BAR1 if op.a & 1 else regs.BAR3
            size = (1, 2, 4, 8)[(op.a >> 1) % 4]
            offset = (op.b % (v.bar_sizes[bar] + 0x2000)) & ~(size - 1)
            mask = (1 << (8 * size)) - 1
            if op.c & 3 == 3:  # posted: a drain's run of stores in a row, handed at once
                v.write_many(PostedStores.of([(bar, offset + size * k, size,
                                               self._value(t, op.c + k) & mask)
                                              for k in range(1 + (op.c >> 2) % 64)]))
            elif op.c & 1:
                v.write(bar, offset, size, self._value(t, op.c) & mask)
            else:
                v.read(bar, offset, size)
        elif kind == "hypercall":
            self._hypercall(t, op)
        elif kind == "repoint":
            self._repoint(t, op)
        elif kind == "revive":
            self._revive(t, bool(op.a & 1))
        elif kind == "remove_vm":
            self.run_remove(op.vm % len(self.tenants))
        else:
            raise ValueError(f"unknown operation {kind!r}")
        self._check()

    def _revive(self, t: FuzzVm, resubmit: bool) -> None:
        """The driver rebinds its channel (afresh, at GP_GET 0), and may resubmit its
        runlist."""
        ch, drv = t.channel, t.drv
        drv.wr(regs.PFIFO_CHAN_TABLE, 0)
        drv.wr(regs.PFIFO_CHAN_TABLE, layout.chan_word(ch.inst))
        drv.wr(regs.PFIFO_CHAN_STATE, regs.PFIFO_CHAN_STATE_CREATE)
        ch.put = 0
        if resubmit:
            drv.submit_runlist([0])

    def _repoint(self, t: FuzzVm, op: Op) -> None:
        """The channel's RAMIN names another directory (its own, the BAR1 one, a PV key,
        any page), how a driver would move it (op.c % 4): plainly (0); restarted on its
        own directory, while it waits in a semaphore acquire it has fetched, with a spare
        channel bound to the same block before and dropped after, so what no bound
        channel names is freed (1; 3 the same, as it is); to its latest PV key, freed at
        once while bound, and rung (2)."""
        ch, drv = t.channel, t.drv
        dirs = [ch.space.pd, drv.bar1_space.pd, *t.keys, self._address(t, op.b) & ~0xFFF]
        pd = dirs[op.a % len(dirs)]
        how = op.c % 4
        spare = regs.PFIFO_CHAN_TABLE + (1 + (op.c >> 2) % (SPEC.channels - 1)) * \
            regs.PFIFO_CHAN_STRIDE
        if how == 1:
            drv.vram_wr32(ch.inst + regs.RAMIN_PD_LO, layout.ramin_ptr_lo(ch.space.pd))
            self._revive(t, False)
            drv.push(ch, method(0, regs.HOST_SEMAPHORE_ADDR_HI, 0, VA_SYS & 0xFFFFFFFF,
                                (op.b | 1 << 31) & 0xFFFFFFFF, regs.SEM_ACQUIRE_EQUAL))
            self._fetched(t)
        if how == 2 and t.keys:
            self._revive(t, False)
            pd = t.keys[-1]
        if how in (1, 3):
            drv.wr(spare, layout.chan_word(ch.inst))
        drv.vram_wr32(ch.inst + regs.RAMIN_PD_LO, layout.ramin_ptr_lo(pd))
        if how in (1, 3):
            drv.wr(spare, 0)
        if how == 2 and t.keys:
            self._hcall(t, abi.HC_FREE_PGD, pd)
            if self._hstatus(t) == abi.HC_OK:
                t.keys.remove(pd)
            drv.push(ch, HostDriver.release(VA_SYS, op.b & 0xFFFFFFFF))
            self._fetched(t)

    def _fetched(self, t: FuzzVm, wait_s: float = 0.04) -> None:
        """Wait (a little) until the device has fetched all the channel was given, as the
        guest sees it in its USERD GP_GET, or has stopped the channel with an error."""
        ch = t.channel
        get = t.drv.poll_va + ch.chid * regs.USERD_STRIDE + regs.USERD_GP_GET
        error = regs.PFIFO_CHAN_ERROR_EXT + ch.chid * regs.PFIFO_CHAN_ERROR_STRIDE_EXT
        deadline = time.monotonic() + wait_s
        while t.vgpu.read(regs.BAR1, get, 4) != ch.put and time.monotonic() < deadline \
                and not t.vgpu.read(regs.BAR0, error, 4):
            time.sleep(0.0002)

    def _reg(self, op: Op) -> tuple[int, int]:
        """(offset, size) of a BAR0 register access: mostly a 4-byte word, sometimes a
        byte, a half word, a quad word or a misaligned word."""
        size = _SIZES[op.c % len(_SIZES)]
        shift = (op.c >> 3) % 4 if op.c % len(_SIZES) >= 4 and size < 8 else 0
        return self.regs[op.a % len(self.regs)] + (shift & ~(size - 1)), size

    def _write_unseen(self, i: int, offset: int, value: int) -> None:
        """VM i writes a register; the other VM must not read the value back there
        unless it read it before (a register two VMs share is a channel between them)."""
        other = self.tenants[1 - i].vgpu
        before = other.read(regs.BAR0, offset, 4)
        self.tenants[i].vgpu.write(regs.BAR0, offset, 4, value)
        after = other.read(regs.BAR0, offset, 4)
        if after == value != before:
            self.violations.append(f"{other.name} reads at BAR0 {offset:#x} the value "
                                   f"{value:#x} {self.tenants[i].vgpu.name} wrote there")

    def _check(self) -> None:
        """What the reference monitor cannot judge, after every operation."""
        gpu = self.gpu
        unimplemented = gpu.counts.total.get("mmio.unimplemented", 0)
        if unimplemented != self._unimplemented:
            self.violations.append(f"the device counted {unimplemented - self._unimplemented}"
                                   f" BAR0 access(es) it does not implement: a guest's "
                                   f"access was forwarded at its raw offset")
            self._unimplemented = unimplemented
        on_runlist = set(gpu.pfifo.runlist)
        for t in self.tenants:
            chans = t.vgpu.table
            lost = [c for c in chans.runlist if chans.by_vchid[c].bound
                    and chans.by_vchid[c].pchid not in on_runlist]
            if lost:
                self.violations.append(f"{t.vgpu.name}: bound channel(s) {lost} of its "
                                       f"runlist are not on the physical runlist")

    def run_remove(self, i: int) -> None:
        """VM i leaves; a new VM takes its place (its partition, from a fresh driver)."""
        t = self.tenants[i]
        self.med.remove_vm(t.vgpu)
        t.ram.close()
        self.generation += 1
        self.tenants[i] = _tenant(self.med, f"vm{i}.{self.generation}", self.MODES[i],
                                  self.violations)

    def _submit(self, t: FuzzVm, op: Op) -> None:
        ch = t.channel
        which = (0, 0, 0, 1, 2, 3)[op.a % 6]
        src = VA_DATA + (op.b % 0x10000) if op.b & 1 else VA_SYS + (op.b % 0x10000)
        dst = VA_SYS + (op.c % 0x10000) if op.c % 4 else (op.c << 12) & 0xFFFFFFFFFF
        if which == 0:
            words = (HostDriver.bind(4, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
                     + HostDriver.copy(4, src & ~3, dst & ~3, 4 + (op.a >> 3) % 0x2000))
        elif which == 1:  # a loop kernel: short, or one that would never end
            iters = 1000 if op.b & 2 else 1 << 40
            p = [VA_DATA & 0xFFFFFFFF, 0, iters & 0xFFFFFFFF, iters >> 32]
            words = (HostDriver.bind(1, regs.CLASS_COMPUTE, regs.ENGINE_PGRAPH)
                     + HostDriver.launch(1, VA_DATA + 0x100000, VA_DATA + 0x101000, p))
        elif which == 2:  # a semaphore acquire nobody will satisfy, or a release
            words = method(0, regs.HOST_SEMAPHORE_ADDR_HI, 0, VA_SYS & 0xFFFFFFFF,
                           op.c & 0xFFFFFFFF, regs.SEM_ACQUIRE_EQUAL if op.c & 2
                           else regs.SEM_RELEASE)
        else:  # garbage methods
            words = [(op.b * 0x9E3779B1 + i * op.c) & 0xFFFFFFFF for i in range(1 + op.a % 8)]
        t.drv.push(ch, words)  # the ring wraps; the pushbuffer too

    def _hcall(self, t: FuzzVm, hc_op: int, key: int) -> None:
        """One hypercall without entries."""
        hc = abi.HcallHeader.from_buffer(t.ram.array[HCALL_GPA:HCALL_GPA +
                                                      abi.HCALL_HEADER_BYTES])
        hc.op, hc.count, hc.status, hc.args[0] = hc_op, 0, _UNANSWERED, key
        del hc
        t.vgpu.write(regs.BAR4, regs.BAR4_HYPERCALL, 4, HCALL_GPA)

    def _hypercall(self, t: FuzzVm, op: Op) -> None:
        ops = (abi.HC_SET_PGD, abi.HC_MAP_BATCH, abi.HC_UNMAP_BATCH, abi.HC_VM_FLUSH,
               abi.HC_FREE_PGD, 99)
        hc_op = ops[op.a % len(ops)]
        if op.b % 4 == 0 or not t.keys:
            key = self._address(t, op.b) & ~0xFFF
        else:
            key = t.keys[op.b % len(t.keys)]
        n = (op.c % 40) if hc_op in (abi.HC_MAP_BATCH, abi.HC_UNMAP_BATCH) else 0
        if op.c % 97 == 0:
            n = abi.HC_MAX_ENTRIES + 1
        view = t.ram.array[HCALL_GPA:HCALL_GPA + abi.HCALL_HEADER_BYTES + 16 * min(n, 64)]
        hc = abi.HcallHeader.from_buffer(view)
        hc.op, hc.count, hc.status, hc.args[0] = hc_op, n, _UNANSWERED, key
        entries = view[abi.HCALL_HEADER_BYTES:].view(np.uint64)
        for i in range(min(n, 64)):
            entries[2 * i] = ((op.c * (i + 1) * 0x1003) << 12) & ((1 << 40) - 1) \
                if i % 3 else (op.c * (i + 1)) << regs.PDE_SPAN_SHIFT & ((1 << 40) - 1)
            entries[2 * i + 1] = self._value(t, op.c + i)
        del hc
        port_gpa = HCALL_GPA if op.c % 13 else RAM + 0x1000  # sometimes a record it lacks
        t.vgpu.write(regs.BAR4, regs.BAR4_HYPERCALL, 4, port_gpa)
        if hc_op == abi.HC_SET_PGD and self._hstatus(t) == abi.HC_OK:
            t.keys.append(key)
            del t.keys[:-3]  # the latest few

    @staticmethod
    def _hstatus(t: FuzzVm) -> int:
        """The status the last hypercall answered in the record (_UNANSWERED: none)."""
        hc = abi.HcallHeader.from_buffer(t.ram.array[HCALL_GPA:HCALL_GPA +
                                                      abi.HCALL_HEADER_BYTES])
        status = int(hc.status)
        del hc
        return status


@dataclass
class FuzzResult:
    """What one fuzz campaign came to: the operations it made, per kind, and every escape (a VM
    reaching what is not its own) and traceback it provoked; the campaign passes only with
    none of either."""

    operations: int = 0
    escapes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    tracebacks: list[str] = field(default_factory=list)
    seconds: float = 0.0
    per_kind: dict[str, int] = field(default_factory=dict)
    first_failure: int | None = None  # the operation after which one was first seen

    @property
    def failed(self) -> bool:
        return bool(self.escapes or self.violations or self.tracebacks)


def random_op(rng: random.Random) -> Op:
    kind = rng.choices(KINDS, WEIGHTS)[0]
    return Op(kind, rng.randrange(2), rng.getrandbits(32), rng.getrandbits(48),
              rng.getrandbits(32))


def run_ops(world: World, ops, result: FuzzResult, history: list[Op] | None = None,
            stop: bool = False) -> None:
    """Run operations; exceptions, monitor escapes and violations are recorded with their
    history (`stop`: stop at the first)."""
    for op in ops:
        result.operations += 1
        result.per_kind[op.kind] = result.per_kind.get(op.kind, 0) + 1
        if history is not None:
            history.append(op)
            del history[:-30]
        try:
            world.run(op)
        except Exception:
            result.tracebacks.append(f"{op!r}\n{traceback.format_exc()}"
                                     f"after: {history[-30:] if history else []}")
        found = monitor.take() if monitor.ESCAPES else []
        for e in found:
            result.escapes.append(f"{e} (after {history[-30:] if history else op!r})")
        for text in world.violations:
            result.violations.append(f"{text} (after {history[-30:] if history else op!r})")
        world.violations.clear()
        if result.failed and result.first_failure is None:
            result.first_failure = result.operations
            if stop:
                return


def fuzz(operations: int, seed: int = 0, world_ops: int = 1000,
         stop: bool = False) -> FuzzResult:
    """`operations` random operations, a fresh world every `world_ops` (`stop`: stop at
    the first failure)."""
    rng = random.Random(seed)
    result = FuzzResult()
    t0 = time.perf_counter()
    history: list[Op] = []
    while result.operations < operations and not (stop and result.failed):
        world = World()
        try:
            n = min(world_ops, operations - result.operations)
            run_ops(world, (random_op(rng) for _ in range(n)), result, history, stop)
        finally:
            world.close()
        result.escapes += [f"{e} (as the world closed)" for e in monitor.take()]
        if result.failed and result.first_failure is None:
            result.first_failure = result.operations
    result.seconds = time.perf_counter() - t0
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--operations", type=int, default=1_000_000,
                        help="guest operations to run (default 1,000,000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--world-ops", type=int, default=1000,
                        help="operations per fresh GPU + two VMs (default 1,000)")


def main_fuzz(args: argparse.Namespace) -> int:
    if args.operations <= 0 or args.world_ops <= 0:
        print("gpuvm: error: --operations and --world-ops must be positive")
        return 2
    try:
        plant = planted.active()
    except ValueError as exc:
        print(f"gpuvm: error: {exc}")
        return 2
    if plant is not None:
        print(f"planted fault    {plant} (the test-only switch {planted.SWITCH} is set)")
    r = fuzz(args.operations, args.seed, args.world_ops)
    print(f"operations run   {r.operations:,}")
    print(f"escapes          {len(r.escapes)}")
    print(f"violations       {len(r.violations)}")
    print(f"tracebacks       {len(r.tracebacks)}")
    print(f"time             {r.seconds:.1f} s ({r.operations / r.seconds:,.0f} ops/s)")
    print("by kind          " + ", ".join(f"{k} {n:,}" for k, n in sorted(r.per_kind.items())))
    for text in (r.escapes + r.violations + r.tracebacks)[:3]:
        print("\n" + text)
    return 0 if not r.escapes and not r.violations and not r.tracebacks else 1
