"""Measurements on a real NVIDIA GPU: what host memory costs a driver that DMAs to it.

Four questions, each timed over repetitions (median, min-max and every repetition kept),
the first three under each shmem THP mode asked for (`never`, `always`: set as root and
put back, or said why not):
- how fast copies run between device memory and pinned vs pageable host memory;
- what pinning costs when a driver pins a region chunk by chunk (cudaHostRegister on
  4 MiB pieces), on 4 KiB-page memory vs a huge-page-backed memfd;
- how a device-to-host copy into a THP-backed memfd fares when the driver pins the
  destination chunk by chunk (the way a proxied driver handles pageable memory), and
  whether refusing huge pages on those ranges (MADV_NOHUGEPAGE) changes it -- with the
  huge pages counted before and after (smaps for the region, meminfo for the system), so
  a split is what the kernel did, not what chunk arithmetic says it might;
- where pinning pays in a program's life (gpuvm.calibrate.smart_pinning).
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from gpuvm.calibrate import hostmem, smart_pinning
from gpuvm import host_pages
from gpuvm.calibrate.cuda import CudaBackend, driver_version
from gpuvm.calibrate.profile import (Bandwidth, CopyInto, GpuProfile, MeasurementSetup, PinCost,
                                     ThpSetting)
from gpuvm.calibrate.stats import Spread

GiB = 1 << 30

# the memory kinds pinned chunk by chunk, and those a D2H copy lands in
PIN_KINDS = ("anon-4k", "anon-thp", "memfd-4k", "memfd-thp")
D2H_KINDS = ("memfd-thp", "memfd-4k")
D2H_MODES = ("pageable", "chunk-pinned", "registered")


@dataclass(frozen=True)
class Plan:
    """What one `gpuvm calibrate --gpu` run measures (sizes, repetitions, THP modes) and the
    command line that asked for it, recorded with the results."""

    sizes: list[int]  # bandwidth sizes
    pin_bytes: int  # region size for the pinning and memfd copy measurements
    chunk_bytes: int
    reps: int
    command: str
    chunk_offset: int = 0  # the [costs] rows' chunk grid start (0: aligned to the region)
    # shmem_enabled modes to measure under, each set (as root) and put back after; empty:
    # only the mode the machine has
    shmem_modes: tuple[str, ...] = ()
    # extra chunk grids for the pin and D2H-into rows (1 MiB: every edge inside a huge page)
    extra_offsets: tuple[int, ...] = ()
    smart_sizes: tuple[int, ...] = ()  # smart-pinning allocation sizes (empty: not run)
    transfers: bool = True  # the bandwidth / pin / D2H-into part (False: smart pinning only)

    @property
    def offsets(self) -> list[int]:
        return [self.chunk_offset] + [o for o in self.extra_offsets if o != self.chunk_offset]


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


def measure_bandwidth(cuda: CudaBackend, plan: Plan, shmem: str) -> list[Bandwidth]:
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
                    seconds = timed(copy, plan.reps)
                    rows.append(Bandwidth(direction, host_kind, nbytes, rate(nbytes, seconds),
                                          shmem, seconds))
        return rows
    finally:
        pageable.close()
        cuda.device_free(dev)
        cuda.pinned_free(pinned)


def pin_all(cuda: CudaBackend, pieces: list[tuple[int, int]]) -> None:
    for addr, length in pieces:
        cuda.register(addr, length)


def unpin_all(cuda: CudaBackend, pieces: list[tuple[int, int]]) -> None:
    for addr, _ in pieces:
        cuda.unregister(addr)


def measure_pinning(cuda: CudaBackend, plan: Plan, kind: str, shmem: str,
                    offset: int) -> PinCost:
    """Register the whole region chunk by chunk, then unregister it: timed separately."""
    region = hostmem.HostRegion.open(kind, plan.pin_bytes)
    try:
        region.populate()
        huge = region.thp_kib()
        pieces = chunks(region.address, plan.pin_bytes, plan.chunk_bytes, offset)
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
                       Spread.of(reg).scaled(1e3), Spread.of(unreg).scaled(1e3), shmem,
                       offset, region.thp_kib(), reg, unreg)
    finally:
        region.close()


def measure_d2h_into(cuda: CudaBackend, plan: Plan, dev: int, kind: str, shmem: str,
                     offset: int) -> list[CopyInto]:
    """D2H copies of the whole region into memory of `kind`, three ways (D2H_MODES), with
    the huge pages (the region's, from smaps; the system's, from meminfo) before and after."""
    rows = []
    for mode in D2H_MODES:
        region = hostmem.HostRegion.open(kind, plan.pin_bytes)
        try:
            region.populate()
            before, sys_before = region.thp_kib(), host_pages.meminfo_kib()["ShmemHugePages"]
            pieces = chunks(region.address, plan.pin_bytes, plan.chunk_bytes, offset)
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
                                 rate(plan.pin_bytes, samples), shmem, offset, sys_before,
                                 host_pages.meminfo_kib()["ShmemHugePages"], samples))
        finally:
            region.close()
    return rows


def measure_setting(cuda: CudaBackend, plan: Plan, shmem: str,
                    progress: Callable[[str], None]
                    ) -> tuple[list[Bandwidth], list[PinCost], list[CopyInto]]:
    """Every measurement under the shmem THP mode in force now (named `shmem`)."""
    progress(f"[shmem {shmem}] bandwidth: pinned vs pageable")
    bandwidth = measure_bandwidth(cuda, plan, shmem)
    pins, copies = [], []
    dev = cuda.device_alloc(plan.pin_bytes)
    try:
        for offset in plan.offsets:
            for kind in PIN_KINDS:
                progress(f"[shmem {shmem}] chunked pin/unpin: {kind}, grid at +{offset >> 10} KiB")
                pins.append(measure_pinning(cuda, plan, kind, shmem, offset))
            for kind in D2H_KINDS:
                progress(f"[shmem {shmem}] D2H into {kind}, grid at +{offset >> 10} KiB")
                copies += measure_d2h_into(cuda, plan, dev, kind, shmem, offset)
    finally:
        cuda.device_free(dev)
    return bandwidth, pins, copies


def calibrate(cuda: CudaBackend, plan: Plan,
              progress: Callable[[str], None] = lambda _: None) -> GpuProfile:
    """Measure under each shmem THP mode of the plan (set and put back here, where the
    kernel lets us), then the smart-pinning benchmark if the plan has sizes."""
    started = host_pages.read_knob(host_pages.SHMEM_THP_KNOB)
    settings, bandwidth, pins, copies = [], [], [], []
    try:
        for mode in (plan.shmem_modes or (started,)) if plan.transfers else ():
            note = "" if mode == started else \
                host_pages.set_knob(host_pages.SHMEM_THP_KNOB, mode) or ""
            selected = host_pages.read_knob(host_pages.SHMEM_THP_KNOB)
            settings.append(ThpSetting(mode, selected, note))
            if note:
                progress(f"shmem THP {mode!r} not measured: {note}")
                continue
            more_bandwidth, more_pins, more_copies = measure_setting(cuda, plan, selected,
                                                                     progress)
            bandwidth += more_bandwidth
            pins += more_pins
            copies += more_copies
    finally:
        if host_pages.read_knob(host_pages.SHMEM_THP_KNOB) != started:
            why = host_pages.set_knob(host_pages.SHMEM_THP_KNOB, started)
            if why:
                progress(f"could not put shmem THP back to {started!r}: {why}")
    smart = smart_pinning.measure(cuda, plan.smart_sizes, plan.reps, progress) \
        if plan.smart_sizes else []
    cuda.release()
    info = MeasurementSetup(
        gpu=cuda.device_name(), driver=driver_version(), cuda_runtime=cuda.runtime_version(),
        backend=cuda.name, date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        command=plan.command, kernel=platform.release(),
        shmem_thp=host_pages.read_knob(host_pages.SHMEM_THP_KNOB),
        anon_thp=host_pages.read_knob(host_pages.ANON_THP_KNOB),
        reps=plan.reps, chunk_bytes=plan.chunk_bytes, chunk_offset=plan.chunk_offset,
        host=host_summary())
    profile = GpuProfile(info, bandwidth, pins, copies, settings, smart)
    return replace(profile, device=replace(info, costs_shmem_thp=profile.costs_mode()))


def host_summary() -> str:
    """'16 cores, MemTotal 125 GiB' and the DMI product name where there is one: which
    machine a profile was measured on, read without tools."""
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) >> 20
    except OSError:
        pass
    try:
        product = Path("/sys/class/dmi/id/product_name").read_text().strip()
    except OSError:
        product = ""
    return f"{os.cpu_count()} cores, MemTotal {mem} GiB" + (f", {product}" if product else "")
