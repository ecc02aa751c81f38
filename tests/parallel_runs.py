"""Whole single-VM runs spread over the host's cores, for the tests that compare the
counts of many runs.

Each run is a world of its own -- its own GPU, mediator, VMM and counters -- so where
and beside what it runs does not change what it counts (the pinned counts hold either
way); run one after another, the comparisons of every benchmark in every mode were a
quarter of the suite's time on two cores.  Workers are spawned, not forked: pytest's
process has threads of earlier tests' runs."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Hashable, Mapping, TypeVar

from gpuvm.run import RunOptions, VmSpec, run_vms

Key = TypeVar("Key", bound=Hashable)
PhaseCounts = dict[str, dict[str, int]]


def phase_counts(spec: VmSpec, options: RunOptions) -> PhaseCounts | str:
    """One VM's counters per phase, or why its run failed."""
    (r,) = run_vms([spec], options)
    if not r.passed:
        return f"{spec.benchmark} in {options.mode} on {options.backend}: {r.error()}"
    return {p.name: p.counters for p in r.session.phases}


def phase_counts_of(runs: Mapping[Key, tuple[VmSpec, RunOptions]]
                    ) -> dict[Key, PhaseCounts | str]:
    """`phase_counts` of every run, at most four at once."""
    with ProcessPoolExecutor(max_workers=min(4, os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {key: pool.submit(phase_counts, spec, options)
                   for key, (spec, options) in runs.items()}
        return {key: future.result() for key, future in futures.items()}
