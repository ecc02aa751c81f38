"""How fast each of the host's cores ran while the emulator was being measured.

The model of the whole system prices a VM's work at the speed its traces were recorded
at, and a run of VMs predicted from those prices is as fast as the cores it ran on.  The
lent 16-core machines (themselves virtual machines) do not keep one speed: a fixed loop
takes ~9-11 ms or 15-22 ms on a core by turns, a core staying slow or fast for seconds,
and each core on its own -- probes on four cores at once, 100 ms bins over 8 s, were
slow 16-100% of the time each and not correlated (scratch, 2026-11-26, twice).  So the
host load average says little about a run: `CoreProbe` says what the cores did.

One probe process per core the measuring process may use, pinned to it, times a short
fixed loop (`spin(PROBE_WORK)`, ~0.1-0.2 ms) every PROBE_PERIOD_S and keeps (when, core,
ms).  A sample's slowdown is its time over that core's fastest of the whole session
(`CoreSamples.slowdown`); `during(t0, t1)` gives the mean over every core's samples in a
stretch and the share over SLOW_FACTOR.  The probes take ~0.2% of each core (and a waking
probe can delay a VM thread on its core by that loop's time).  They are processes of
their own, forked before any thread of the measuring process: a probe thread would
contend for the interpreter lock that threaded VMs take turns at.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Sequence

import numpy as np

SLOW_FACTOR = 1.25  # a run this much slower than the fastest counts as slow
PROBE_WORK = 2_000  # loop iterations a probe: ~0.1 ms of CPython on the lent machine
PROBE_PERIOD_S = 0.1  # between a probe's samples
PROBE_WAIT_S = 10.0  # for a stopped probe's samples
FASTEST_PERCENTILE = 1.0  # a core's fastest: this percentile of its samples (not one outlier)


def spin(work: int) -> int:
    """The fixed work: integer arithmetic in the interpreter (no memory beyond a few
    objects, no system calls), so only the core's speed moves its time."""
    x = 0
    for i in range(work):
        x += i * i
    return x


@dataclass(frozen=True)
class CoreSpeed:
    """The host's cores over one stretch of time."""

    slowdown: float  # mean of the samples' times over their core's fastest (1: all fast)
    slow_share: float  # of the samples, the share over SLOW_FACTOR x their core's fastest
    samples: int


@dataclass(frozen=True, eq=False)
class CoreSamples:
    at_s: np.ndarray  # float64: when each sample started (time.time())
    cpu: np.ndarray  # int64: the core it ran on
    ms: np.ndarray  # float64: how long the loop took

    @cached_property
    def slowdown(self) -> np.ndarray:
        """Each sample's time over its core's fastest (FASTEST_PERCENTILE of its own);
        computed once, then every stretch (`during`) reads it."""
        out = np.ones_like(self.ms)
        for c in np.unique(self.cpu):
            on = self.cpu == c
            out[on] = self.ms[on] / np.percentile(self.ms[on], FASTEST_PERCENTILE)
        return out

    def during(self, t0: float, t1: float) -> CoreSpeed | None:
        """Every core's samples from `t0` to `t1` (None: none fell there)."""
        inside = (self.at_s >= t0) & (self.at_s <= t1)
        if not inside.any():
            return None
        s = self.slowdown[inside]
        return CoreSpeed(float(s.mean()), float((s > SLOW_FACTOR).mean()), int(s.size))

    def joined(self, other: CoreSamples | None) -> CoreSamples:
        """These samples and `other`'s in one time order (a bundle measured in two goes:
        one core's fastest is then its fastest of both)."""
        if other is None:
            return self
        at_s, cpu, ms = (np.concatenate(pair) for pair in (
            (self.at_s, other.at_s), (self.cpu, other.cpu), (self.ms, other.ms)))
        order = np.argsort(at_s, kind="stable")
        return CoreSamples(at_s[order], cpu[order], ms[order])

    def save(self, path: Path) -> None:
        np.savez_compressed(path, at_s=self.at_s, cpu=self.cpu, ms=self.ms)

    @classmethod
    def load(cls, path: Path) -> CoreSamples | None:
        """None where `path` does not exist (a bundle from before the probes)."""
        if not path.exists():
            return None
        with np.load(path) as a:
            return cls(np.asarray(a["at_s"], dtype=np.float64),
                       np.asarray(a["cpu"], dtype=np.int64),
                       np.asarray(a["ms"], dtype=np.float64))


def _probe(cpu: int, stop, out, work: int, period_s: float) -> None:
    os.sched_setaffinity(0, {cpu})
    rows: list[tuple[float, float]] = []
    while not stop.wait(period_s):
        at = time.time()
        t0 = time.perf_counter()
        spin(work)
        rows.append((at, (time.perf_counter() - t0) * 1e3))
    out.put((cpu, rows))


class CoreProbe:
    """`with CoreProbe() as probe: ...` then `probe.samples`: every allowed core sampled
    while the block ran (see the module)."""

    def __init__(self, cpus: Sequence[int] | None = None, work: int = PROBE_WORK,
                 period_s: float = PROBE_PERIOD_S) -> None:
        self.cpus = sorted(os.sched_getaffinity(0)) if cpus is None else list(cpus)
        self.work, self.period_s = work, period_s
        self.samples: CoreSamples | None = None
        self._ctx = multiprocessing.get_context("fork")
        self._stop = self._ctx.Event()
        self._out = self._ctx.Queue()
        self._procs: list = []

    def __enter__(self) -> CoreProbe:
        self._procs = [self._ctx.Process(target=_probe, daemon=True, name=f"core-probe-{c}",
                                         args=(c, self._stop, self._out, self.work,
                                               self.period_s))
                       for c in self.cpus]
        for p in self._procs:
            p.start()
        return self

    def __exit__(self, *exc) -> None:
        """Stop the probes and gather their samples (a probe that sent none within
        PROBE_WAIT_S -- it died -- is left out)."""
        self._stop.set()
        got = []
        for _ in self._procs:
            try:
                got.append(self._out.get(timeout=PROBE_WAIT_S))
            except queue.Empty:
                break
        for p in self._procs:
            p.join(timeout=PROBE_WAIT_S)
            if p.is_alive():
                p.kill()
        rows = [(at, cpu, ms) for cpu, samples in got for at, ms in samples]
        rows.sort()
        a = np.array(rows, dtype=np.float64).reshape(-1, 3)
        self.samples = CoreSamples(a[:, 0].copy(), a[:, 1].astype(np.int64), a[:, 2].copy())
