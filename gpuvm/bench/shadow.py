"""`gpuvm bench shadow`: what it costs to bring a shadow page table up to date.

A guest address space maps 1 GiB in 4 KiB pages (8 small tables, 262,144 entries) onto
scattered pages of its slice.  Measured side by side in one run: a full resync (read and
translate every entry, what GPUvm did on each flush) and an incremental resync after k
entries changed, for several k.  The guest's stores are told to the shadow as the trap
path does (note_write, outside the timed part: it is the trap's work), so the
incremental resync reads and translates only those k entries -- unless more than
1/DENSE_SHARE of a table changed, when comparing that table whole is cheaper (and counted
whole).  Each result is checked: the entries scanned must be what that rule says, and the
shadow must equal a full translation.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass, field

import numpy as np

from gpuvm.bench.timing import best_of
from gpuvm.device import layout, regs
from gpuvm.device.vram import Vram
from shadow.dirty import DENSE_SHARE
from shadow.entries import EntryPolicy
from shadow.page_table import ShadowSpace
from shadow.vram_pool import VramPool

MAPPED = 1 * regs.GiB
SLICE = 2 * regs.GiB
GUEST_PD = 0x10000
GUEST_PTS = 0x100000
K_VALUES = (0, 1, 64, 4096, 65536)


@dataclass
class ShadowBench:
    ptes: int
    full_ms: float
    incremental_ms: dict[int, float] = field(default_factory=dict)

    @property
    def full_ptes_per_s(self) -> float:
        return self.ptes / (self.full_ms / 1e3)


def run_shadow_bench(repeat: int = 5, seed: int = 0) -> ShadowBench:
    vram = Vram(SLICE + 256 * regs.MiB)
    try:
        policy = EntryPolicy(0, SLICE, 1 << 36, lambda: [(0, 256 * regs.MiB)])
        pool = VramPool(SLICE, 256 * regs.MiB, "shadow")
        rng = np.random.default_rng(seed)
        npages = MAPPED // regs.SMALL_PAGE
        tables = MAPPED // regs.PDE_SPAN
        frames = rng.integers(16 * regs.MiB >> 12, SLICE >> 12, npages).astype(np.uint64) << 12
        entries = layout.ptes(frames)
        vram.u64[GUEST_PTS >> 3:(GUEST_PTS >> 3) + npages] = entries
        for t in range(tables):
            pt = GUEST_PTS + t * regs.SMALL_PTES_PER_PT * regs.PTE_SIZE
            vram.u64[(GUEST_PD >> 3) + 1 + t] = layout.pde_small(pt)  # VA 128 MiB .. 1152 MiB
        counts: dict[str, int] = {}

        def count(name: str, n: int) -> None:
            counts[name] = counts.get(name, 0) + n

        space = ShadowSpace(vram, policy, pool, GUEST_PD, count)
        space.sync(incremental=False)
        result = ShadowBench(npages, 1e3 * best_of(lambda: space.sync(incremental=False),
                                                     repeat))
        guest = vram.u64[GUEST_PTS >> 3:(GUEST_PTS >> 3) + npages]
        for k in K_VALUES:
            def change_and_sync() -> None:
                idx = rng.choice(npages, size=k, replace=False)
                guest[idx] = layout.ptes(rng.integers(16 * regs.MiB >> 12, SLICE >> 12, k)
                                         .astype(np.uint64) << np.uint64(regs.SMALL_PAGE_SHIFT))
                for i in idx.tolist():  # what the trap of each store tells the shadow
                    space.note_write(GUEST_PTS + i * regs.PTE_SIZE, regs.PTE_SIZE)
                scanned = counts.get("shadow.ptes_scanned", 0)
                t0 = time.perf_counter()
                space.sync(incremental=True)
                timings.append(time.perf_counter() - t0)
                per_table = np.bincount(idx // regs.SMALL_PTES_PER_PT, minlength=tables)
                want = int(np.where(per_table * DENSE_SHARE > regs.SMALL_PTES_PER_PT,
                                    regs.SMALL_PTES_PER_PT, per_table).sum())
                if counts["shadow.ptes_scanned"] - scanned != want:
                    raise AssertionError(f"incremental resync after {k} stores scanned "
                                         f"{counts['shadow.ptes_scanned'] - scanned} entries, "
                                         f"not {want}")
            timings: list[float] = []
            for _ in range(repeat):
                change_and_sync()
            result.incremental_ms[k] = min(timings) * 1e3
        expected, _ = policy.translate(guest.copy())
        shadow = np.concatenate([space._u64(space._pts[(1 + t, 0)].shadow,
                                            regs.SMALL_PTES_PER_PT) for t in range(tables)])
        if not np.array_equal(shadow, expected):
            raise AssertionError("incremental shadow differs from a full translation")
        return result
    finally:
        vram.close()


def print_shadow_bench(r: ShadowBench) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"gpuvm bench shadow: 1 GiB in 4 KiB pages ({r.ptes:,} PTEs), best of runs")
    t.add_column("resync")
    t.add_column("ms", justify="right")
    t.add_column("vs full", justify="right")
    t.add_row("full scan", f"{r.full_ms:.2f}", "1.00x")
    for k, ms in r.incremental_ms.items():
        t.add_row(f"incremental, {k:,} entries changed", f"{ms:.2f}", f"{ms / r.full_ms:.3f}x")
    t.caption = f"full scan: {r.full_ptes_per_s / 1e6:.1f} M PTEs/s (target: <= 20 ms)"
    Console().print(t)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, default=5, help="repetitions; the best is kept")


def main_shadow(args: argparse.Namespace) -> int:
    print_shadow_bench(run_shadow_bench(repeat=args.repeat))
    return 0

