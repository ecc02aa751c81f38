"""One KVM virtual machine with one vCPU: the file descriptors and the kvm_run mapping.

Everything here is setup-time code (none of it is on the exit path); the exit loop in
vcpu.py reads the kvm_run mapping this class owns.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass, field

from gpuvm.vmm.kvm import kvm_api as api

KVM_DEVICE = "/dev/kvm"


class KvmError(Exception):
    """A KVM ioctl failed during setup; the message names the operation."""


def open_kvm() -> int:
    """An fd on /dev/kvm whose API version is the stable one (12)."""
    try:
        fd = os.open(KVM_DEVICE, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise KvmError(f"{KVM_DEVICE} does not exist (no KVM on this machine)") from exc
    except PermissionError as exc:
        raise KvmError(f"no permission to open {KVM_DEVICE} (run as root or join the "
                       f"kvm group)") from exc
    except OSError as exc:
        raise KvmError(f"cannot open {KVM_DEVICE}: {exc.strerror}") from exc
    try:
        version = fcntl.ioctl(fd, api.KVM_GET_API_VERSION)
        if version != api.KVM_API_VERSION:
            raise KvmError(f"KVM API version {version}, expected {api.KVM_API_VERSION}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _ioctl(fd: int, request: int, arg: int | bytes | bytearray | memoryview = 0,
           what: str = "ioctl") -> int:
    try:
        return fcntl.ioctl(fd, request, arg)
    except OSError as exc:
        raise KvmError(f"{what} failed: {exc.strerror}") from exc


def create_vm_fd(kvm_fd: int) -> int:
    """KVM_CREATE_VM, again while a signal interrupts it (EINTR, as QEMU's kvm_init
    does): the kernel gives up on taking the process's memory locks when a signal is
    pending -- a profiler attaching, a child exiting -- and nothing is wrong."""
    while True:
        try:
            return fcntl.ioctl(kvm_fd, api.KVM_CREATE_VM, 0)
        except InterruptedError:
            continue
        except OSError as exc:
            raise KvmError(f"KVM_CREATE_VM failed: {exc.strerror}") from exc


def _lies_in(gpa: int, size: int, zone: tuple[int, int]) -> bool:
    """Whether [gpa, gpa+size) lies inside the coalesced zone (gpa, size) `zone`: KVM's
    test both for a store it may queue and for the zones an unregister drops."""
    return zone[0] <= gpa and gpa + size <= zone[0] + zone[1]


@dataclass
class KvmVm:
    """A VM fd, one vCPU fd and its kvm_run mmap; `close()` releases all of them."""

    kvm_fd: int
    vm_fd: int
    vcpu_fd: int = -1
    run: mmap.mmap | None = field(default=None, repr=False)
    max_memslots: int = 0
    readonly_mem: bool = False
    # byte offset of the coalesced-MMIO ring in `run`; 0: KVM has none
    coalesced_ring: int = 0
    # the zones registered now, as (gpa, size): where stores are posted, not trapped
    zones: list[tuple[int, int]] = field(default_factory=list, repr=False)

    @classmethod
    def create(cls) -> "KvmVm":
        kvm_fd = open_kvm()
        try:
            vm_fd = create_vm_fd(kvm_fd)
        except BaseException:
            os.close(kvm_fd)
            raise
        vm = cls(kvm_fd, vm_fd)
        try:
            vm.max_memslots = vm.check_extension(api.KVM_CAP_NR_MEMSLOTS) or 32
            vm.readonly_mem = bool(vm.check_extension(api.KVM_CAP_READONLY_MEM))
            vm.vcpu_fd = _ioctl(vm_fd, api.KVM_CREATE_VCPU, 0, "KVM_CREATE_VCPU")
            size = _ioctl(kvm_fd, api.KVM_GET_VCPU_MMAP_SIZE, 0, "KVM_GET_VCPU_MMAP_SIZE")
            vm.run = mmap.mmap(vm.vcpu_fd, size, flags=mmap.MAP_SHARED,
                               prot=mmap.PROT_READ | mmap.PROT_WRITE)
            page = vm.check_extension(api.KVM_CAP_COALESCED_MMIO)
            if page and (page + 1) * api.PAGE_SIZE <= size:
                vm.coalesced_ring = page * api.PAGE_SIZE
        except BaseException:
            vm.close()
            raise
        return vm

    def check_extension(self, cap: int) -> int:
        try:
            return fcntl.ioctl(self.vm_fd, api.KVM_CHECK_EXTENSION, cap)
        except OSError:
            return 0

    def set_memory_region(self, slot: int, gpa: int, size: int, host_address: int,
                          flags: int = 0) -> None:
        """Create (size > 0) or delete (size == 0) memslot `slot`."""
        region = api.KvmUserspaceMemoryRegion(slot, flags, gpa, size, host_address)
        _ioctl(self.vm_fd, api.KVM_SET_USER_MEMORY_REGION, bytes(region),
               f"KVM_SET_USER_MEMORY_REGION (slot {slot}, gpa {gpa:#x}, size {size:#x})")

    def coalesce(self, gpa: int, size: int) -> None:
        """Queue the guest's MMIO writes to [gpa, gpa+size) in the coalesced ring instead
        of exiting on each (reads still exit); the exit loop hands them on in order."""
        if not self.coalesced_ring:
            raise KvmError("KVM lacks KVM_CAP_COALESCED_MMIO")
        zone = api.KvmCoalescedMmioZone(gpa, size, 0)
        _ioctl(self.vm_fd, api.KVM_REGISTER_COALESCED_MMIO, bytes(zone),
               f"KVM_REGISTER_COALESCED_MMIO (gpa {gpa:#x}, size {size:#x})")
        self.zones.append((gpa, size))

    def uncoalesce(self, gpa: int, size: int) -> None:
        """Stores to a zone `coalesce` registered exit again, each (the ring must have
        been drained of them first: the exit loop drains before it handles any exit)."""
        zone = api.KvmCoalescedMmioZone(gpa, size, 0)
        _ioctl(self.vm_fd, api.KVM_UNREGISTER_COALESCED_MMIO, bytes(zone),
               f"KVM_UNREGISTER_COALESCED_MMIO (gpa {gpa:#x}, size {size:#x})")
        # KVM drops every zone the range lies in
        self.zones = [zone for zone in self.zones if not _lies_in(gpa, size, zone)]

    def posts_at(self, gpa: int, size: int) -> bool:
        """Whether a store of `size` bytes at `gpa` is posted (lies in a registered zone,
        as KVM requires of a store it queues)."""
        return any(_lies_in(gpa, size, zone) for zone in self.zones)

    def get_regs(self) -> api.KvmRegs:
        regs = api.KvmRegs()
        _ioctl_into(self.vcpu_fd, api.KVM_GET_REGS, regs, "KVM_GET_REGS")
        return regs

    def set_regs(self, regs: api.KvmRegs) -> None:
        _ioctl(self.vcpu_fd, api.KVM_SET_REGS, bytes(regs), "KVM_SET_REGS")

    def get_sregs(self) -> api.KvmSregs:
        sregs = api.KvmSregs()
        _ioctl_into(self.vcpu_fd, api.KVM_GET_SREGS, sregs, "KVM_GET_SREGS")
        return sregs

    def set_sregs(self, sregs: api.KvmSregs) -> None:
        _ioctl(self.vcpu_fd, api.KVM_SET_SREGS, bytes(sregs), "KVM_SET_SREGS")

    def close(self) -> None:
        """Release the run mapping and every fd (idempotent).  Views on `run` must be
        released first (an mmap with live exports cannot be closed)."""
        if self.run is not None:
            self.run.close()
            self.run = None
        for name in ("vcpu_fd", "vm_fd", "kvm_fd"):
            fd = getattr(self, name)
            if fd >= 0:
                os.close(fd)
                setattr(self, name, -1)


def _ioctl_into(fd: int, request: int, struct: object, what: str) -> None:
    try:
        fcntl.ioctl(fd, request, struct, True)  # type: ignore[call-overload]
    except OSError as exc:
        raise KvmError(f"{what} failed: {exc.strerror}") from exc
