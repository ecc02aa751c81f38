"""Loading a guest shared library privately.

dlopen() returns the same handle for the same file, so two guests loading one .so would
share their C globals (the driver's state).  Each guest therefore loads its own copy,
made under a fresh temporary name and unlinked as soon as it is mapped, and unloads it
with dlclose() when the guest is done.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import tempfile
from pathlib import Path

import _ctypes


class GuestLibraryError(Exception):
    """The guest library cannot be loaded or lacks the guest ABI's symbols."""


class PrivateLibrary:
    """One guest's own mapping of a guest shared library."""

    def __init__(self, path: Path, name: str) -> None:
        path = Path(path)
        if not path.is_file():
            raise GuestLibraryError(f"{name}: guest library {path} does not exist")
        fd, copy = tempfile.mkstemp(prefix=f"gpuvm-{name}-", suffix=".so")
        try:
            with os.fdopen(fd, "wb") as out, open(path, "rb") as src:
                shutil.copyfileobj(src, out)
            self.cdll = ctypes.CDLL(copy, mode=os.RTLD_NOW | os.RTLD_LOCAL)
        except OSError as exc:
            raise GuestLibraryError(f"{name}: cannot load guest library {path}: {exc}") from exc
        finally:
            os.unlink(copy)
        try:
            self.entry = self.cdll.gpuvm_guest_entry
            self.abort_flag = ctypes.c_int.in_dll(self.cdll, "gpuvm_host_abort")
        except ValueError as exc:
            self.close()
            raise GuestLibraryError(f"{name}: {path} is not a gpuvm guest library ({exc})") \
                from exc
        self.entry.argtypes = [ctypes.c_void_p]
        self.entry.restype = ctypes.c_int

    def close(self) -> None:
        """Unmap the library; nothing may call into it afterwards."""
        cdll = getattr(self, "cdll", None)
        if cdll is not None:
            self.entry = None
            self.abort_flag = None
            self.cdll = None
            _ctypes.dlclose(cdll._handle)
