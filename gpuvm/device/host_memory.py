"""Host memory calls Python's mmap module does not offer: sealed memfds, an address range
reserved with nothing behind it, and mapping a memfd at a fixed address inside it.

VRAM (gpuvm/device/vram.py) is one contiguous range of this process made of several
memfds, so that each can be handed to a different process without exposing the others;
that needs MAP_FIXED, which `mmap.mmap` cannot do, hence libc through ctypes.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os

# Linux mmap/madvise ABI (include/uapi/asm-generic/mman*.h); the mmap module names some
PROT_NONE = 0
PROT_READ_WRITE = mmap.PROT_READ | mmap.PROT_WRITE
MAP_SHARED = mmap.MAP_SHARED
MAP_PRIVATE = mmap.MAP_PRIVATE
MAP_ANONYMOUS = mmap.MAP_ANONYMOUS
MAP_FIXED = 0x10
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
MADV_REMOVE = getattr(mmap, "MADV_REMOVE", 9)
# A client given the fd may not resize it: shrinking would SIGBUS whoever maps the pages
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value


def _os_error(what: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, f"{what}: {os.strerror(err)}")


def sealed_memfd(name: str, size: int) -> int:
    """A memfd of `size` bytes (sparse: pages exist once touched) whose size is sealed."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    except OSError:
        os.close(fd)
        raise
    return fd


def reserve(size: int) -> int:
    """An address range of `size` bytes with no access and no memory behind it."""
    address = _libc.mmap(None, size, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if address == _MAP_FAILED:
        raise _os_error(f"reserving {size:#x} bytes of address space")
    return address


def map_fixed(address: int, size: int, fd: int, offset: int) -> None:
    """Make [address, address + size) bytes [offset, offset + size) of `fd`, shared and
    read-write, replacing whatever was mapped there (atomically, for other threads)."""
    got = _libc.mmap(address, size, PROT_READ_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE,
                     fd, offset)
    if got == _MAP_FAILED or got != address:
        raise _os_error(f"mapping fd {fd} at {address:#x}")


def punch(address: int, size: int) -> None:
    """Free the pages behind a shared mapping's range: it reads as zeroes afterwards."""
    if _libc.madvise(address, size, MADV_REMOVE) != 0:
        raise _os_error(f"MADV_REMOVE of [{address:#x}, +{size:#x})")


def unmap(address: int, size: int) -> None:
    if _libc.munmap(address, size) != 0:
        raise _os_error(f"munmap of [{address:#x}, +{size:#x})")


def close_memfd_mapping(fd: int, mapping: mmap.mmap) -> None:
    """Close a memfd (fd < 0: already closed) and its mapping.  A view handed out
    earlier (numpy, ctypes) may still hold the map: then the GC frees it with that view."""
    if fd >= 0:
        os.close(fd)
    try:
        mapping.close()
    except BufferError:
        pass
