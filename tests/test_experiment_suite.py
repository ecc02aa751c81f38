"""A suite (kind = "suite") runs its included experiment files, each into its own run
directory, then writes one report beside the paper's numbers; `--report` rebuilds it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

OVERHEAD = """
[experiment]
name = "ov"
kind = "benchmarks"
modes = ["native", "fv", "fv+lazy", "pv"]
output = "{out}/ov"
[[scenario]]
name = "idle"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
"""

SCALING = """
[experiment]
name = "sc"
kind = "scaling"
modes = ["fv-opt", "pv"]
output = "{out}/sc"
[[scenario]]
name = "1vm"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
[[scenario]]
name = "2vm"
[[scenario.vm]]
name = "vm"
benchmark = "idle"
count = 2
"""

SUITE = """
[experiment]
name = "suite"
kind = "suite"
output = "{out}/suite"
include = ["ov.toml", "sc.toml"]
"""


def gpuvm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuvm", "experiment", *args],
                          capture_output=True, text=True, timeout=600)


def _section(report: str, heading: str) -> str:
    """From `heading` to the next heading."""
    start = report.index(heading)
    end = report.find("\n#", start + len(heading))
    return report[start:end if end >= 0 else None]


def test_a_suite_runs_its_parts_and_reports_beside_the_paper(tmp_path: Path):
    for name, text in (("ov", OVERHEAD), ("sc", SCALING), ("suite", SUITE)):
        (tmp_path / f"{name}.toml").write_text(text.format(out=tmp_path))
    done = gpuvm(str(tmp_path / "suite.toml"))
    assert done.returncode == 0, done.stderr[-2000:]
    for part in ("ov", "sc"):
        assert (tmp_path / part / "latest" / "COMPLETE").exists()
        assert (tmp_path / part / "latest" / "report.md").exists()
    report = (tmp_path / "suite" / "latest" / "report.md").read_text()
    for expected in ("## Overhead", "### Beside the paper", "~100x native",
                     "## Scaling", "model: makespan", "### Why, from the counts"):
        assert expected in report, expected
    assert (tmp_path / "suite" / "latest" / "scaling.png").exists()
    scaling = _section(report, "## Scaling")
    assert scaling.count("| fv-opt |") == 2 and scaling.count("| pv |") == 2
    assert "emulator" not in scaling  # no wall time beside the model
    again = gpuvm(str(tmp_path / "suite.toml"), "--report", str(tmp_path / "suite" / "latest"))
    assert again.returncode == 0, again.stderr[-2000:]
    rebuilt = (tmp_path / "suite" / "latest" / "report.md").read_text()
    assert _section(rebuilt, "## Scaling") == scaling  # the same rows, replayed
    wrong = gpuvm(str(tmp_path / "suite.toml"), "--report", str(tmp_path / "ov" / "latest"))
    assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1
