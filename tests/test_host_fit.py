"""A run that needs more guest RAM up front than the host has is refused before any VM
starts, in one line naming the numbers (gpuvm/run/host_fit.py) -- `gpuvm run` and an
experiment alike -- instead of being killed by the kernel minutes later."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from gpuvm.device import regs
from gpuvm.run.host_fit import available_bytes, shortfall

REPO = Path(__file__).resolve().parents[1]


def _too_many() -> int:
    """More 256 MiB VMs than this host can give RAM to (twice over: it may free some)."""
    available = available_bytes()
    assert available is not None, "no MemAvailable in /proc/meminfo"
    return 2 * available // (256 * regs.MiB) + 1


def _gpuvm(*argv: str, cwd: Path = REPO) -> tuple[subprocess.CompletedProcess, float]:
    env = {k: v for k, v in os.environ.items() if k != "GPUVM_RAM_ALLOC"}
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "gpuvm", *argv], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=120)
    return p, time.monotonic() - t0


def _one_error_line(p: subprocess.CompletedProcess) -> str:
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith("gpuvm: error: ")
    return lines[0]


def test_the_shortfall_names_the_vms_their_ram_and_what_the_host_has() -> None:
    gib = 1024 * regs.MiB
    assert shortfall([256 * regs.MiB] * 4, gib) is None  # exactly fits
    line = shortfall([256 * regs.MiB] * 5, gib)
    assert line is not None and line.startswith("5 VMs would take 1,280 MiB of guest RAM "
                                                "up front (256 MiB each)")
    assert "the host has 1,024 MiB available" in line and "--ram-alloc ondemand" in line
    assert "(256-512 MiB each)" in shortfall([256 * regs.MiB, 512 * regs.MiB], 0)
    assert shortfall([gib], None) is None  # a host that does not say is not refused


def test_gpuvm_run_refuses_more_vms_than_the_host_has_ram_for() -> None:
    n = _too_many()
    p, took = _gpuvm("run", "-b", "madd", "--mode", "native", "--vms", str(n))
    line = _one_error_line(p)
    assert f"{n} VMs would take {n * 256:,} MiB of guest RAM" in line
    assert "MiB available (MemAvailable)" in line
    assert took < 60  # refused up front, no VM built


def test_an_experiment_is_refused_before_it_makes_a_run_directory(tmp_path) -> None:
    n = _too_many()
    config = tmp_path / "big.toml"
    config.write_text(f"""
[experiment]
name = "big"
modes = ["native"]
backend = "inproc"

[[scenario]]
name = "crowd"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
count = {n}
""")
    p, _ = _gpuvm("experiment", str(config), cwd=tmp_path)
    line = _one_error_line(p)
    assert "big.toml: scenario crowd:" in line and f"{n} VMs would take" in line
    assert 'ram_alloc = "ondemand"' in line
    assert not (tmp_path / "results").exists()
