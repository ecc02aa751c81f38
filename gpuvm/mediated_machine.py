"""The machine of every mediated mode: one emulated GPU shared by VMs through a mediator.

Each VM gets a partition when it is attached (it starts) and gives it back when it is
detached (it stops).  BAR remap reaches the guest through its runner's memslot table --
KVM memslots, or the in-process backend's page tables -- with the same calls.
"""

from __future__ import annotations

from dataclasses import fields

from gpuvm.device import regs
from gpuvm.device.gpu import Gpu
from gpuvm.device.profile import load_profile
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES as MODE_TABLE
from gpuvm.mediator.partition import PartitionError, PartitionSpec
from gpuvm.mediator.vgpu import VGpu
from gpuvm.run_spec import Attachment, RunError, RunOptions, VmSpec
from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam
from scheduler import FifoPolicy, SchedulerConfig
from scheduler.metrics import VmMetrics

BAR_BASES = {regs.BAR1: abi.GUEST_BAR1_BASE, regs.BAR3: abi.GUEST_BAR3_BASE}
PARTITION_FIELDS = {f.name for f in fields(PartitionSpec)}


class MemslotRemapper:
    """The mediator's Remapper over a runner's MemslotTable (KVM or in-process)."""

    def __init__(self, table) -> None:
        self.table = table

    def map(self, bar: int, offset: int, host_address: int, size: int) -> None:
        self.table.map(BAR_BASES[bar] + offset, host_address, size, replace=True)

    def unmap(self, bar: int, offset: int, size: int) -> None:
        self.table.unmap(BAR_BASES[bar] + offset, size)

    def slots_in_use(self) -> int:
        return self.table.slots_in_use


def partition_spec(spec: VmSpec) -> PartitionSpec:
    unknown = set(spec.partition) - PARTITION_FIELDS
    if unknown:
        raise RunError(f"{spec.name}: unknown partition field {sorted(unknown)[0]!r} "
                       f"(have {', '.join(sorted(PARTITION_FIELDS))})")
    part = PartitionSpec(**spec.partition)
    try:
        part.check()
    except PartitionError as exc:
        raise RunError(f"{spec.name}: {exc}") from None
    return part


class MediatedMachine:
    paravirtual = True

    def __init__(self, options: RunOptions, specs: list[VmSpec]) -> None:
        self.mode = MODE_TABLE[options.mode]
        for spec in specs:
            partition_spec(spec)  # every VM's partition request is checked before anything runs
            if spec.paravirtual != self.mode.pv:
                raise RunError(f"{spec.name}: mode {self.mode.name} runs the "
                               f"{'PV' if self.mode.pv else 'unmodified'} driver")
        try:
            policy = SchedulerConfig.from_dict(options.scheduler).build() \
                if options.scheduler else FifoPolicy()
        except ValueError as exc:
            raise RunError(f"scheduler: {exc}") from None
        profile = load_profile(options.profile) if options.profile else None
        self.gpu = Gpu(profile, time_scale=options.time_scale, vram_size=options.vram_size)
        self.gpu.start()
        self.med = Mediator(self.gpu, policy)
        default = PartitionSpec()
        self.bar_sizes = {regs.BAR0: regs.BAR0_SIZE, regs.BAR1: default.bar1_size,
                          regs.BAR3: default.bar3_size}
        self.vgpus: dict[str, VGpu] = {}

    def attach(self, spec: VmSpec, ram: GuestRam) -> Attachment:
        part = partition_spec(spec)
        try:
            vgpu = self.med.add_vm(spec.name, ram, self.mode, part, spec.share)
        except PartitionError as exc:
            raise RunError(f"{spec.name}: {exc}") from None
        self.vgpus[spec.name] = vgpu
        return Attachment(vgpu, hypercall=vgpu.hypercall if self.mode.pv else None,
                          bar_sizes={regs.BAR0: regs.BAR0_SIZE, regs.BAR1: part.bar1_size,
                                     regs.BAR3: part.bar3_size},
                          memslots=lambda table: vgpu.set_remapper(MemslotRemapper(table)))

    def detach(self, spec: VmSpec) -> None:
        vgpu = self.vgpus.pop(spec.name, None)
        if vgpu is not None:
            self.med.remove_vm(vgpu)

    def metrics(self, spec: VmSpec) -> VmMetrics | None:
        """The scheduler's record of this VM (read before it is detached)."""
        vgpu = self.vgpus.get(spec.name)
        if vgpu is None:
            return None
        self.med.submissions.wait_idle(vgpu)
        return self.med.submissions.metrics(vgpu)

    def close(self) -> None:
        self.med.close()
        self.gpu.release_memory()


def guest_for_mode(spec: VmSpec, mode_name: str) -> VmSpec:
    """The spec with the driver build the mode runs (the PV build for pv modes)."""
    from dataclasses import replace

    mode = MODE_TABLE.get(mode_name)
    if mode is None or not mode.pv or spec.paravirtual:
        return spec
    return replace(spec, paravirtual=True, pv_batch=spec.pv_batch or mode.pv_batch)


def register() -> None:
    from gpuvm import runner

    for name, mode in MODE_TABLE.items():
        if mode.mediated:
            runner.register_mode(name, MediatedMachine)
