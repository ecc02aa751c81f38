"""Measurements on a real NVIDIA GPU: what host memory costs a driver that DMAs to it.

Three questions, each timed over repetitions (median and min-max):
- how fast copies run between device memory and pinned vs pageable host memory;
- what pinning costs when a driver pins a region chunk by chunk (cudaHostRegister on
  4 MiB pieces), on 4 KiB-page memory vs a huge-page-backed memfd;
- how a device-to-host copy into a THP-backed memfd fares when the driver pins the
  destination chunk by chunk (the way a proxied driver handles pageable memory), and
  whether refusing huge pages on those ranges (MADV_NOHUGEPAGE) changes it.
"""

from __future__ import annotations

import platform
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Callable

from gpuvm.calibrate import hostmem
from gpuvm.calibrate.cuda import CudaBackend, driver_version
from gpuvm.calibrate.profile import Bandwidth, CopyInto, DeviceInfo, GpuProfile, PinCost
from gpuvm.calibrate.stats import Spread

GiB = 1 << 30

# the memory kinds pinned chunk by chunk, and those a D2H copy lands in
PIN_KINDS = ("anon-4k", "memfd-4k", "memfd-thp")
D2H_KINDS = ("memfd-thp", "memfd-4k")
D2H_MODES = ("pageable", "chunk-pinned", "registered")


@dataclass(frozen=True)
class Plan:
    sizes: list[int]  # bandwidth sizes
    pin_bytes: int  # region size for the pinning and memfd copy measurements
    chunk_bytes: int
    reps: int
    command: str
    chunk_offset: int = 0  # where the chunk grid starts (0: chunks aligned to the region)


def timed(fn: Callable[[], None], reps: int, warmup: int = 1) -> list[float]:
    """Seconds per call over `reps` calls, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def rate(nbytes: int, seconds: list[float]) -> Spread:
    return Spread.of(seconds).inverted(nbytes / GiB)


def chunks(base: int, nbytes: int, chunk: int, offset: int = 0) -> list[tuple[int, int]]:
    """(address, length) pieces of [base, base+nbytes) on a grid of `chunk` bytes shifted by
    `offset`: the first piece is `offset` long (if non-zero), the last one possibly short.
    A shifted grid makes every chunk boundary fall inside a huge page."""
    if chunk <= 0 or not 0 <= offset < chunk:
        raise ValueError(f"chunk {chunk}, offset {offset}: need 0 <= offset < chunk")
    starts = ([0] if offset else []) + list(range(offset, nbytes, chunk))
    ends = starts[1:] + [nbytes]
    return [(base + lo, hi - lo) for lo, hi in zip(starts, ends) if hi > lo]


def measure_bandwidth(cuda: CudaBackend, plan: Plan) -> list[Bandwidth]:
    largest = max(plan.sizes)
    dev = cuda.device_alloc(largest)
    pinned = cuda.pinned_alloc(largest)
    pageable = hostmem.HostRegion.open("anon", largest)
    try:
        pageable.populate()
        rows = []
        for nbytes in plan.sizes:
            for host_kind, host in (("pinned", pinned), ("pageable", pageable.address)):
                for direction in ("h2d", "d2h"):
                    if direction == "h2d":
                        def copy() -> None: cuda.h2d(dev, host, nbytes)
                    else:
                        def copy() -> None: cuda.d2h(host, dev, nbytes)
                    rows.append(Bandwidth(direction, host_kind, nbytes,
                                          rate(nbytes, timed(copy, plan.reps))))
        return rows
    finally:
        pageable.close()


def pin_all(cuda: CudaBackend, pieces: list[tuple[int, int]]) -> None:
    for addr, length in pieces:
        cuda.register(addr, length)


def unpin_all(cuda: CudaBackend, pieces: list[tuple[int, int]]) -> None:
    for addr, _ in pieces:
        cuda.unregister(addr)


def measure_pinning(cuda: CudaBackend, plan: Plan, kind: str) -> PinCost:
    """Register the whole region chunk by chunk, then unregister it: timed separately."""
    region = hostmem.HostRegion.open(kind, plan.pin_bytes)
    try:
        region.populate()
        huge = region.thp_kib()
        pieces = chunks(region.address, plan.pin_bytes, plan.chunk_bytes, plan.chunk_offset)
        pin_all(cuda, pieces)  # warm-up: first registration pays one-time driver setup
        unpin_all(cuda, pieces)
        reg, unreg = [], []
        for _ in range(plan.reps):
            start = time.perf_counter()
            pin_all(cuda, pieces)
            mid = time.perf_counter()
            unpin_all(cuda, pieces)
            reg.append(mid - start)
            unreg.append(time.perf_counter() - mid)
        return PinCost(kind, plan.pin_bytes, plan.chunk_bytes, len(pieces), huge,
                       Spread.of(reg).scaled(1e3), Spread.of(unreg).scaled(1e3))
    finally:
        region.close()


def measure_d2h_into(cuda: CudaBackend, plan: Plan, dev: int, kind: str) -> list[CopyInto]:
    """D2H copies of the whole region into memory of `kind`, three ways (D2H_MODES)."""
    rows = []
    for mode in D2H_MODES:
        region = hostmem.HostRegion.open(kind, plan.pin_bytes)
        try:
            region.populate()
            before = region.thp_kib()
            pieces = chunks(region.address, plan.pin_bytes, plan.chunk_bytes, plan.chunk_offset)
            if mode == "pageable":
                def copy() -> None: cuda.d2h(region.address, dev, plan.pin_bytes)
            elif mode == "chunk-pinned":
                def copy() -> None:
                    for addr, length in pieces:
                        cuda.register(addr, length)
                        cuda.d2h(addr, dev + (addr - region.address), length)
                        cuda.unregister(addr)
            else:
                # a copy may not span two registrations, so it goes chunk by chunk too
                pin_all(cuda, pieces)

                def copy() -> None:
                    for addr, length in pieces:
                        cuda.d2h(addr, dev + (addr - region.address), length)
            samples = timed(copy, plan.reps)
            if mode == "registered":
                unpin_all(cuda, pieces)
            rows.append(CopyInto(kind, mode, plan.pin_bytes, before, region.thp_kib(),
                                 rate(plan.pin_bytes, samples)))
        finally:
            region.close()
    return rows


def calibrate(cuda: CudaBackend, plan: Plan,
              progress: Callable[[str], None] = lambda _: None) -> GpuProfile:
    info = DeviceInfo(
        gpu=cuda.device_name(), driver=driver_version(), cuda_runtime=cuda.runtime_version(),
        backend=cuda.name, date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=plan.command, kernel=platform.release(),
        shmem_thp=hostmem.read_knob(hostmem.SHMEM_THP_KNOB),
        anon_thp=hostmem.read_knob(hostmem.ANON_THP_KNOB),
        reps=plan.reps, chunk_bytes=plan.chunk_bytes, chunk_offset=plan.chunk_offset)
    progress("bandwidth: pinned vs pageable")
    bandwidth = measure_bandwidth(cuda, plan)
    pins = []
    for kind in PIN_KINDS:
        progress(f"chunked pin/unpin: {kind}")
        pins.append(measure_pinning(cuda, plan, kind))
    dev = cuda.device_alloc(plan.pin_bytes)
    copies = []
    for kind in D2H_KINDS:
        progress(f"D2H into {kind}")
        copies += measure_d2h_into(cuda, plan, dev, kind)
    cuda.release()
    return GpuProfile(info, bandwidth, pins, copies)
