"""The guest <-> VMM ABI: guest-physical layout, ports, boot parameters, wait and
hypercall records.

One definition serves the KVM backend, the in-process backend, the mediator's PV path and
(through the generated header ``gpuvm_abi.h``) the C guest tools.  The layout is the same
for both backends so that a benchmark produces identical counters on either.

Every address the guest hands the VMM (strings, wait records, hypercall pages) is a
guest-physical address; the in-process platform layer converts its pointers with
``phys_offset`` before passing them.
"""

from __future__ import annotations

import ctypes
import sys

from gpuvm.device import regs

# --------------------------------------------------------------------------------------
# Guest-physical layout
# --------------------------------------------------------------------------------------
GUEST_PAGE_TABLES = 0x1000  # identity page tables written by the KVM host (0x1000-0x7fff)
GUEST_BOOT_PARAMS = 0x8000  # one page: struct gpuvm_boot_params
GUEST_STACK_TOP = 0x200000  # the stack grows down from here
GUEST_IMAGE_BASE = 0x200000  # flat binary load address (entry point = first byte)
GUEST_IMAGE_MAX = 0x200000  # image + .bss must end below GUEST_HEAP_BASE
GUEST_HEAP_BASE = 0x400000  # guest allocator starts here (same on every backend)
GUEST_RAM_DEFAULT = 256 * regs.MiB
GUEST_RAM_MAX = 3 * regs.GiB  # RAM must end below the BAR windows

# Where a KVM guest finds each BAR (guest-physical; identity mapped)
GUEST_BAR0_BASE = 0xC0000000
GUEST_BAR1_BASE = 0xD0000000
GUEST_BAR3_BASE = 0xE0000000
BAR_BASES = {regs.BAR0: GUEST_BAR0_BASE, regs.BAR1: GUEST_BAR1_BASE, regs.BAR3: GUEST_BAR3_BASE}
GUEST_IDENTITY_MAP_TOP = 4 * regs.GiB

# --------------------------------------------------------------------------------------
# Ports (32-bit `out`/`in`; the value is a guest-physical address unless noted)
# --------------------------------------------------------------------------------------
PORT_CONSOLE = 0x500  # out: address of a NUL-terminated line for the VM's log
PORT_RESULT = 0x504  # out: address of a NUL-terminated "key=value ..." result record
PORT_WAIT = 0x508  # out: address of a struct gpuvm_wait; returns when it is satisfied
PORT_HYPERCALL = 0x50C  # out: address of a struct gpuvm_hcall (paravirtual build only)
PORT_EXIT = 0x510  # out: exit code; the guest is finished
PORT_PHASE = 0x514  # out: phase id (below); counters and clocks are cut at each mark
# out: address of a struct gpuvm_hostmem_event: the runtime tells the VMM about host-memory
# allocations, pins/unpins of guest pages and transfers (only with BOOT_FLAG_HOSTMEM_REPORT)
PORT_HOSTMEM = 0x518
PORT_FIRST = PORT_CONSOLE
PORT_LAST = PORT_HOSTMEM

PHASE_INIT = 0
PHASE_HTOD = 1
PHASE_LAUNCH = 2
PHASE_DTOH = 3
PHASE_CLOSE = 4
PHASE_NAMES = ("Init", "HtoD", "Launch", "DtoH", "Close")

# --------------------------------------------------------------------------------------
# Boot parameters
# --------------------------------------------------------------------------------------
BOOT_MAGIC = 0x42565047  # "GPVB"
BOOT_VERSION = 1
BOOT_NUM_PARAMS = 8
BOOT_BENCH_NAME_LEN = 32
BOOT_NUM_BARS = 6

# flags
BOOT_FLAG_PV = 1 << 0  # set by the VMM when it runs the PV build (informational)
# Host memory (issue 16): the runtime reports its host-memory events on PORT_HOSTMEM, and
# with PIN_CHUNKS copies pageable memory by pinning it chunk by chunk (the guest pages of a
# chunk are mapped into the GPU for the copy, then unmapped) instead of staging it through
# its pinned bounce buffer.  Chunk size: 1 << field, 0 = HM_DEFAULT_CHUNK_SHIFT (4 MiB).
BOOT_FLAG_HOSTMEM_REPORT = 1 << 1
BOOT_FLAG_PIN_CHUNKS = 1 << 2
BOOT_PIN_CHUNK_SHIFT = 16
BOOT_PIN_CHUNK_MASK = 0x3F
HM_DEFAULT_CHUNK_SHIFT = 22
# Fault injection: the driver deliberately programs garbage (tests, `--inject`)
BOOT_FI_SHIFT = 8
BOOT_FI_MASK = 0xFF
FI_NONE = 0
FI_BAD_METHOD = 1  # a pushbuffer entry with an invalid method header
FI_UNMAPPED_COPY = 2  # a copy from a GPU VA that is not mapped
FI_BAD_KERNEL = 3  # a kernel object with a bad magic
FI_UNKNOWN_CLASS = 4  # bind an object of a class the GPU does not have
FI_NAMES = {
    "bad-method": FI_BAD_METHOD,
    "unmapped-copy": FI_UNMAPPED_COPY,
    "bad-kernel": FI_BAD_KERNEL,
    "unknown-class": FI_UNKNOWN_CLASS,
}


class BootParams(ctypes.Structure):
    """Placed at GUEST_BOOT_PARAMS; its address is the guest entry's first argument."""

    _fields_ = [
        ("magic", ctypes.c_uint32),
        ("version", ctypes.c_uint32),
        ("ram_size", ctypes.c_uint64),
        # host virtual address of guest-physical 0 (in-process); 0 on KVM
        ("phys_offset", ctypes.c_uint64),
        ("heap_start", ctypes.c_uint64),  # guest-physical
        ("bar_base", ctypes.c_uint64 * BOOT_NUM_BARS),  # KVM: guest-physical BAR windows
        ("bar_size", ctypes.c_uint64 * BOOT_NUM_BARS),
        ("flags", ctypes.c_uint64),
        ("params", ctypes.c_uint64 * BOOT_NUM_PARAMS),
        # in-process only: C function pointers into the VMM (see gpuvm_abi.h typedefs)
        ("host_mmio_read", ctypes.c_uint64),
        ("host_mmio_write", ctypes.c_uint64),
        ("host_port_out", ctypes.c_uint64),
        ("host_port_in", ctypes.c_uint64),
        ("bench", ctypes.c_char * BOOT_BENCH_NAME_LEN),
        # in-process only: per BAR, 0 or the host address of a u64 array with one entry per
        # 4 KiB page of the BAR: 0 = trap (call host_mmio_*), else the host address the
        # page is remapped to (the in-process equivalent of a KVM memslot over VRAM)
        ("host_bar_pages", ctypes.c_uint64 * BOOT_NUM_BARS),
        # KVM: the guest's own count of its loads and stores per BAR, each counted once
        # the access has completed.  A passed-through GPU maps its apertures into the
        # guest as memory (no exit); the VMM counts the accesses that did not exit from
        # these, so they remain the bare-metal accesses the model prices
        ("bar_reads", ctypes.c_uint64 * BOOT_NUM_BARS),
        ("bar_writes", ctypes.c_uint64 * BOOT_NUM_BARS),
    ]


# --------------------------------------------------------------------------------------
# Wait records (PORT_WAIT): block until *(u32 *)addr - value >= 0 (wrapping compare)
# --------------------------------------------------------------------------------------
WAIT_OK = 0
WAIT_TIMEOUT = 1
WAIT_FAULT = 2  # a channel of this VM faulted while waiting


class WaitRecord(ctypes.Structure):
    """A guest's PORT_WAIT request: sleep until the u32 at a guest-physical address reaches a
    value (a fence), so the vCPU does not spin while the GPU works."""

    _fields_ = [
        ("addr", ctypes.c_uint64),  # guest-physical address of a u32 fence word
        ("value", ctypes.c_uint32),
        ("status", ctypes.c_uint32),  # written by the VMM
        ("timeout_ns", ctypes.c_uint64),  # wall-clock limit; 0 = the VMM's default
    ]


# --------------------------------------------------------------------------------------
# Hypercalls (PORT_HYPERCALL, the PV vGPU's BAR4 port), paravirtual build: defined in
# gpuvm/pv_abi.py, which the vGPU shares; re-exported here for the guest header.
# --------------------------------------------------------------------------------------
from gpuvm.pv_abi import (HC_EINVAL, HC_ENOMEM, HC_FREE_PGD, HC_MAP_BATCH,  # noqa: E402
                          HC_MAX_ENTRIES,
                          HC_OK, HC_SET_PGD, HC_UNMAP_BATCH, HC_VM_FLUSH, HCALL_HEADER_BYTES,
                          HcallEntry, HcallHeader)

# --------------------------------------------------------------------------------------
# Host-memory events (PORT_HOSTMEM)
# --------------------------------------------------------------------------------------
HM_ALLOC = 1  # alloc = new id, arg = 1 when the allocation is pinned
HM_FREE = 2
HM_PIN = 3  # [gpa, gpa+bytes) pinned for DMA; arg = 1 when the device will write it
HM_UNPIN = 4
HM_HTOD = 5  # one memcpy call; arg = HM_HOW_*
HM_DTOH = 6
HM_OPS = {HM_ALLOC: "alloc", HM_FREE: "free", HM_PIN: "pin", HM_UNPIN: "unpin",
          HM_HTOD: "htod", HM_DTOH: "dtoh"}
HM_HOW_PINNED = 0  # straight from/to pinned memory
HM_HOW_STAGED = 1  # staged through the pinned bounce buffer (pageable)
HM_HOW_CHUNKS = 2  # pageable, pinned chunk by chunk for the copy
HM_HOW_NAMES = ("pinned", "staged", "chunks")


class HostmemEvent(ctypes.Structure):
    """One host-memory report of the guest runtime (alloc, pin, unpin, free of a range) to
    PORT_HOSTMEM: how the VMM learns what a driver would pin."""

    _fields_ = [
        ("op", ctypes.c_uint32),
        ("arg", ctypes.c_uint32),
        ("alloc", ctypes.c_uint32),  # the runtime's allocation id (0 = none)
        ("pad", ctypes.c_uint32),
        ("gpa", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
    ]

_C_TYPES = {
    ctypes.c_uint32: "uint32_t",
    ctypes.c_int32: "int32_t",
    ctypes.c_uint64: "uint64_t",
    ctypes.c_char: "char",
}


def _c_struct(name: str, struct: type[ctypes.Structure]) -> str:
    body = []
    for field, ctype in struct._fields_:
        if hasattr(ctype, "_length_"):
            body.append(f"    {_C_TYPES[ctype._type_]} {field}[{ctype._length_}];")
        elif issubclass(ctype, ctypes.Structure):
            raise TypeError(f"nested struct {field} not supported")
        else:
            body.append(f"    {_C_TYPES[ctype]} {field};")
    size = ctypes.sizeof(struct)
    return (f"struct {name} {{\n" + "\n".join(body) + "\n};\n"
            f"_Static_assert(sizeof(struct {name}) == {size}, \"{name} size\");\n")


def c_header() -> str:
    """The ABI as a C header for the guest tools."""
    out = [
        "/* Generated from gpuvm/vmm/abi.py -- do not edit. */",
        "#ifndef GPUVM_ABI_H",
        "#define GPUVM_ABI_H",
        "#include <stdint.h>",
    ]
    for name, value in vars(sys.modules[__name__]).items():
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool):
            out.append(f"#define {name} ({value})" if value < 0
                       else f"#define {name} 0x{value:x}ULL" if value > 0xFFFFFFFF
                       else f"#define {name} 0x{value:x}u")
    for i, phase in enumerate(PHASE_NAMES):
        out.append(f"/* phase {i}: {phase} */")
    out.append(_c_struct("gpuvm_boot_params", BootParams))
    out.append(_c_struct("gpuvm_wait", WaitRecord))
    out.append(_c_struct("gpuvm_hcall_entry", HcallEntry))
    out.append(_c_struct("gpuvm_hcall", HcallHeader))
    out.append(_c_struct("gpuvm_hostmem_event", HostmemEvent))
    out.append("typedef uint64_t (*gpuvm_host_mmio_read_fn)(uint32_t bar, uint64_t offset,"
               " uint32_t size);")
    out.append("typedef void (*gpuvm_host_mmio_write_fn)(uint32_t bar, uint64_t offset,"
               " uint32_t size, uint64_t value);")
    out.append("typedef void (*gpuvm_host_port_out_fn)(uint32_t port, uint32_t value);")
    out.append("typedef uint32_t (*gpuvm_host_port_in_fn)(uint32_t port);")
    out.append("#endif")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(c_header())
