"""Guests on real vCPUs through /dev/kvm, from Python (ctypes structs + fcntl.ioctl).

Modules, one job each: kvm_api (ABI numbers and structs), vm (fds and the kvm_run
mapping), long_mode (page tables and CPL3 registers), memslots (BAR remap), vcpu (the
exit loop, which also drains the coalesced-MMIO ring and counts accesses to pages mapped
as memory), flusher (the ring's bounded wait), kick (stopping a running vCPU), runner
(KvmRunner: thread, outcome, which stores are coalesced).
"""

from __future__ import annotations

import fcntl
import os

from gpuvm.vmm.kvm import kvm_api as api
from gpuvm.vmm.kvm.vm import KvmError, create_vm_fd, open_kvm


def kvm_usable() -> tuple[bool, str]:
    """(True, description) when this process can run KVM guests, else (False, one-line
    reason): /dev/kvm opens, speaks API 12, and a VM can be created."""
    try:
        kvm_fd = open_kvm()
    except KvmError as exc:
        return False, str(exc)
    try:
        try:
            vm_fd = create_vm_fd(kvm_fd)
        except KvmError as exc:
            return False, f"/dev/kvm opens but {exc}"
        os.close(vm_fd)
        if not fcntl.ioctl(kvm_fd, api.KVM_CHECK_EXTENSION, api.KVM_CAP_USER_MEMORY):
            return False, "KVM lacks KVM_CAP_USER_MEMORY"
        return True, "/dev/kvm usable (API 12, VM creation works)"
    finally:
        os.close(kvm_fd)


__all__ = ["kvm_usable", "KvmError"]
