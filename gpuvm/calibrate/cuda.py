"""The few CUDA runtime calls calibration needs, through CuPy or PyTorch.

Both libraries are optional: importing this module needs neither, and `find_backend`
says in one line why no GPU can be used.  All copies are synchronous (they return once
the bytes are at their destination), so wall-clock timing around them is honest.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from typing import Protocol


class NoGpu(Exception):
    """No usable NVIDIA GPU or no CUDA library; the message says which."""


class CudaBackend(Protocol):
    """The few CUDA runtime calls the measurements make, so either library that offers them
    (cupy or torch) can be the one that makes them."""

    name: str

    def device_alloc(self, nbytes: int) -> int: ...

    def pinned_alloc(self, nbytes: int) -> int: ...

    def device_free(self, dev: int) -> None: ...

    def pinned_free(self, host: int) -> None: ...

    def h2d(self, dev: int, host: int, nbytes: int) -> None: ...

    def d2h(self, host: int, dev: int, nbytes: int) -> None: ...

    def register(self, host: int, nbytes: int) -> None: ...

    def unregister(self, host: int) -> None: ...

    def device_name(self) -> str: ...

    def runtime_version(self) -> str: ...

    def release(self) -> None: ...


class CupyBackend:
    """cupy.cuda.runtime: thin wrappers over cudaMalloc/cudaMemcpy/cudaHostRegister."""

    def __init__(self) -> None:
        # optional: only where the GPU is measured with cupy (see the module docstring)
        import cupy
        from cupy.cuda import runtime  # with cupy
        self.rt = runtime
        self.name = f"cupy {cupy.__version__}"
        try:
            if runtime.getDeviceCount() < 1:
                raise NoGpu("CUDA sees no GPU")
        except runtime.CUDARuntimeError as exc:
            raise NoGpu(f"CUDA runtime: {exc}") from None
        self._device: list[int] = []
        self._pinned: list[int] = []

    def device_alloc(self, nbytes: int) -> int:
        ptr = self.rt.malloc(nbytes)
        self._device.append(ptr)
        return ptr

    def pinned_alloc(self, nbytes: int) -> int:
        ptr = self.rt.hostAlloc(nbytes, 0)  # cudaHostAlloc, default flags
        self._pinned.append(ptr)
        return ptr

    def device_free(self, dev: int) -> None:
        self._device.remove(dev)
        self.rt.free(dev)

    def pinned_free(self, host: int) -> None:
        self._pinned.remove(host)
        self.rt.freeHost(host)

    def h2d(self, dev: int, host: int, nbytes: int) -> None:
        self.rt.memcpy(dev, host, nbytes, self.rt.memcpyHostToDevice)
        self.rt.deviceSynchronize()

    def d2h(self, host: int, dev: int, nbytes: int) -> None:
        self.rt.memcpy(host, dev, nbytes, self.rt.memcpyDeviceToHost)
        self.rt.deviceSynchronize()

    def register(self, host: int, nbytes: int) -> None:
        self.rt.hostRegister(host, nbytes, 0)

    def unregister(self, host: int) -> None:
        self.rt.hostUnregister(host)

    def device_name(self) -> str:
        name = self.rt.getDeviceProperties(0)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)

    def runtime_version(self) -> str:
        return _cuda_version(self.rt.runtimeGetVersion())

    def release(self) -> None:
        for ptr in self._device:
            self.rt.free(ptr)
        for ptr in self._pinned:
            self.rt.freeHost(ptr)
        self._device.clear()
        self._pinned.clear()


class TorchBackend:
    """PyTorch: tensors for the buffers, torch.cuda.cudart() for cudaHostRegister."""

    caches_pinned_frees = True  # freed pinned tensors go to PyTorch's cache, not the driver

    def __init__(self) -> None:
        import torch  # optional: only where the GPU is measured with PyTorch
        if not torch.cuda.is_available():
            raise NoGpu("PyTorch sees no CUDA GPU")
        self.torch = torch
        self.cudart = torch.cuda.cudart()
        self.name = f"torch {torch.__version__}"
        self._tensors: dict[int, object] = {}

    def _keep(self, tensor) -> int:
        ptr = tensor.data_ptr()
        self._tensors[ptr] = tensor
        return ptr

    def _device(self, dev: int, nbytes: int):
        """A view of nbytes at device address dev, inside one of our allocations."""
        for base, tensor in self._tensors.items():
            if base <= dev and dev + nbytes <= base + tensor.numel():
                return tensor[dev - base:dev - base + nbytes]
        raise ValueError(f"device range {dev:#x}+{nbytes} is not one this backend allocated")

    def _host(self, host: int, nbytes: int):
        buf = (ctypes.c_uint8 * nbytes).from_address(host)
        return self.torch.frombuffer(buf, dtype=self.torch.uint8)

    def device_alloc(self, nbytes: int) -> int:
        return self._keep(self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda"))

    def pinned_alloc(self, nbytes: int) -> int:
        return self._keep(self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True))

    def device_free(self, dev: int) -> None:
        self._tensors.pop(dev)

    def pinned_free(self, host: int) -> None:
        # PyTorch caches freed pinned blocks; the smart-pinning timings need the real
        # free, so they run on CuPy (cudaFreeHost) -- here the block only goes back to
        # PyTorch's cache
        self._tensors.pop(host)

    def h2d(self, dev: int, host: int, nbytes: int) -> None:
        self._device(dev, nbytes).copy_(self._host(host, nbytes))
        self.torch.cuda.synchronize()

    def d2h(self, host: int, dev: int, nbytes: int) -> None:
        self._host(host, nbytes).copy_(self._device(dev, nbytes))
        self.torch.cuda.synchronize()

    def register(self, host: int, nbytes: int) -> None:
        err = self.cudart.cudaHostRegister(host, nbytes, 0)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostRegister({host:#x}, {nbytes}) failed: {err}")

    def unregister(self, host: int) -> None:
        err = self.cudart.cudaHostUnregister(host)
        if int(err) != 0:
            raise RuntimeError(f"cudaHostUnregister({host:#x}) failed: {err}")

    def device_name(self) -> str:
        return self.torch.cuda.get_device_name(0)

    def runtime_version(self) -> str:
        return str(self.torch.version.cuda)

    def release(self) -> None:
        self._tensors.clear()
        self.torch.cuda.empty_cache()


CUDA_BACKENDS = {"cupy": CupyBackend, "torch": TorchBackend}


def _cuda_version(encoded: int) -> str:
    """CUDA's 1000*major + 10*minor -> 'major.minor'."""
    return f"{encoded // 1000}.{encoded % 1000 // 10}"


def find_backend(choice: str = "auto") -> CudaBackend:
    """The first backend that imports and sees a GPU, or NoGpu naming why none did."""
    names = list(CUDA_BACKENDS) if choice == "auto" else [choice]
    reasons = []
    for name in names:
        try:
            return CUDA_BACKENDS[name]()
        except ImportError:
            reasons.append(f"{name} is not installed")
        except NoGpu as exc:
            reasons.append(f"{name}: {exc}")
        except Exception as exc:  # a CUDA library that loads but cannot start
            reasons.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    raise NoGpu("no usable NVIDIA GPU (" + "; ".join(reasons) + ")")


def driver_version() -> str:
    """The NVIDIA driver version as nvidia-smi reports it, or 'unknown'."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "unknown"
    try:
        out = subprocess.run([smi, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.strip().splitlines()[0] if out.strip() else "unknown"
