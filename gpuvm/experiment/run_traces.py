"""The per-event traces a scaling run keeps beside its rows, for the model's validation.

A scaling experiment runs 1, 2, 4 and 8 VMs of one benchmark per mode; the model of the
whole system predicts those makespans by replaying one VM's per-event trace
(gpuvm.sim.replay).  The shared trace cache (gpuvm.sim.traces.CACHE) holds whichever
recording was made first -- hours or sessions before, under another load -- and on this
host a cached fv-opt trace ran 40% slower than the runs it was to predict (make paper,
2026-11-27).  So once a scaling run's VMs are done, one VM of each (benchmark, mode) is
recorded right after them and kept in the run directory (`traces/`), with the host's
core count; the report's validation replays those (`gpuvm.experiment.paper`), and a
report rebuilt later replays the same ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Mapping

from gpuvm.experiment.config import Experiment
from gpuvm.sim.traces import TraceKey, read_trace, record_fastest

TRACES = "traces"  # in the run directory
ABOUT = "about.json"  # the host they were recorded on: {"cpus": N}


def keys(exp: Experiment) -> dict[tuple[str, str], TraceKey]:
    """Per (mode, scenario) the TraceKey of one VM of the scenario's benchmark (a
    scaling scenario's VMs all run one benchmark), in its own VMM process where the
    experiment's VMs are (`isolated`)."""
    return {(mode, s.name): TraceKey(s.vms[0].benchmark, s.vms[0].params, mode, exp.isolated)
            for mode in exp.modes for s in exp.scenarios if s.vms}


def record(exp: Experiment, run_path: Path, backend: str,
           progress: Callable[[str], None] = lambda line: None) -> None:
    """Record each trace `exp`'s scenarios need that `run_path` has not got yet (a
    resumed run records only what is missing)."""
    directory = run_path / TRACES
    directory.mkdir(exist_ok=True)
    for key in dict.fromkeys(keys(exp).values()):
        if not (directory / key.file_name).is_file():
            progress(f"recording one VM's trace for the validation: {key.file_name}")
            record_fastest(key, 1, backend, cache=directory)
    (directory / ABOUT).write_text(json.dumps({"cpus": os.cpu_count()}))


def load(exp: Experiment, run_path: Path
         ) -> tuple[Callable[[str, str], Mapping], int] | None:
    """`trace_of(mode, scenario)` over the traces `run_path` kept, and the core count of
    the host they were recorded on; None where the run kept none (runs from before, or
    an incomplete set)."""
    directory = run_path / TRACES
    try:
        cpus = int(json.loads((directory / ABOUT).read_text())["cpus"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    by_point = keys(exp)
    traces = {key: read_trace(directory / key.file_name) for key in set(by_point.values())}
    if any(trace is None for trace in traces.values()):
        return None
    return (lambda mode, scenario: traces[by_point[(mode, scenario)]]), cpus
