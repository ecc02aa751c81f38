"""The machine of every mediated mode: emulated GPUs shared by VMs through mediators.

Each VM gets a vGPU -- an mdev instance of a type the GPU advertises, with its own
virtualization mode -- when it starts, and gives it back when it stops.  VMs of different
modes (the unmodified driver in fv/fv-opt, the PV driver in pv) share the GPU at once.
The VMM attaches each vGPU through its VFIO interface like any other device.
"""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import fields, replace

from gpuvm.device import regs
from gpuvm.device.clock import GuestParty
from gpuvm.device.gpu import Gpu
from gpuvm.device.profile import DeviceProfile, load_profile
from gpuvm.mediator import mdev_types
from gpuvm.mediator.mdev_types import MdevType, MdevTypeError
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES as MODE_TABLE
from gpuvm.mediator.partition import PartitionError, PartitionSpec
from gpuvm.mediator.submission import WatchdogLimits
from gpuvm.mediator.vgpu import VGpu
from gpuvm.run.spec import RunError, RunOptions, VmSpec, device_clock
from scheduler import FifoPolicy, SchedulerConfig
from scheduler.metrics import VmMetrics

PARTITION_FIELDS = {f.name for f in fields(PartitionSpec)}


def gpu_types(profile: DeviceProfile) -> dict[str, MdevType]:
    """The mdev types a GPU of this profile advertises (sizes from the GPU itself)."""
    return mdev_types.profile_types(profile)


def machine_profile(options: RunOptions) -> DeviceProfile:
    profile = load_profile(options.profile) if options.profile else load_profile()
    return profile.with_vram(options.vram_size) if options.vram_size else profile


def vm_mode(spec: VmSpec, options: RunOptions) -> str:
    return spec.mode or options.mode


def requested_vgpu(spec: VmSpec, types: dict[str, MdevType]) -> tuple[PartitionSpec, float, str]:
    """(partition, scheduler share, type id) of the vGPU a VM asks for: an explicit
    partition, else its mdev type, else the GPU's default type."""
    if spec.partition:
        unknown = set(spec.partition) - PARTITION_FIELDS
        if unknown:
            raise RunError(f"{spec.name}: unknown partition field {sorted(unknown)[0]!r} "
                           f"(have {', '.join(sorted(PARTITION_FIELDS))})")
        part, weight, type_id = PartitionSpec(**spec.partition), 1.0, "custom"
    else:
        try:
            t = mdev_types.lookup(types, spec.mdev_type or mdev_types.default_type_id(types))
        except MdevTypeError as exc:
            raise RunError(f"{spec.name}: {exc}") from None
        part, weight, type_id = t.partition, t.weight, t.type_id
    try:
        part.check()
    except PartitionError as exc:
        raise RunError(f"{spec.name}: {exc}") from None
    return part, spec.share if spec.share is not None else weight, type_id


class MediatedMachine:
    """One or more emulated GPUs (`options.gpus`), each with its own mediator and
    scheduler; a VM's vGPU goes on the GPU it names, else on the first GPU where its type
    still has an instance available (as a management layer places mdevs by the parents'
    available_instances)."""

    def __init__(self, options: RunOptions, specs: list[VmSpec]) -> None:
        self.options = options
        if options.gpus < 1:
            raise RunError(f"gpus: a machine needs at least one GPU, got {options.gpus}")
        if options.host_backing_mib < 1:
            raise RunError(f"host backing: must be at least 1 MiB, got {options.host_backing_mib}")
        try:
            config = SchedulerConfig.from_dict(options.scheduler) if options.scheduler \
                else None
        except ValueError as exc:
            raise RunError(f"scheduler: {exc}") from None
        profile = machine_profile(options)
        self.types = gpu_types(profile)
        for spec in specs:  # every VM's request is checked before anything runs
            mode = MODE_TABLE.get(vm_mode(spec, options))
            if mode is None or not mode.mediated:
                raise RunError(f"{spec.name}: mode {vm_mode(spec, options)!r} is not a "
                               f"mediated mode")
            if spec.paravirtual != mode.pv:
                raise RunError(f"{spec.name}: mode {mode.name} runs the "
                               f"{'PV' if mode.pv else 'unmodified'} driver")
            if spec.gpu is not None and not 0 <= spec.gpu < options.gpus:
                raise RunError(f"{spec.name}: no GPU {spec.gpu} (the machine has "
                               f"{options.gpus})")
            requested_vgpu(spec, self.types)
        try:
            watchdog = WatchdogLimits(
                None if options.watchdog_s is None else int(options.watchdog_s * 1e9),
                None if options.watchdog_vm_s is None else int(options.watchdog_vm_s * 1e9))
        except ValueError as exc:
            raise RunError(str(exc)) from None
        self.clock = device_clock(options)
        self.gpus = [Gpu(profile, clock=self.clock if self.clock.virtual else None,
                         time_scale=options.time_scale).start()
                     for _ in range(options.gpus)]
        self.mediators = [Mediator(gpu, config.build() if config else FifoPolicy(), watchdog,
                                   options.host_backing_mib * regs.MiB)
                          for gpu in self.gpus]
        self.vgpus: dict[str, VGpu] = {}
        self.placement: dict[str, int] = {}  # VM -> index of the GPU its vGPU is on

    @property
    def gpu(self) -> Gpu:
        """GPU 0 (the only one, unless the run asked for more)."""
        return self.gpus[0]

    @property
    def med(self) -> Mediator:
        return self.mediators[0]

    def _place(self, spec: VmSpec, part: PartitionSpec) -> int:
        if spec.gpu is not None:
            return spec.gpu
        for i, med in enumerate(self.mediators):
            if mdev_types.fits(med.table, part):
                return i
        why = mdev_types.why_not(self.mediators[0].table, part) if len(self.gpus) == 1 else ""
        raise RunError(f"{spec.name}: no GPU has room for its vGPU "
                       f"({part.vram_size >> 20} MiB, {part.channels} channels) "
                       f"on any of {len(self.gpus)} GPU(s)" + (f": {why}" if why else ""))

    def attach(self, spec: VmSpec) -> VGpu:
        part, share, type_id = requested_vgpu(spec, self.types)
        mode = MODE_TABLE[vm_mode(spec, self.options)]
        uuid = spec.mdev_uuid or str(uuidlib.uuid4())
        index = self._place(spec, part)
        try:
            vgpu = self.mediators[index].add_vm(spec.name, mode, part, share, uuid, type_id)
        except PartitionError as exc:
            raise RunError(f"{spec.name}: {exc}") from None
        self.vgpus[spec.name] = vgpu
        self.placement[spec.name] = index
        return vgpu

    def detach(self, spec: VmSpec) -> None:
        vgpu = self.vgpus.pop(spec.name, None)
        if vgpu is not None:
            self.mediators[self.placement.pop(spec.name)].remove_vm(vgpu)

    def use_meter(self, spec: VmSpec, party: GuestParty) -> None:
        """Charge the VM's events to its vCPU's virtual time, its mediator's lock taken
        in virtual time too."""
        med = self.mediators[self.placement[spec.name]]
        self.vgpus[spec.name].use_meter(party, self.options.prices, med.vlock)

    def clock_scope(self, spec: VmSpec) -> object:
        """What a VM's guest waits on: the GPU its vGPU is on (a virtual clock wakes a
        sleeping guest only for its own GPU's events)."""
        return self.gpus[self.placement[spec.name]] if spec.name in self.placement else None

    def metrics(self, spec: VmSpec) -> VmMetrics | None:
        """The scheduler's record of this VM (read before it is detached)."""
        vgpu = self.vgpus.get(spec.name)
        if vgpu is None:
            return None
        submissions = self.mediators[self.placement[spec.name]].submissions
        submissions.wait_idle(vgpu)
        return submissions.metrics(vgpu)

    def close(self) -> None:
        for med, gpu in zip(self.mediators, self.gpus):
            med.close()
            gpu.release_memory()


def guest_for_mode(spec: VmSpec, mode_name: str) -> VmSpec:
    """The spec with the driver build its mode runs (the PV build for pv modes)."""
    mode = MODE_TABLE.get(spec.mode or mode_name)
    if mode is None or not mode.pv or spec.paravirtual:
        return spec
    return replace(spec, paravirtual=True, pv_batch=spec.pv_batch or mode.pv_batch)
