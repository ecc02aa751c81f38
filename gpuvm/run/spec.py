"""What a run is made of: VM specs, run options, and the machine interface a mode builds.

Kept apart from the run loop so that each mode's machine (gpuvm/run/native.py,
gpuvm/run/mediated.py) is written against these types without importing the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from gpuvm.mediator.partition import DEFAULT_HOST_BACKING_MIB
from gpuvm.vfio.device import DeviceStats, VfioDevice
from gpuvm.device.clock import (CLOCKS, FREE, DeviceClock, EventPrices, GuestParty,
                                VirtualClock)
from gpuvm.vmm import abi, guest_programs
from gpuvm.vmm.guest_ram import ALLOCATIONS, default_allocation
from scheduler.metrics import VmMetrics


class RunError(Exception):
    """A run cannot be set up (bad spec, unknown mode, build failure); one line."""


# ------------------------------------------------------------------------------ specs
@dataclass
class VmSpec:
    """One VM: the benchmark it runs and how its guest is configured."""

    name: str
    benchmark: str
    params: list[int] = field(default_factory=list)  # benchmark params[0..6]
    inject: str | None = None  # a key of abi.FI_NAMES
    paravirtual: bool = False  # run the PV driver build
    pv_batch: int = 0  # PV build: entries per hypercall (0 = HC_MAX_ENTRIES, 1 = naive)
    ram_size: int = abi.GUEST_RAM_DEFAULT
    share: float | None = None  # scheduler weight when VMs share the GPU (None: the type's)
    start_delay: float = 0.0  # seconds after the run starts that this VM is created
    partition: dict[str, int] = field(default_factory=dict)  # PartitionSpec fields (bytes)
    mdev_type: str | None = None  # the vGPU's mdev type (None: the GPU's default type)
    mode: str | None = None  # this VM's mode, when it differs from the run's
    mdev_uuid: str = ""  # the vGPU's UUID (mediated modes; "" = a new one)
    gpu: int | None = None  # which of the machine's GPUs (None: the first with room)
    # host memory: guest RAM backing (guest_ram.BACKINGS), whether the runtime
    # reports its host-memory events, whether pageable copies pin chunk by chunk (and the
    # chunk size), and whether the VMM advises MADV_NOHUGEPAGE on the ranges it pins
    ram_backing: str = "anon"
    # when the host allocates guest RAM: "immediate" as the VM is built, "ondemand" as
    # the guest first touches it (gpuvm.vmm.guest_ram says why immediate is the default)
    ram_alloc: str = field(default_factory=default_allocation)
    hostmem_report: bool = False
    pin_chunks: bool = False
    pin_chunk_bytes: int = 4 * 1024 * 1024
    nohugepage_pinned: bool = False

    @property
    def program(self) -> str:
        return guest_programs.DRIVER_PV.name if self.paravirtual else guest_programs.DRIVER.name

    def flags(self) -> int:
        flags = abi.BOOT_FLAG_PV if self.paravirtual else 0
        if self.hostmem_report:
            flags |= abi.BOOT_FLAG_HOSTMEM_REPORT
        if self.pin_chunks:
            size = self.pin_chunk_bytes
            if size < 4096 or size & (size - 1) or size.bit_length() - 1 > abi.BOOT_PIN_CHUNK_MASK:
                raise RunError(f"{self.name}: pin chunk of {size} bytes is not a power of two "
                               f">= 4096")
            flags |= abi.BOOT_FLAG_PIN_CHUNKS | \
                (size.bit_length() - 1) << abi.BOOT_PIN_CHUNK_SHIFT
        if self.ram_backing not in ("anon", "4k", "thp"):
            raise RunError(f"{self.name}: unknown guest RAM backing {self.ram_backing!r} "
                           f"(have anon, 4k, thp)")
        if self.ram_alloc not in ALLOCATIONS:
            raise RunError(f"{self.name}: unknown guest RAM allocation {self.ram_alloc!r} "
                           f"(have {', '.join(ALLOCATIONS)})")
        if self.inject is not None:
            if self.inject not in abi.FI_NAMES:
                raise RunError(f"{self.name}: unknown fault injection {self.inject!r} "
                               f"(have {', '.join(sorted(abi.FI_NAMES))})")
            flags |= abi.FI_NAMES[self.inject] << abi.BOOT_FI_SHIFT
        return flags

    def boot_params(self) -> list[int]:
        if self.benchmark not in guest_programs.BENCHMARKS:
            raise RunError(f"{self.name}: no benchmark {self.benchmark!r} (have "
                           f"{', '.join(guest_programs.BENCHMARKS)})")
        if len(self.params) > guest_programs.BENCH_NUM_PARAMS:
            raise RunError(f"{self.name}: at most {guest_programs.BENCH_NUM_PARAMS} "
                           f"benchmark parameters, got {len(self.params)}")
        if any(not 0 <= p < 1 << 64 for p in self.params) or self.pv_batch < 0:
            raise RunError(f"{self.name}: parameters must be unsigned 64-bit integers")
        params = list(self.params) + [0] * (abi.BOOT_NUM_PARAMS - len(self.params))
        params[guest_programs.PARAM_PV_BATCH] = self.pv_batch
        return params


@dataclass(frozen=True)
class ServedTime:
    """What the vfio-user server's one thread spent on a VM in its own process: answering
    its register accesses, and running its channels.  Every VM waits for that thread,
    so the sum over a run's VMs against its makespan says how busy the server was."""
    access_ns: int
    engine_ns: int


@dataclass
class RunOptions:
    """How a run is made (mode, backend, clock, limits, scheduler, GPUs), apart from what each
    VM runs."""

    mode: str = "native"
    backend: str = "auto"  # kvm | inproc | auto
    timeout: float = 600.0  # per VM, wall seconds
    # Longest single PORT_WAIT; the driver re-waits while its channel is healthy, so this
    # only bounds how late a fault the wait did not see is noticed.
    wait_slice: float = 30.0
    time_scale: float = 1.0  # device clock speed relative to wall time (clock "wall")
    # "virtual": device time advances with modelled progress only -- GPU work, and each
    # event a guest causes at its price in `prices` -- so every result is the same on
    # every host (gpuvm/device/clock.py); "wall": device time is wall time (a live demo);
    # None: "virtual"
    clock: str | None = None
    prices: EventPrices = FREE  # the cost profile's, for the run's mode(s)
    vram_size: int | None = None  # None: the device profile's
    profile: str | None = None  # device profile name or path
    scheduler: dict[str, Any] = field(default_factory=dict)  # scheduler.SchedulerConfig
    gpus: int = 1  # emulated GPUs in a mediated machine, each with its own scheduler
    # host memory the backing stores of oversubscribed vGPUs may take together, per GPU
    host_backing_mib: int = DEFAULT_HOST_BACKING_MIB
    isolated: bool = False  # each VM in its own VMM process, attached over vfio-user
    # The watchdog (mediated modes): device seconds one submission may hold the GPU, and
    # one VM in all (None: no limit).  Past it the channel is killed and the VM charged.
    watchdog_s: float | None = 5.0
    watchdog_vm_s: float | None = None
    # Tenants must be confined from one another: refuses the in-process backend for more
    # than one VM (its guests are native code inside the VMM process, with no isolation).
    confined: bool = False


def device_clock(options: RunOptions) -> DeviceClock | VirtualClock:
    """The clock a run's GPUs share (a wall clock: one per GPU is the same thing)."""
    if options.clock not in (None, *CLOCKS):
        raise RunError(f"clock: unknown device clock {options.clock!r} (have "
                       f"{', '.join(CLOCKS)})")
    if options.clock == "wall":
        return DeviceClock(options.time_scale)
    return VirtualClock()


# ------------------------------------------------------------------------------ machines
class GpuDevice(VfioDevice, DeviceStats, Protocol):
    """What a machine hands a VM: a VFIO device the lab can also observe."""


class Machine(Protocol):
    """What a mode builds for one run: the GPU(s) and a device per VM."""

    clock: DeviceClock | VirtualClock  # the device clock its GPUs share

    def attach(self, spec: VmSpec) -> GpuDevice:
        """Create the VM's device (a vGPU, or a whole GPU passed through)."""
        ...

    def use_meter(self, spec: VmSpec, party: GuestParty) -> None:
        """On a virtual clock: charge the VM's device events to its vCPU, `party`."""
        ...

    def clock_scope(self, spec: VmSpec) -> object:
        """What the VM's guest waits on: whose signals wake it on a virtual clock."""
        ...

    def metrics(self, spec: VmSpec) -> VmMetrics | None:
        """The scheduler's record of the VM (None where nothing schedules it)."""
        ...

    def detach(self, spec: VmSpec) -> None:
        """The VM has stopped: give back what attach took (others keep running)."""
        ...

    def close(self) -> None: ...
