"""The host's cores sampled while the emulator is measured (gpuvm.calibrate.core_speed):
each sample against its own core's fastest, the probes as real pinned processes, and a
validation bundle that keeps both the samples and when each of its runs ran."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from gpuvm.calibrate import validation
from gpuvm.calibrate.core_speed import SLOW_FACTOR, CoreProbe, CoreSamples, spin
from gpuvm.calibrate.emulator import ValidationPoint

BUNDLE = Path(__file__).parent / "data" / "validation-h100"


def samples(rows: list[tuple[float, int, float]]) -> CoreSamples:
    a = np.array(rows, dtype=np.float64)
    return CoreSamples(a[:, 0], a[:, 1].astype(np.int64), a[:, 2])


def test_a_sample_is_slow_against_its_own_cores_fastest():
    """Core 1 is never faster than 3 ms and keeps that speed: none of its samples is
    slow; core 0 ran at 1 ms and then at 2 ms: those are slow, however core 1 ran."""
    cores = samples([(t, 0, 1.0) for t in range(50)] + [(t, 0, 2.0) for t in range(50, 100)]
                    + [(t, 1, 3.0) for t in range(100)])
    early, late = cores.during(0, 49), cores.during(50, 99)
    assert early.slow_share == 0 and early.slowdown == pytest.approx(1.0)
    assert late.slow_share == pytest.approx(0.5) and late.slowdown == pytest.approx(1.5)
    assert late.samples == 100
    assert cores.during(200, 300) is None
    assert 2.0 > SLOW_FACTOR


def test_the_probes_sample_every_core_while_the_block_runs():
    with CoreProbe(period_s=0.01) as probe:
        start = time.time()
        spin(2_000_000)
        end = time.time()
    cores = probe.samples
    assert cores is not None
    assert set(cores.cpu.tolist()) == set(os.sched_getaffinity(0))
    assert (cores.ms > 0).all() and (np.diff(cores.at_s) >= 0).all()
    assert cores.at_s.min() >= start - 1 and cores.at_s.max() <= end + 1
    assert cores.during(start, end) is not None


def test_a_bundle_keeps_its_runs_times_and_the_cores(tmp_path):
    measured, fits, about = validation.load(BUNDLE)
    assert validation.load_cores(BUNDLE) is None  # measured before the probes
    timed = [replace(m, at_s=100.0 + i, took_s=0.5) for i, m in enumerate(measured)]
    # every core fast, except during the last run, where all are twice as slow
    last = 100.0 + len(timed) - 1
    rows = [(t, c, 2.0 if t >= last else 1.0) for c in (0, 1)
            for t in np.arange(99.0, last + 0.5, 0.25)]
    validation.save(tmp_path / "b", timed, fits, about, samples(rows))
    again, _, _ = validation.load(tmp_path / "b")
    assert [(m.at_s, m.took_s) for m in again] == [(m.at_s, m.took_s) for m in timed]
    cores = validation.load_cores(tmp_path / "b")
    speeds = validation.core_speeds(again, cores)
    slow = {k for k, s in speeds.items() if s.slow_share > 0}
    assert slow == {(timed[-1].mode, timed[-1].vms)}
    assert len(speeds) == len({(m.mode, m.vms) for m in again})
    missed = [ValidationPoint(timed[-1].mode, timed[-1].vms, 1.0, 2.0)]
    line = validation.core_summary(cores, speeds, missed)
    assert "2 probes" in line and "more than 10% 100%" in line, line


def test_unreadable_core_samples_are_one_error_line(tmp_path, gpuvm_cli):
    shutil.copytree(BUNDLE, tmp_path / "b")
    (tmp_path / "b" / validation.BUNDLE_CORES).write_bytes(b"not an npz")
    rc, _, err = gpuvm_cli("calibrate", "--emulator", "--from", str(tmp_path / "b"))
    assert rc == 2 and err.count("\n") == 1 and validation.BUNDLE_CORES in err, err
