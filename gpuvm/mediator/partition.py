"""Partitions of the physical GPU, created and destroyed while other VMs run.

A VM's partition is a VRAM slice (what its guest sees as all of VRAM), a range of
physical channels, an arena in BAR1 and in BAR3, a reserve of hypervisor VRAM for its
shadow structures, and a bus window at which the device reaches the VM's RAM.

An oversubscribed partition has no slice of its own: its guest VRAM is a host-memory
backing store, of which the pages in use are made resident in a pool of physical VRAM
that every oversubscribed partition of the GPU shares (mediator/residency.py).  The pool
is taken when the first one is placed and given back with the last; the backing stores
together may not exceed the host backing limit, which is what makes the sum of
framebuffers above physical VRAM a stated commitment rather than an open one.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.device import regs
from shadow.vram_pool import PoolExhausted, VramPool

SLICE_ALIGN = 2 * regs.MiB  # keeps large (128 KiB) pages aligned after translation
BUS_WINDOW = 1 << 36  # each VM's RAM is seen by the device at slot * 64 GiB
MAX_SLOTS = (regs.VA_LIMIT // BUS_WINDOW) - 1
POLL_AREA = regs.NUM_CHANNELS * regs.USERD_STRIDE  # physical BAR1 [0, 512 KiB): USERD
DEFAULT_HOST_BACKING_MIB = 16 * 1024  # host memory all backing stores of a GPU may commit
DEFAULT_HOST_BACKING = DEFAULT_HOST_BACKING_MIB * regs.MiB


def residency_pool_size(vram_usable: int) -> int:
    """The physical VRAM the oversubscribed partitions of a GPU share: three quarters of
    what the mediator leaves usable, in whole slice-aligned units (the rest stays for
    shadow reserves and ordinary partitions beside them)."""
    return (vram_usable * 3 // 4) & ~(SLICE_ALIGN - 1)


class PartitionError(ValueError):
    """The request does not fit what is left of the GPU."""


@dataclass(frozen=True)
class PartitionSpec:
    """What one vGPU is given: VRAM, channels, BAR1/BAR3 window sizes and its shadow
    reserve (mdev types name these).  Checked once, before anything is carved."""
    vram_size: int = 512 * regs.MiB
    channels: int = 8
    bar1_size: int = 16 * regs.MiB
    bar3_size: int = 8 * regs.MiB
    shadow_size: int = 32 * regs.MiB
    # guest VRAM in a host backing store, made resident in the shared pool when it runs
    oversubscribed: bool = False

    def check(self) -> None:
        for name in ("vram_size", "bar1_size", "bar3_size", "shadow_size"):
            value = getattr(self, name)
            if value <= 0 or value % regs.MiB:
                raise PartitionError(f"{name} must be a positive number of MiB, got {value}")
        if not 1 <= self.channels <= regs.NUM_CHANNELS:
            raise PartitionError(f"channels must be 1-{regs.NUM_CHANNELS}, got {self.channels}")
        if self.bar1_size > regs.PDE_SPAN or self.bar3_size > regs.PDE_SPAN:
            raise PartitionError("a BAR arena may not exceed 128 MiB")


@dataclass
class Partition:
    """A vGPU's carved slice of the GPU: where its VRAM, channels and BAR windows start,
    its shadow pool and system-memory window -- the bounds the mediator translates the
    guest's addresses into and the reference monitor checks against."""
    slot: int
    spec: PartitionSpec
    vram_base: int
    chid_base: int
    bar1_base: int
    bar3_base: int
    shadow_pool: VramPool
    sys_base: int

    @property
    def vram_size(self) -> int:
        return self.spec.vram_size

    @property
    def channels(self) -> int:
        return self.spec.channels

    def pchid(self, vchid: int) -> int | None:
        return self.chid_base + vchid if 0 <= vchid < self.spec.channels else None


class PartitionTable:
    """The GPU's resources and who holds which: VRAM, channel ids, BAR1/BAR3 windows and
    host backing for oversubscribed vGPUs.  A request the GPU cannot meet is refused
    here, by name, before any VM's state is touched."""
    def __init__(self, vram_size: int, hyp_global: int, bar1_size: int, bar3_size: int,
                 host_backing: int = DEFAULT_HOST_BACKING) -> None:
        self.vram = VramPool(0, vram_size - hyp_global, "VRAM")
        self.pool_size = residency_pool_size(vram_size - hyp_global)
        self.pool_base: int | None = None  # the residency pool, while anyone uses it
        self.host_backing = host_backing  # bytes all backing stores may take together
        self.backing_used = 0
        self.bar1 = VramPool(POLL_AREA, bar1_size - POLL_AREA, "BAR1")
        self.bar3 = VramPool(0, bar3_size, "BAR3")
        self._channels = [None] * regs.NUM_CHANNELS
        self._slots: set[int] = set()
        self.partitions: list[Partition] = []

    def _channel_range(self, n: int, slot: int) -> int:
        run = 0
        for c in range(regs.NUM_CHANNELS):
            run = run + 1 if self._channels[c] is None else 0
            if run == n:
                base = c - n + 1
                self._channels[base:base + n] = [slot] * n
                return base
        raise PartitionError(f"no {n} consecutive free channels")

    def allocate(self, spec: PartitionSpec) -> Partition:
        spec.check()
        slot = next((s for s in range(1, MAX_SLOTS + 1) if s not in self._slots), None)
        if slot is None:
            raise PartitionError("no partition slot left")
        taken: list[tuple[VramPool, int]] = []
        new_pool = False
        try:
            if spec.oversubscribed:
                self._check_backing(spec)
                if self.pool_base is None:
                    self.pool_base = self.vram.alloc(self.pool_size, SLICE_ALIGN)
                    new_pool = True
                vram = self.pool_base
            else:
                vram = self.vram.alloc(spec.vram_size, SLICE_ALIGN)
                taken.append((self.vram, vram))
            shadow = self.vram.alloc(spec.shadow_size, SLICE_ALIGN)
            taken.append((self.vram, shadow))
            bar1 = self.bar1.alloc(spec.bar1_size, regs.SMALL_PAGE)
            taken.append((self.bar1, bar1))
            bar3 = self.bar3.alloc(spec.bar3_size, regs.SMALL_PAGE)
            taken.append((self.bar3, bar3))
            chid = self._channel_range(spec.channels, slot)
        except (PoolExhausted, PartitionError) as exc:
            for pool, addr in taken:
                pool.free(addr)
            if new_pool:
                self.vram.free(self.pool_base)
                self.pool_base = None
            raise PartitionError(f"cannot place a partition of {spec.vram_size >> 20} MiB VRAM, "
                                 f"{spec.channels} channels: {exc}") from None
        self._slots.add(slot)
        if spec.oversubscribed:
            self.backing_used += spec.vram_size
        part = Partition(slot, spec, vram, chid, bar1, bar3,
                         VramPool(shadow, spec.shadow_size, f"shadow{slot}"), slot * BUS_WINDOW)
        self.partitions.append(part)
        return part

    def _check_backing(self, spec: PartitionSpec) -> None:
        if self.backing_used + spec.vram_size > self.host_backing:
            raise PartitionError(
                f"the host backing limit is {self.host_backing >> 20} MiB and "
                f"{self.backing_used >> 20} MiB of it is committed")

    def oversubscribed(self) -> list[Partition]:
        return [p for p in self.partitions if p.spec.oversubscribed]

    def release(self, part: Partition) -> None:
        if part.spec.oversubscribed:
            self.backing_used -= part.spec.vram_size
            if len(self.oversubscribed()) == 1 and self.pool_base is not None:
                self.vram.free(self.pool_base)  # the last one: the pool goes back
                self.pool_base = None
        else:
            self.vram.free(part.vram_base)
        self.vram.free(part.shadow_pool.base)
        self.bar1.free(part.bar1_base)
        self.bar3.free(part.bar3_base)
        self._channels = [None if s == part.slot else s for s in self._channels]
        self._slots.discard(part.slot)
        self.partitions.remove(part)
