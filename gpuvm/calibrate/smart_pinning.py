"""Smart pinning on a real GPU: when does pinning a host allocation pay for itself?

The workload is the emulator's smart-pinning benchmark (guest_tools/bench/hostmem.c) run
for real: `allocations` host buffers of one size are allocated and filled, every
`stride`-th one is copied to the GPU and back in each of `rounds` rounds, the others
once, and all are freed.  What is timed is that whole life -- allocation, filling,
copies, free -- because pinning moves cost from the copies into allocation and free.

Three policies: "none" allocates pageable memory (malloc) and is also the profile run
(it records how often each allocation was copied); "smart" pins (cudaHostAlloc) only the
allocations that profile saw copied more than HOT_THRESHOLD times; "all" pins every one.
"""

from __future__ import annotations

import ctypes
import time
from typing import Callable

from gpuvm.calibrate.cuda import CudaBackend, NoGpu
from gpuvm.calibrate.profile import SmartPin
from gpuvm.calibrate.stats import MIN_REPS, Spread

ALLOCATIONS_PER_RUN = 8
ROUNDS = 8
STRIDE = 4
HOT_THRESHOLD = 2  # copies; the emulator's experiment uses the same (hot_threshold = 2)
PIN_POLICIES = ("none", "smart", "all")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = (ctypes.c_size_t,)
_libc.free.argtypes = (ctypes.c_void_p,)


def hot_allocations(copies: dict[int, int], threshold: int = HOT_THRESHOLD) -> set[int]:
    """The allocations a profile run copied more than `threshold` times."""
    return {alloc for alloc, count in copies.items() if count > threshold}


def run_once(cuda: CudaBackend, nbytes: int, dev: int, pin: set[int],
             allocations: int = ALLOCATIONS_PER_RUN, rounds: int = ROUNDS,
             stride: int = STRIDE) -> tuple[float, dict[int, int]]:
    """One life of the workload: seconds from the first allocation to the last free, and
    the copies made per allocation (the transfer history a profile run records)."""
    copies = dict.fromkeys(range(allocations), 0)
    bufs: list[int] = []
    start = time.perf_counter()
    try:
        for i in range(allocations):
            if i in pin:
                ptr = cuda.pinned_alloc(nbytes)
            else:
                ptr = _libc.malloc(nbytes)
                if not ptr:
                    raise MemoryError(f"malloc({nbytes}) failed")
            bufs.append(ptr)
            ctypes.memset(ptr, i + 1, nbytes)  # the program fills what it allocated
        for rnd in range(rounds):
            for i in range(allocations):
                if rnd and i % stride:
                    continue
                cuda.h2d(dev, bufs[i], nbytes)
                cuda.d2h(bufs[i], dev, nbytes)
                copies[i] += 2
    finally:
        for i, ptr in enumerate(bufs):
            if i in pin:
                cuda.pinned_free(ptr)
            else:
                _libc.free(ptr)
    return time.perf_counter() - start, copies


def measure(cuda: CudaBackend, sizes: tuple[int, ...] | list[int], reps: int = MIN_REPS,
            progress: Callable[[str], None] = lambda _: None) -> list[SmartPin]:
    """Each size under each policy, `reps` timed lives after one untimed one each, the
    policies taking turns within a repetition so drift hits all three alike."""
    if getattr(cuda, "caches_pinned_frees", False):
        raise NoGpu(f"smart pinning needs CuPy (cudaHostAlloc/cudaFreeHost): {cuda.name} "
                    "caches freed pinned memory, so its frees would time nothing")
    rows = []
    for nbytes in sizes:
        progress(f"smart pinning: {nbytes} B x {ALLOCATIONS_PER_RUN} allocations")
        dev = cuda.device_alloc(nbytes)
        try:
            _, history = run_once(cuda, nbytes, dev, set())  # warm-up and first profile
            pins = {"none": set(), "smart": hot_allocations(history),
                    "all": set(range(ALLOCATIONS_PER_RUN))}
            for policy in PIN_POLICIES[1:]:
                run_once(cuda, nbytes, dev, pins[policy])  # warm-up
            seconds: dict[str, list[float]] = {p: [] for p in PIN_POLICIES}
            for _ in range(reps):
                for policy in PIN_POLICIES:
                    took, copies = run_once(cuda, nbytes, dev, pins[policy])
                    seconds[policy].append(took)
                    if policy == "none":  # the profile run: its history picks smart's pins
                        pins["smart"] = hot_allocations(copies)
            for policy in PIN_POLICIES:
                rows.append(SmartPin(policy, nbytes, ALLOCATIONS_PER_RUN, ROUNDS, STRIDE,
                                     len(pins[policy]), Spread.of(seconds[policy]).scaled(1e3),
                                     seconds[policy]))
        finally:
            cuda.device_free(dev)
    return rows


def crossover(rows: list[SmartPin], policy: str, against: str) -> int | None:
    """The smallest size from which `policy`'s median beats `against`'s at every larger
    size measured (None: never, or not measured)."""
    by = {(r.policy, r.nbytes): r.ms.median for r in rows}
    sizes = sorted({r.nbytes for r in rows})
    wins = [by.get((policy, s), float("inf")) < by.get((against, s), float("-inf"))
            for s in sizes]
    if not wins or not wins[-1]:
        return None
    first = len(wins)
    while first > 0 and wins[first - 1]:
        first -= 1
    return sizes[first]
