"""Native mode: no mediator; each VM gets an emulated GPU of its own, passed through whole
(as vfio-pci hands a card to one VM).

A VM that names an mdev type (or a partition) sees the GPU that vGPU would show -- the
type's framebuffer and BAR sizes -- so its counts compare one to one with the mediated
modes (`gpuvm run` always names one); a VM that names neither gets the whole card.
"""

from __future__ import annotations

from dataclasses import replace

from gpuvm.device.clock import GuestParty
from gpuvm.device.gpu import Gpu
from gpuvm.run.mediated import gpu_types, machine_profile, requested_vgpu
from gpuvm.run.spec import RunError, RunOptions, VmSpec, device_clock
from gpuvm.vfio.passthrough import PassthroughGpu


class NativeMachine:
    """The native baseline: a whole emulated GPU per VM, no mediator, as vfio-pci passes a card
    through."""

    paravirtual = False  # whether the PV driver may run here (it needs a hypercall port)

    def __init__(self, options: RunOptions, specs: list[VmSpec]) -> None:
        for spec in specs:
            if spec.paravirtual and not self.paravirtual:
                raise RunError(f"{spec.name}: native mode runs the unmodified driver; "
                               f"the PV driver needs a paravirtual mode")
        self.profile = machine_profile(options)
        self.types = gpu_types(self.profile)
        self.time_scale = options.time_scale
        self.prices = options.prices
        self.clock = device_clock(options)  # a virtual one is shared by every VM's GPU
        # a VM in this process may have the GPU's apertures mapped as memory (its VMM
        # counts the accesses); one in its own process over vfio-user traps them all
        self.apertures_as_memory = not options.isolated
        for spec in specs:
            requested_vgpu(spec, self.types)
        self.devices: dict[str, PassthroughGpu] = {}

    def attach(self, spec: VmSpec) -> PassthroughGpu:
        profile = self.profile
        if spec.partition or spec.mdev_type:
            part, _, _ = requested_vgpu(spec, self.types)
            # a vGPU reports its slice as one memory partition; so does this GPU
            profile = replace(profile, vram_size=part.vram_size, bar1_size=part.bar1_size,
                              bar3_size=part.bar3_size, partitions=1)
        device = self.device_class(Gpu(profile, time_scale=self.time_scale,
                                       clock=self.clock if self.clock.virtual else None
                                       ).start())
        device.apertures_as_memory = self.apertures_as_memory
        self.devices[spec.name] = device
        return device

    device_class: type[PassthroughGpu] = PassthroughGpu  # tests pass instrumented GPUs

    def use_meter(self, spec: VmSpec, party: GuestParty) -> None:
        """Charge the VM's bare-metal accesses to its vCPU's virtual time."""
        self.devices[spec.name].use_meter(party, self.prices)

    def clock_scope(self, spec: VmSpec) -> object:
        """The VM's own GPU (see MediatedMachine.clock_scope)."""
        device = self.devices.get(spec.name)
        return None if device is None else device.gpu

    def metrics(self, spec: VmSpec) -> None:
        """No scheduler: each VM has its GPU to itself."""
        return None

    def detach(self, spec: VmSpec) -> None:
        device = self.devices.pop(spec.name, None)
        if device is not None:
            device.close()
            device.gpu.release_memory()

    def close(self) -> None:
        for name in list(self.devices):
            self.devices.pop(name).gpu.release_memory()
