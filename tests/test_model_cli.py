"""What a user of `gpuvm model` sees: each point once (scenarios that --vms makes the
same are replayed and shown once), a table within 80 columns when piped, no Dask logging
without -v, and a line naming the CSV it wrote."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

TWO_OF_A_KIND = """
[experiment]
name = "kinds"
modes = ["native", "fv-opt"]
backend = "auto"

[[scenario]]
name = "one"
[[scenario.vm]]
name = "vm"
benchmark = "vecadd"
params = [4096]

[[scenario]]
name = "two"
[[scenario.vm]]
name = "vm"
benchmark = "vecadd"
params = [4096]
count = 2
"""


def model(tmp: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "gpuvm", "model", str(tmp / "kinds.toml"),
                           *argv], cwd=tmp, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.fixture()
def config(tmp_path) -> Path:
    (tmp_path / "kinds.toml").write_text(TWO_OF_A_KIND)
    return tmp_path


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()
            if line.split()[:1] and line.split()[0] in ("one", "two")]


@pytest.mark.kvm
@pytest.mark.slow
def test_scenarios_made_alike_by_vms_are_one_point_and_the_table_fits_80(config) -> None:
    p = model(config, "--vms", "1,3", "--csv", "rows.csv")
    assert p.returncode == 0, p.stderr
    assert all(len(line) <= 80 for line in p.stdout.splitlines()) and "…" not in p.stdout
    rows = _rows(p.stdout)
    # one and two at --vms N are the same VMs: 2 modes x 2 counts, shown once, as one
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("one", "native", "1"), ("one", "native", "3"), ("one", "fv-opt", "1"),
        ("one", "fv-opt", "3")]
    assert "two is one's VMs at --vms N: shown once, as one" in p.stderr
    assert "profile xen-2014" in p.stdout  # shared by every row: said once
    assert "rows written to rows.csv" in p.stderr
    assert len((config / "rows.csv").read_text().splitlines()) == 1 + 4
    # without --vms each scenario is its own point; spread on Dask, which says nothing
    # without -v (only gpuvm's own "model: " lines)
    own = model(config, "--dask")
    assert own.returncode == 0, own.stderr
    assert [(r[0], r[1], r[3]) for r in _rows(own.stdout)] == [
        ("one", "native", "1"), ("one", "fv-opt", "1"), ("two", "native", "2"),
        ("two", "fv-opt", "2")]
    assert [line for line in own.stderr.splitlines() if not line.startswith("model: ")] == []
