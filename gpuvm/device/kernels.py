"""The compute engine's kernel library.

Real SASS cannot run here, so the "code" a guest uploads is a kernel object naming one
of these kernels (see KOBJ_* in regs.py).  Each kernel reads and writes GPU memory only
through the channel's address space (`KernelMemory`), computes its result with numpy, and
returns the device time the profile says it takes -- the functional result and the
modelled occupancy come from the same call.

The host work of a kernel stays on the engine's own thread: numpy's BLAS would otherwise
split a matrix product over one thread per host core and leave those threads spinning
for their next job, taking the cores the VMs' vCPUs run on.  `gpuvm bench device` measures
it: 200 128x128 mmul kernels kept 0.22-0.23 host cores busy with BLAS on one thread
against 7.12-7.17 with a thread per core (three runs on a 16-core host; 0.17-0.20
against 1.17-1.21 on 2 cores).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np
from threadpoolctl import threadpool_limits

from gpuvm.device import regs
from gpuvm.device.faults import ChannelError
from gpuvm.device.profile import ComputeCosts

MAX_ELEMENTS = 1 << 28  # 1 GiB of float32 per operand
MAX_MMUL_N = 4096


class KernelMemory(Protocol):
    """A kernel's view of GPU memory: its channel's address space, so a kernel can only touch
    what the channel maps."""

    def read(self, va: int, length: int) -> np.ndarray: ...

    def write(self, va: int, data: np.ndarray) -> None: ...


@dataclass(frozen=True)
class Kernel:
    """One kernel of the compute engine's library: what a guest's kernel object names, run with
    numpy, returning the device time the profile prices it at."""

    kernel_id: int
    name: str
    param_words: int
    run: Callable[[KernelMemory, list[int], ComputeCosts], int]


def _u64(words: list[int], i: int) -> int:
    return words[i] | (words[i + 1] << 32)


def _elements(n: int, what: str) -> int:
    if not 0 < n <= MAX_ELEMENTS:
        raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, f"{what} = {n}", n)
    return n


def _cost(costs: ComputeCosts, flops: float, nbytes: float) -> int:
    return int(costs.launch_ns + 1e9 * max(flops / costs.flops_per_s, nbytes / costs.bytes_per_s))


@functools.cache
def _blas_on_one_thread() -> None:
    """Once per process, before the first matrix product (see the module docstring):
    finding the BLAS libraries takes milliseconds, and the limit then holds."""
    threadpool_limits(limits=1, user_api="blas")


def _f32(mem: KernelMemory, va: int, n: int) -> np.ndarray:
    return mem.read(va, 4 * n).view(np.float32)


def _vecadd(mem: KernelMemory, p: list[int], costs: ComputeCosts) -> int:
    n = _elements(p[6], "vecadd n")
    mem.write(_u64(p, 4), (_f32(mem, _u64(p, 0), n) + _f32(mem, _u64(p, 2), n)).view(np.uint8))
    return _cost(costs, n, 12 * n)


def _madd(mem: KernelMemory, p: list[int], costs: ComputeCosts) -> int:
    n = _elements(p[6] * p[7], "madd rows*cols")
    mem.write(_u64(p, 4), (_f32(mem, _u64(p, 0), n) + _f32(mem, _u64(p, 2), n)).view(np.uint8))
    return _cost(costs, n, 12 * n)


def _mmul(mem: KernelMemory, p: list[int], costs: ComputeCosts) -> int:
    n = p[6]
    if not 0 < n <= MAX_MMUL_N:
        raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, f"mmul n = {n}", n)
    _blas_on_one_thread()
    a = _f32(mem, _u64(p, 0), n * n).reshape(n, n)
    b = _f32(mem, _u64(p, 2), n * n).reshape(n, n)
    mem.write(_u64(p, 4), np.matmul(a, b).astype(np.float32).view(np.uint8).reshape(-1))
    return _cost(costs, regs.KERNEL_MMUL_FLOPS_PER_FMA * n ** 3, 12 * n * n)


def _fmadd(mem: KernelMemory, p: list[int], costs: ComputeCosts) -> int:
    n = _elements(p[6], "fmadd n")
    c_va = _u64(p, 4)
    out = _f32(mem, _u64(p, 0), n) * _f32(mem, _u64(p, 2), n) + _f32(mem, c_va, n)
    mem.write(c_va, out.astype(np.float32).view(np.uint8))
    return _cost(costs, 2 * n, 16 * n)


def _loop(mem: KernelMemory, p: list[int], costs: ComputeCosts) -> int:
    iterations = _u64(p, 2)
    if iterations > 1 << 40:
        raise ChannelError(regs.CHAN_ERR_SIZE_LIMIT_EXT, f"loop iterations = {iterations}",
                           iterations)
    mem.write(_u64(p, 0), np.array([iterations & 0xFFFFFFFF], dtype=np.uint32).view(np.uint8))
    return int(costs.launch_ns + iterations * costs.loop_ns_per_iteration)


def _memset(mem: KernelMemory, p: list[int], costs: ComputeCosts) -> int:
    n = _elements(p[3], "memset words")
    mem.write(_u64(p, 0), np.full(n, p[2], dtype=np.uint32).view(np.uint8))
    return _cost(costs, 0, 4 * n)


KERNELS: dict[int, Kernel] = {k.kernel_id: k for k in (
    Kernel(regs.KERNEL_VECADD, "vecadd", 7, _vecadd),
    Kernel(regs.KERNEL_MADD, "madd", 8, _madd),
    Kernel(regs.KERNEL_MMUL, "mmul", 7, _mmul),
    Kernel(regs.KERNEL_FMADD, "fmadd", 7, _fmadd),
    Kernel(regs.KERNEL_LOOP, "loop", 4, _loop),
    Kernel(regs.KERNEL_MEMSET, "memset", 4, _memset),
)}


def parse_kernel_object(header: bytes) -> Kernel:
    """The kernel a 32-byte object names, or the channel error a bad object deserves."""
    words = np.frombuffer(header[:16], dtype=np.uint32).tolist()
    magic, version, kernel_id, param_words = words
    if magic != regs.KOBJ_MAGIC:
        raise ChannelError(regs.CHAN_ERR_BAD_KERNEL_OBJECT_EXT, f"magic {magic:#010x}", magic)
    if version != regs.KOBJ_VERSION:
        raise ChannelError(regs.CHAN_ERR_BAD_KERNEL_OBJECT_EXT, f"version {version}", version)
    kernel = KERNELS.get(kernel_id)
    if kernel is None:
        raise ChannelError(regs.CHAN_ERR_BAD_KERNEL_OBJECT_EXT, f"no kernel {kernel_id}",
                           kernel_id)
    if param_words != kernel.param_words:
        raise ChannelError(regs.CHAN_ERR_BAD_KERNEL_OBJECT_EXT,
                           f"{kernel.name} takes {kernel.param_words} parameter words, "
                           f"object says {param_words}", param_words)
    return kernel


def kernel_object(kernel_id: int) -> bytes:
    """The 32-byte object a driver uploads for a kernel (used by tests and tools)."""
    k = KERNELS[kernel_id]
    name = k.name.encode()[:15].ljust(16, b"\0")
    return np.array([regs.KOBJ_MAGIC, regs.KOBJ_VERSION, k.kernel_id, k.param_words],
                    dtype=np.uint32).tobytes() + name
