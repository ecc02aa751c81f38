"""The vGPU types a GPU advertises, as mediated-device parents do.

GVT-g names a type by how many fit on the GPU (`i915-GVTg_V5_4`: four instances, the
aperture, weight and framebuffer following from that); NVIDIA names a fixed framebuffer
(`GRID P40-2B`, "framebuffer=2048M").  gpuvm does both: `gpuvm-Q6000-8Q` is the type of
which eight fit, and its description spells out the framebuffer, channels, BAR arenas,
shadow reserve and scheduler weight that follow.

Sizes come from the GPU itself (its VRAM, BAR1 and BAR3), so a smaller emulated GPU
advertises smaller types: for the N-instance type, the framebuffer is the largest power of
two MiB such that N of them fit together with their shadow reserves (1/16 of the
framebuffer, at least 4 MiB) in the VRAM below the hypervisor's; BAR1 (less the USERD poll
area), BAR3 and the channels are split N ways; the weight is 8/N, so a type twice as
large gets twice the GPU time under CREDIT and BAND.  A vGPU's BAR1 and BAR3 are PCI BARs,
whose sizes are powers of two (a VMM sizes a BAR by the bits it can write, and
libvfio-user refuses, QEMU asserts on, any other size), so each instance's share is the
largest power of two in its Nth: the whole BAR is usable, and what the rounding leaves
of the GPU's apertures is stated in the description (`bar1=8M of 15M`: 8 MiB usable, of
a 15 MiB share).

Oversubscribed types (`gpuvm-Q6000-75-OS`, `gpuvm-Q6000-150-OS`) give each instance a
framebuffer of that percentage of the usable VRAM, so that two of the first already sum
above it: the guest's VRAM lives in a host backing store and is made resident in a pool of
physical VRAM the oversubscribed instances share (mediator/residency.py), switched at
scheduling boundaries.  They take a quarter of the channels and BAR arenas, like the
4-instance type; how many fit is bounded by the host backing limit as well as by the GPU.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from gpuvm.device import regs
from gpuvm.device.profile import DeviceProfile
from gpuvm.mediator.mediator import HYP_GLOBAL
from gpuvm.mediator.partition import (DEFAULT_HOST_BACKING, POLL_AREA, PartitionError,
                                     PartitionSpec, PartitionTable, residency_pool_size)

INSTANCE_COUNTS = (1, 2, 4, 8)
OVERSUBSCRIBED_PERCENT = (75, 150)  # framebuffer, in percent of the usable VRAM
OVERSUBSCRIBED_SHARE = 4  # channels and BAR arenas: as the 4-instance type
DEFAULT_INSTANCES = 8  # the default type: the paper's largest configuration fits
DEVICE_API = "vfio-pci"
MIN_SHADOW = 4 * regs.MiB


class MdevTypeError(ValueError):
    """An unknown type id, or one with no instance left; one line."""


@dataclass(frozen=True)
class MdevType:
    """One vGPU type a parent GPU offers, as mdev's sysfs and `gpuvm mdev types` show it:
    the partition each instance gets and how many fit.  Types are fixed slices so that
    placing a VM never needs a search."""
    type_id: str  # e.g. gpuvm-Q6000-8Q
    name: str  # e.g. Q6000-8Q
    max_instances: int
    partition: PartitionSpec
    weight: float
    device_api: str = DEVICE_API

    share1: int = 0  # the Nth of the GPU's BAR1 / BAR3 each BAR was rounded down from
    share3: int = 0

    @property
    def description(self) -> str:
        p = self.partition
        kind = "oversubscribed, " if p.oversubscribed else ""
        return (f"{kind}framebuffer={p.vram_size >> 20}M, channels={p.channels}, "
                f"bar1={_bar(p.bar1_size, self.share1)}, "
                f"bar3={_bar(p.bar3_size, self.share3)}, "
                f"shadow={p.shadow_size >> 20}M, weight={self.weight:g}, "
                f"max_instance={self.max_instances}")


def _bar(size: int, share: int) -> str:
    return f"{size >> 20}M" if share <= size else f"{size >> 20}M of {share >> 20}M"


def _bar_shares(bar1_size: int, bar3_size: int, n: int) -> tuple[int, int, int, int]:
    """(BAR1, BAR3, and the Nths they come from): each BAR the largest power of two in
    its instance's Nth of the GPU's aperture (BAR1 less the USERD poll area), whole MiB,
    at most a page directory's span."""
    share1 = min(((bar1_size - POLL_AREA) // n) & ~(regs.MiB - 1), regs.PDE_SPAN)
    share3 = min((bar3_size // n) & ~(regs.MiB - 1), regs.PDE_SPAN)
    return _pow2_floor(share1), _pow2_floor(share3), share1, share3


def _pow2_floor(size: int) -> int:
    return 1 << (size.bit_length() - 1) if size > 0 else 0


def _framebuffer(usable: int, n: int) -> int:
    fb = regs.MiB
    while n * (2 * fb + max(2 * fb // 16, MIN_SHADOW)) <= usable:
        fb *= 2
    return fb


def mdev_types(short_name: str, vram_usable: int, bar1_size: int,
               bar3_size: int) -> dict[str, MdevType]:
    """Every type a GPU of these sizes advertises, by type id."""
    out: dict[str, MdevType] = {}
    for n in INSTANCE_COUNTS:
        fb = _framebuffer(vram_usable, n)
        bar1, bar3, share1, share3 = _bar_shares(bar1_size, bar3_size, n)
        spec = PartitionSpec(vram_size=fb, channels=regs.NUM_CHANNELS // n, bar1_size=bar1,
                             bar3_size=bar3, shadow_size=max(fb // 16, MIN_SHADOW))
        name = f"{short_name}-{n}Q"
        out[f"gpuvm-{name}"] = MdevType(f"gpuvm-{name}", name, n, spec,
                                        weight=DEFAULT_INSTANCES / n, share1=share1,
                                        share3=share3)
    pool = residency_pool_size(vram_usable)
    n = OVERSUBSCRIBED_SHARE
    bar1, bar3, share1, share3 = _bar_shares(bar1_size, bar3_size, n)
    for percent in OVERSUBSCRIBED_PERCENT:
        fb = (pool * percent // 75) & ~(regs.MiB - 1)  # the pool is 75% of usable VRAM
        spec = PartitionSpec(vram_size=fb, channels=regs.NUM_CHANNELS // n, bar1_size=bar1,
                             bar3_size=bar3,
                             shadow_size=max((fb // 16) & ~(regs.MiB - 1), MIN_SHADOW),
                             oversubscribed=True)
        name = f"{short_name}-{percent}-OS"
        out[f"gpuvm-{name}"] = MdevType(f"gpuvm-{name}", name, n, spec,
                                        weight=DEFAULT_INSTANCES / n, share1=share1,
                                        share3=share3)
    return out


def profile_types(profile: DeviceProfile) -> dict[str, MdevType]:
    """The types a GPU of this profile advertises: sizes from its VRAM (less what the
    mediator keeps for itself), BAR1 and BAR3; names from its product name."""
    short = profile.name.replace("Quadro ", "Q").replace(" ", "")
    return mdev_types(short, profile.vram_size - HYP_GLOBAL, profile.bar1_size,
                      profile.bar3_size)


def empty_table(profile: DeviceProfile,
                host_backing: int = DEFAULT_HOST_BACKING) -> PartitionTable:
    """A partition table of a GPU of this profile with nothing placed (as the mediator
    makes it), with this host backing limit for oversubscribed instances."""
    return PartitionTable(profile.vram_size, HYP_GLOBAL, profile.bar1_size, profile.bar3_size,
                          host_backing)


def default_type_id(types: dict[str, MdevType]) -> str:
    return next(t.type_id for t in types.values() if t.max_instances == DEFAULT_INSTANCES)


def lookup(types: dict[str, MdevType], type_id: str) -> MdevType:
    try:
        return types[type_id]
    except KeyError:
        raise MdevTypeError(f"no mdev type {type_id!r} (have {', '.join(types)})") from None


def fits(table: PartitionTable, partition: PartitionSpec) -> bool:
    """Whether one more partition of this shape can be placed now (tried on a copy)."""
    try:
        copy.deepcopy(table).allocate(partition)
    except PartitionError:
        return False
    return True


def why_not(table: PartitionTable, partition: PartitionSpec) -> str:
    """Why one more partition of this shape cannot be placed now ("" if it can)."""
    try:
        copy.deepcopy(table).allocate(partition)
    except PartitionError as exc:
        return str(exc)
    return ""


def available_instances(table: PartitionTable, mdev_type: MdevType) -> int:
    """How many more instances of this type fit now, beside what is already placed
    (placed on a copy of the table, so fragmentation counts as it would)."""
    trial = copy.deepcopy(table)
    n = 0
    while n < mdev_type.max_instances:
        try:
            trial.allocate(mdev_type.partition)
        except PartitionError:
            break
        n += 1
    return n
