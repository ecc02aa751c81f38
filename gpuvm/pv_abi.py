"""The paravirtual hypercall ABI: what a PV guest driver and a PV vGPU agree on.

Page tables of a PV guest live in hypervisor VRAM; the guest names an address space by the
VRAM address of the page directory it would have used (its "pd key") and sends {va, pte}
entries in its own guest-physical terms; the vGPU validates and translates each entry.
The guest writes the guest-physical address of a record (header + entries) to the PV
vGPU's hypercall port (BAR4).  Kept apart from both sides so neither imports the other;
gpuvm/vmm/abi.py re-exports it into the generated guest header.
"""

from __future__ import annotations

import ctypes

HC_SET_PGD = 1  # args[0] = pd key: create the address space
HC_MAP_BATCH = 2  # args[0] = pd key; entries[0:count] = {va, pte} (4 KiB pages)
HC_UNMAP_BATCH = 3  # args[0] = pd key; entries[0:count].va
HC_VM_FLUSH = 4  # args[0] = pd key: TLB flush of that address space
HC_FREE_PGD = 5  # args[0] = pd key
HC_OK = 0
HC_EINVAL = -22  # a bad op or argument; args[3] = number of entries refused
HC_ENOMEM = -12  # the VM's shadow reserve cannot hold the tables this call needs
HC_MAX_ENTRIES = 2048  # one hypercall carries at most this many entries


class HcallEntry(ctypes.Structure):
    """One {va, pte} record of a PV page-table hypercall batch, laid out as the guest writes
    it."""

    _fields_ = [("va", ctypes.c_uint64), ("pte", ctypes.c_uint64)]


class HcallHeader(ctypes.Structure):
    """Followed in guest memory by `count` HcallEntry records."""

    _fields_ = [
        ("op", ctypes.c_uint32),
        ("count", ctypes.c_uint32),
        ("status", ctypes.c_int32),  # written by the hypervisor
        ("pad", ctypes.c_uint32),
        ("args", ctypes.c_uint64 * 4),
    ]


HCALL_HEADER_BYTES = ctypes.sizeof(HcallHeader)
