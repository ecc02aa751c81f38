"""`gpuvm bench device`: how fast the emulated device itself is.

Four numbers, measured side by side in one run: BAR0 register accesses per second
through the device's MMIO entry point, page translations per second (vectorized range
walks and single-page BAR walks), a 64 MiB copy whose source and destination are
scattered over 4 KiB pages -- done the way the copy engine does it -- against one
contiguous numpy copy of the same bytes, and the host cores the compute engine keeps
busy running mmul kernels: with numpy's BLAS on one thread, as the device keeps it
(gpuvm/device/kernels.py), and with a BLAS thread per core, numpy's default, whose idle
threads spin on cores the VMs' vCPUs need.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from gpuvm.bench.timing import best_of
from gpuvm.device import layout, regs
from gpuvm.device.channel import ChannelMemory
from gpuvm.device.gpu import Gpu
from gpuvm.device.kernels import KERNELS
from gpuvm.device.mmu import Space

COPY_BYTES = 64 * regs.MiB
KERNEL_N = 128  # the validation's mmul size
KERNELS_RUN = 200
KERNEL_PAUSE_S = 1e-3  # an engine idle between a VM's kernels


@dataclass
class DeviceBench:
    reg_accesses_per_s: float
    range_translations_per_s: float  # 4 KiB pages per second, vectorized walk
    bar_translations_per_s: float  # single-page walks (the BAR1/BAR3 path)
    scattered_copy_s: float
    contiguous_copy_s: float
    # process CPU time over wall time while the engine runs mmul kernels
    kernel_cores_one_thread: float  # BLAS on one thread, as the device keeps it
    kernel_cores_per_core: float  # a BLAS thread per host core (numpy's default)

    @property
    def copy_ratio(self) -> float:
        return self.scattered_copy_s / self.contiguous_copy_s


def _scattered_space(gpu: Gpu, pd: int, pt_base: int, va: int, frames: np.ndarray) -> Space:
    """A PD + small PTs mapping `frames` (page addresses) contiguously from `va`."""
    npages = len(frames)
    first_pde = va >> regs.PDE_SPAN_SHIFT
    for k in range((npages * regs.SMALL_PAGE + regs.PDE_SPAN - 1) // regs.PDE_SPAN + 1):
        pt = pt_base + k * regs.SMALL_PTES_PER_PT * regs.PTE_SIZE
        gpu.vram.u64[(pd >> 3) + first_pde + k] = layout.pde_small(pt)
    first = (va >> 12) & (regs.SMALL_PTES_PER_PT - 1)
    ptes = layout.ptes(frames)
    gpu.vram.u64[(pt_base >> 3) + first:(pt_base >> 3) + first + npages] = ptes
    return Space(pd)


def _cores_busy(mem: ChannelMemory, va: int, profile_compute) -> float:
    """Process CPU time over wall time while the mmul kernel runs KERNELS_RUN times,
    KERNEL_PAUSE_S apart: each thread kept busy counts 1, spinning or not."""
    size = 4 * KERNEL_N * KERNEL_N
    params = [va & 0xFFFFFFFF, va >> 32, (va + size) & 0xFFFFFFFF, (va + size) >> 32,
              (va + 2 * size) & 0xFFFFFFFF, (va + 2 * size) >> 32, KERNEL_N, 0]
    # finite inputs: the copy test's random bytes read as floats overflow in the product
    inputs = np.linspace(-1.0, 1.0, 2 * KERNEL_N * KERNEL_N, dtype=np.float32)
    mem.write(va, inputs.view(np.uint8))
    mmul = KERNELS[regs.KERNEL_MMUL]
    mmul.run(mem, params, profile_compute)  # the first sets the device's limit
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(KERNELS_RUN):
        mmul.run(mem, params, profile_compute)
        time.sleep(KERNEL_PAUSE_S)
    return (time.process_time() - cpu) / (time.perf_counter() - wall)


def run_device_bench(repeat: int = 5, accesses: int = 100_000, seed: int = 0) -> DeviceBench:
    gpu = Gpu()
    try:
        reg = regs.PMC_INTR_EN

        def registers() -> None:
            for i in range(accesses // 2):
                gpu.mmio_write(regs.BAR0, reg, 4, i & 1)
                gpu.mmio_read(regs.BAR0, reg, 4)

        t_regs = best_of(registers, repeat)

        npages = COPY_BYTES // regs.SMALL_PAGE
        rng = np.random.default_rng(seed)
        # two disjoint scattered sets of pages in the upper VRAM, each in random order
        pool = rng.permutation(np.arange(2 * npages, dtype=np.int64) + (512 * regs.MiB >> 12))
        src_frames, dst_frames = pool[:npages] << 12, pool[npages:] << 12
        va = regs.CHANNEL_VA_BASE
        space_src = _scattered_space(gpu, 0x100000, 0x200000, va, src_frames)
        space_dst = _scattered_space(gpu, 0x110000, 0x400000, va, dst_frames)
        gpu.vram.u8[512 * regs.MiB:512 * regs.MiB + 2 * COPY_BYTES] = \
            rng.integers(0, 255, 2 * COPY_BYTES, dtype=np.uint8)

        t_range = best_of(lambda: gpu.mmu.translate(space_src, va, COPY_BYTES, False), repeat)
        singles = 20_000
        t_single = best_of(lambda: [gpu.mmu.translate_one(space_src, va + ((i % npages) << 12),
                                                          False) for i in range(singles)],
                           repeat)

        src_mem, dst_mem = ChannelMemory(gpu, space_src), ChannelMemory(gpu, space_dst)
        t_scatter = best_of(lambda: dst_mem.write(va, src_mem.read(va, COPY_BYTES)), repeat)
        # check the scattered copy really moved every page to its partner
        got = gpu.vram.pages[dst_frames[[0, npages // 2, -1]] >> 12]
        want = gpu.vram.pages[src_frames[[0, npages // 2, -1]] >> 12]
        if not np.array_equal(got, want):
            raise AssertionError("scattered copy produced wrong bytes")

        a = gpu.vram.u8[512 * regs.MiB:512 * regs.MiB + COPY_BYTES]
        b = gpu.vram.u8[1024 * regs.MiB:1024 * regs.MiB + COPY_BYTES]
        t_contig = best_of(lambda: np.copyto(b, a), repeat)

        one = _cores_busy(src_mem, va, gpu.profile.compute)
        with threadpool_limits(limits=os.cpu_count() or 1, user_api="blas"):
            per_core = _cores_busy(src_mem, va, gpu.profile.compute)
        return DeviceBench(accesses / t_regs, npages / t_range, singles / t_single,
                           t_scatter, t_contig, one, per_core)
    finally:
        gpu.release_memory()


def print_device_bench(r: DeviceBench) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="gpuvm bench device (one run, best of repeats)")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_row("BAR0 register accesses / s", f"{r.reg_accesses_per_s:,.0f}")
    t.add_row("translations / s (range walk, 4 KiB pages)", f"{r.range_translations_per_s:,.0f}")
    t.add_row("translations / s (single-page BAR walk)", f"{r.bar_translations_per_s:,.0f}")
    t.add_row("64 MiB copy, scattered 4 KiB pages (ms)", f"{r.scattered_copy_s * 1e3:.2f}")
    t.add_row("64 MiB copy, contiguous numpy (ms)", f"{r.contiguous_copy_s * 1e3:.2f}")
    t.add_row("scattered / contiguous", f"{r.copy_ratio:.2f}x")
    what = f"cores busy, mmul n={KERNEL_N} each {KERNEL_PAUSE_S * 1e3:g} ms"
    t.add_row(f"{what}, BLAS on 1 thread (device)", f"{r.kernel_cores_one_thread:.2f}")
    t.add_row(f"{what}, BLAS on {os.cpu_count()} (numpy)", f"{r.kernel_cores_per_core:.2f}")
    Console().print(t)


def main_device(args: argparse.Namespace) -> int:
    print_device_bench(run_device_bench(repeat=args.repeat))
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=5, help="repetitions; the best is kept")
