"""Traces the model replays, recorded once per (benchmark, parameters, mode, driver).

A trace is what one VM did when it ran alone on the emulator: its exact per-phase counts
(traps by class, shadow syncs and entries scanned, hypercalls and their entries,
doorbells, engine time).  The counts are deterministic (tests/test_vfio_counts_pinned.py),
so one run serves every replay; the cache is results/traces/<key>.json and `refresh`
re-records it (after a change to the guests or the mediator).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpuvm.experiment.config import Experiment, Scenario, VmConfig
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.execute import rows_for, specs_for
from gpuvm.mediator.modes import MODES
from gpuvm.run import run_vms
from gpuvm.run.spec import RunOptions

# under the current directory, as experiments' results are (never the installation)
CACHE = Path("results") / "traces"
# 6: per-phase counts only, as JSON (5 and before: per-event wall-time traces, .npz)
FORMAT = 6


@dataclass(frozen=True)
class TraceKey:
    benchmark: str
    params: tuple[int, ...]
    mode: str

    @property
    def driver(self) -> str:
        """The guest binary the mode runs (native and every fv mode share one)."""
        return "pv" if MODES[self.mode].pv else "direct"

    @property
    def file_name(self) -> str:
        params = "-".join(str(p) for p in self.params) or "default"
        return f"{self.benchmark}_{params}_{self.mode.replace('+', 'plus')}_{self.driver}.json"


def record_run(key: TraceKey, backend: str) -> dict[str, Any]:
    """One VM of `key` run once; its per-phase counts (not cached)."""
    vm = VmConfig("vm", key.benchmark, key.params)
    scenario = Scenario("trace", (vm,))
    exp = Experiment("traces", "benchmarks", (scenario,), modes=(key.mode,))
    results = run_vms(specs_for(scenario), RunOptions(mode=key.mode, backend=backend))
    (row,) = rows_for(exp, scenario, key.mode, "fifo", 0, results, load_costs("xen-2014"))
    if not row.passed:
        raise RuntimeError(f"recording {key.file_name}: the VM failed: {row.error}")
    d = asdict(row)
    return {"format": FORMAT, "key": asdict(key) | {"driver": key.driver},
            "backend": row.backend, "phase_counters": d["phase_counters"],
            "record": d["record"]}


def read_trace(path: Path) -> dict[str, Any] | None:
    """The cached trace, or None where it is of another format (or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == FORMAT else None


def load_trace(key: TraceKey, backend: str = "auto", refresh: bool = False,
               cache: Path = CACHE) -> dict[str, Any]:
    """The trace of `key`, recorded now if it is not cached (or `refresh`)."""
    path = cache / key.file_name
    if not refresh:
        data = read_trace(path)
        if data is not None:
            return data
    text = json.dumps(record_run(key, backend), indent=1)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")  # a partial file never replaces a whole one
    tmp.write_text(text)
    tmp.replace(path)
    return json.loads(text)  # the same form a cached trace has
