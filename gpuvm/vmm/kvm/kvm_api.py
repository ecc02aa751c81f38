"""The slice of <linux/kvm.h> this VMM uses: ioctl numbers, structs, exit layouts.

Struct sizes are asserted against the sizes verified on the target machine
(shared/reference/kvm.md) so that a typo in a field list fails at import, not as a
mysterious EINVAL or a corrupted register file.
"""

from __future__ import annotations

import ctypes

import numpy as np

# --------------------------------------------------------------------------------------
# ioctl number encoding (asm-generic/ioctl.h)
# --------------------------------------------------------------------------------------
_IOC_NRSHIFT, _IOC_TYPESHIFT, _IOC_SIZESHIFT, _IOC_DIRSHIFT = 0, 8, 16, 30
_IOC_NONE, _IOC_WRITE, _IOC_READ = 0, 1, 2
KVMIO = 0xAE


def _ioc(direction: int, nr: int, size: int) -> int:
    return ((direction << _IOC_DIRSHIFT) | (KVMIO << _IOC_TYPESHIFT)
            | (nr << _IOC_NRSHIFT) | (size << _IOC_SIZESHIFT))


def _io(nr: int) -> int:
    return _ioc(_IOC_NONE, nr, 0)


def _iow(nr: int, ctype: type) -> int:
    return _ioc(_IOC_WRITE, nr, ctypes.sizeof(ctype))


def _ior(nr: int, ctype: type) -> int:
    return _ioc(_IOC_READ, nr, ctypes.sizeof(ctype))


# --------------------------------------------------------------------------------------
# Structs
# --------------------------------------------------------------------------------------
class KvmRegs(ctypes.Structure):
    """struct kvm_regs (linux/kvm.h): a vCPU's general registers."""

    _fields_ = [(name, ctypes.c_uint64) for name in (
        "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rsp", "rbp",
        "r8", "r9", "r10", "r11", "r12", "r13", "r14", "r15", "rip", "rflags")]


class KvmSegment(ctypes.Structure):
    """struct kvm_segment (linux/kvm.h): one segment register."""

    _fields_ = [
        ("base", ctypes.c_uint64),
        ("limit", ctypes.c_uint32),
        ("selector", ctypes.c_uint16),
        ("type", ctypes.c_uint8),
        ("present", ctypes.c_uint8),
        ("dpl", ctypes.c_uint8),
        ("db", ctypes.c_uint8),
        ("s", ctypes.c_uint8),
        ("l", ctypes.c_uint8),
        ("g", ctypes.c_uint8),
        ("avl", ctypes.c_uint8),
        ("unusable", ctypes.c_uint8),
        ("padding", ctypes.c_uint8),
    ]


class KvmDtable(ctypes.Structure):
    """struct kvm_dtable (linux/kvm.h): the GDT or IDT base and limit."""

    _fields_ = [
        ("base", ctypes.c_uint64),
        ("limit", ctypes.c_uint16),
        ("padding", ctypes.c_uint16 * 3),
    ]


class KvmSregs(ctypes.Structure):
    """struct kvm_sregs (linux/kvm.h): segment and control registers, set once to enter 64-bit
    mode."""

    _fields_ = [
        ("cs", KvmSegment), ("ds", KvmSegment), ("es", KvmSegment), ("fs", KvmSegment),
        ("gs", KvmSegment), ("ss", KvmSegment), ("tr", KvmSegment), ("ldt", KvmSegment),
        ("gdt", KvmDtable), ("idt", KvmDtable),
        ("cr0", ctypes.c_uint64), ("cr2", ctypes.c_uint64), ("cr3", ctypes.c_uint64),
        ("cr4", ctypes.c_uint64), ("cr8", ctypes.c_uint64), ("efer", ctypes.c_uint64),
        ("apic_base", ctypes.c_uint64),
        ("interrupt_bitmap", ctypes.c_uint64 * 4),
    ]


class KvmUserspaceMemoryRegion(ctypes.Structure):
    """struct kvm_userspace_memory_region (linux/kvm.h): a memslot, guest RAM or a BAR page
    mapped straight into the guest."""

    _fields_ = [
        ("slot", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("guest_phys_addr", ctypes.c_uint64),
        ("memory_size", ctypes.c_uint64),
        ("userspace_addr", ctypes.c_uint64),
    ]


class KvmCoalescedMmioZone(ctypes.Structure):
    """A guest-physical range whose MMIO writes KVM queues in the ring instead of exiting
    (`pad` is the union's `pio`: 0 for MMIO)."""

    _fields_ = [
        ("addr", ctypes.c_uint64),
        ("size", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
    ]


# Verified sizes (kvm.md: "Struct sizes verified against <linux/kvm.h>")
assert ctypes.sizeof(KvmRegs) == 144
assert ctypes.sizeof(KvmSegment) == 24
assert ctypes.sizeof(KvmSregs) == 312
assert ctypes.sizeof(KvmUserspaceMemoryRegion) == 32
assert ctypes.sizeof(KvmCoalescedMmioZone) == 16

# --------------------------------------------------------------------------------------
# ioctls
# --------------------------------------------------------------------------------------
KVM_GET_API_VERSION = _io(0x00)
KVM_CREATE_VM = _io(0x01)
KVM_CHECK_EXTENSION = _io(0x03)
KVM_GET_VCPU_MMAP_SIZE = _io(0x04)
KVM_CREATE_VCPU = _io(0x41)
KVM_SET_USER_MEMORY_REGION = _iow(0x46, KvmUserspaceMemoryRegion)
KVM_REGISTER_COALESCED_MMIO = _iow(0x67, KvmCoalescedMmioZone)
KVM_UNREGISTER_COALESCED_MMIO = _iow(0x68, KvmCoalescedMmioZone)
KVM_RUN = _io(0x80)
KVM_GET_REGS = _ior(0x81, KvmRegs)
KVM_SET_REGS = _iow(0x82, KvmRegs)
KVM_GET_SREGS = _ior(0x83, KvmSregs)
KVM_SET_SREGS = _iow(0x84, KvmSregs)

assert KVM_SET_USER_MEMORY_REGION == 0x4020AE46
assert KVM_GET_REGS == 0x8090AE81
assert KVM_SET_SREGS == 0x4138AE84
assert KVM_REGISTER_COALESCED_MMIO == 0x4010AE67

KVM_API_VERSION = 12

# capabilities (KVM_CHECK_EXTENSION)
KVM_CAP_USER_MEMORY = 3
KVM_CAP_NR_MEMSLOTS = 10
KVM_CAP_COALESCED_MMIO = 15  # the answer is the ring's page offset in the vCPU mmap
KVM_CAP_READONLY_MEM = 81
KVM_CAP_IMMEDIATE_EXIT = 136

# memory region flags
KVM_MEM_READONLY = 1 << 1

# --------------------------------------------------------------------------------------
# struct kvm_run (the vCPU mmap): byte offsets of the fields we read
# --------------------------------------------------------------------------------------
RUN_IMMEDIATE_EXIT = 1  # u8
RUN_EXIT_REASON = 8  # u32
RUN_UNION = 32
# KVM_EXIT_MMIO
RUN_MMIO_PHYS_ADDR = 32  # u64
RUN_MMIO_DATA = 40  # u8[8]
RUN_MMIO_LEN = 48  # u32
RUN_MMIO_IS_WRITE = 52  # u8
# KVM_EXIT_IO
RUN_IO_DIRECTION = 32  # u8: 0 = in, 1 = out
RUN_IO_SIZE = 33  # u8
RUN_IO_PORT = 34  # u16
RUN_IO_COUNT = 36  # u32
RUN_IO_DATA_OFFSET = 40  # u64, from the start of kvm_run
KVM_EXIT_IO_IN = 0
KVM_EXIT_IO_OUT = 1

# --------------------------------------------------------------------------------------
# struct kvm_coalesced_mmio_ring (one page of the vCPU mmap, at the page offset
# KVM_CHECK_EXTENSION(KVM_CAP_COALESCED_MMIO) answers): u32 first (the VMM's: next entry
# to take), u32 last (KVM's: next entry to fill), then struct kvm_coalesced_mmio entries
# {u64 phys_addr; u32 len; u32 pio; u8 data[8]} to the page's end.  Empty when
# first == last; KVM leaves one entry free, and a write that finds the ring full exits
# as an ordinary KVM_EXIT_MMIO.
# --------------------------------------------------------------------------------------
RING_FIRST = 0  # u32
RING_LAST = 4  # u32
RING_ENTRIES = 8
RING_ENTRY_SIZE = 24
RING_ENTRY_PHYS_ADDR = 0  # u64
RING_ENTRY_LEN = 8  # u32
RING_ENTRY_DATA = 16  # u8[8]
PAGE_SIZE = 4096
# the entries as numpy reads a drain of them at once (data: little-endian, `len` bytes)
RING_ENTRY_DTYPE = np.dtype([("phys_addr", "<u8"), ("len", "<u4"), ("pio", "<u4"),
                             ("data", "<u8")])
assert RING_ENTRY_DTYPE.itemsize == RING_ENTRY_SIZE and \
    RING_ENTRY_DTYPE.fields["len"][1] == RING_ENTRY_LEN and \
    RING_ENTRY_DTYPE.fields["data"][1] == RING_ENTRY_DATA
RING_MAX = (PAGE_SIZE - RING_ENTRIES) // RING_ENTRY_SIZE  # 170: entries the ring indexes
# KVM_EXIT_FAIL_ENTRY: hardware_entry_failure_reason u64 @32
# KVM_EXIT_INTERNAL_ERROR: suberror u32 @32, ndata u32 @36, data u64[] @40

# exit reasons
KVM_EXIT_UNKNOWN = 0
KVM_EXIT_EXCEPTION = 1
KVM_EXIT_IO = 2
KVM_EXIT_HYPERCALL = 3
KVM_EXIT_DEBUG = 4
KVM_EXIT_HLT = 5
KVM_EXIT_MMIO = 6
KVM_EXIT_IRQ_WINDOW_OPEN = 7
KVM_EXIT_SHUTDOWN = 8
KVM_EXIT_FAIL_ENTRY = 9
KVM_EXIT_INTR = 10
KVM_EXIT_INTERNAL_ERROR = 17
KVM_EXIT_SYSTEM_EVENT = 24

EXIT_NAMES = {
    KVM_EXIT_UNKNOWN: "UNKNOWN", KVM_EXIT_EXCEPTION: "EXCEPTION", KVM_EXIT_IO: "IO",
    KVM_EXIT_HYPERCALL: "HYPERCALL", KVM_EXIT_DEBUG: "DEBUG", KVM_EXIT_HLT: "HLT",
    KVM_EXIT_MMIO: "MMIO", KVM_EXIT_IRQ_WINDOW_OPEN: "IRQ_WINDOW_OPEN",
    KVM_EXIT_SHUTDOWN: "SHUTDOWN", KVM_EXIT_FAIL_ENTRY: "FAIL_ENTRY",
    KVM_EXIT_INTR: "INTR", KVM_EXIT_INTERNAL_ERROR: "INTERNAL_ERROR",
    KVM_EXIT_SYSTEM_EVENT: "SYSTEM_EVENT",
}

# KVM_INTERNAL_ERROR suberrors
INTERNAL_ERROR_NAMES = {1: "emulation failure", 2: "simultaneous exception",
                        3: "delivery event", 4: "unexpected exit reason"}


def exit_name(reason: int) -> str:
    return EXIT_NAMES.get(reason, str(reason))
