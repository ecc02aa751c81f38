"""Traces the model replays, recorded once per (benchmark, parameters, mode, driver).

A trace is what one VM did when it ran alone on the emulator, in order: its per-event
trace (gpuvm.vmm.event_trace: runs of equal events -- traps by class, port writes --
each with the time its handlers took, the time between them, and the difference of every
counter over it: shadow syncs and entries scanned, hypercalls and their entries,
doorbells, engine time), plus its per-phase counts and wall time.  The counts are
deterministic (tests/test_vfio_counts_pinned.py), so one run serves every replay; the
cache is results/traces/<key>.npz (the event columns, and the rest as JSON in `meta`)
and `refresh` re-records it (after a change to the guests or the mediator, or to take
the times under the host's present load).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuvm.experiment.config import VmConfig
from gpuvm.mediator.modes import MODES
from gpuvm.vmm.event_trace import LOCK_RELEASES, EventTrace

# under the current directory, as experiments' results are (never the installation)
CACHE = Path("results") / "traces"
# 5: VMs as threads carry where their handlers let the interpreter lock go
# (LOCK_RELEASES, counted in a run of its own); 4: a VM in its own process counts a
# counter read's wait only while the server ran its channels (3 counted every read
# beyond the median); 3: runs keep the guest time before a change of class (2 lost
# it); 1 was per-phase counts
FORMAT = 5
# what a saved validation bundle may hold: 3 and 4 have 5's columns, recorded by older
# rules and without the releases (a replay takes the lock once per exit there)
BUNDLE_FORMATS = (3, 4, FORMAT)


@dataclass(frozen=True)
class TraceKey:
    benchmark: str
    params: tuple[int, ...]
    mode: str
    # the VM in its own VMM process over vfio-user (RunOptions.isolated): its traps are
    # round trips to the server, and the trace says which part the server spent
    isolated: bool = False

    @property
    def driver(self) -> str:
        """The guest binary the mode runs (native and every fv mode share one)."""
        return "pv" if MODES[self.mode].pv else "direct"

    @property
    def file_name(self) -> str:
        params = "-".join(str(p) for p in self.params) or "default"
        where = "_isolated" if self.isolated else ""
        return f"{self.benchmark}_{params}_{self.mode.replace('+', 'plus')}_{self.driver}" \
            f"{where}.npz"


def _record(key: TraceKey, backend: str) -> dict[str, Any]:
    """A recorded trace, with its lock releases (`with_lock_releases`)."""
    return with_lock_releases(record_run(key, backend), key, backend)


def with_lock_releases(trace: dict[str, Any], key: TraceKey, backend: str
                       ) -> dict[str, Any]:
    """`trace` with where its VM lets the interpreter lock go (LOCK_RELEASES), counted in
    one more run of the VM (counting slows what it counts: RunOptions
    .count_lock_releases).  The counting run's events are the trace's where the two runs
    made the same runs of events (the counts are deterministic; so are most sequences);
    else each of the trace's runs gets its class's releases per event in the counting
    run, whole releases as they add up.  Unchanged for a VM in its own process (its
    releases are its own process's lock), for a guest without KVM_RUN (the in-process
    backend: there a count would mean something else) and where the host cannot count
    them."""
    if key.isolated or trace.get("backend") != "kvm":
        return trace
    counted = record_run(key, backend, count_lock_releases=True)["events"]
    if LOCK_RELEASES not in counted.names:
        return trace
    events: EventTrace = trace["events"]
    releases = counted.counter(LOCK_RELEASES)
    if not (len(counted) == len(events) and np.array_equal(counted.code, events.code)
            and np.array_equal(counted.events, events.events)):
        per_event = {int(c): releases[counted.code == c].sum()
                     / max(1, counted.events[counted.code == c].sum())
                     for c in np.unique(counted.code)}
        so_far = np.cumsum([per_event.get(int(c), 0.0) * n
                            for c, n in zip(events.code, events.events)])
        releases = np.diff(np.floor(so_far).astype(np.int64), prepend=0)
    return trace | {"events": events.with_counter(LOCK_RELEASES, releases)}


def record_run(key: TraceKey, backend: str, count_lock_releases: bool = False
               ) -> dict[str, Any]:
    """One VM of `key` run once with its events recorded (not cached; `record_fastest`
    keeps the fastest of several)."""
    from dataclasses import asdict

    from gpuvm.experiment.config import Experiment, Scenario
    from gpuvm.experiment.costs import load_costs
    from gpuvm.experiment.execute import rows_for, specs_for
    from gpuvm.run import run_vms
    from gpuvm.run.spec import RunOptions

    vm = VmConfig("vm", key.benchmark, key.params)
    scenario = Scenario("trace", (vm,))
    exp = Experiment("traces", "benchmarks", (scenario,), modes=(key.mode,))
    results = run_vms(specs_for(scenario), RunOptions(mode=key.mode, backend=backend,
                                                      record_events=True,
                                                      isolated=key.isolated,
                                                      count_lock_releases=count_lock_releases))
    (row,) = rows_for(exp, scenario, key.mode, "fifo", 0, results, load_costs("xen-2014"))
    if not row.passed:
        raise RuntimeError(f"recording {key.file_name}: the VM failed: {row.error}")
    d = asdict(row)
    return {"format": FORMAT, "key": asdict(key) | {"driver": key.driver},
            "backend": row.backend, "phase_counters": d["phase_counters"],
            "wall_ns": d["wall_ns"], "record": d["record"],
            "events": results[0].session.recorder.trace()}


def write_trace(path: Path, trace: dict[str, Any]) -> None:
    """Store a trace (atomically: a partial file never replaces a whole one)."""
    meta = {k: v for k, v in trace.items() if k != "events"}
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.array(json.dumps(meta)), **trace["events"].arrays())
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def read_trace(path: Path, formats: tuple[int, ...] = (FORMAT,)) -> dict[str, Any] | None:
    """The cached trace, or None where it is of a format not in `formats` (or
    unreadable)."""
    try:
        with np.load(path, allow_pickle=False) as a:
            meta = json.loads(str(a["meta"]))
            if meta.get("format") not in formats:
                return None
            return meta | {"events": EventTrace.from_arrays(a)}
    except (OSError, ValueError, KeyError):
        return None


def load_trace(key: TraceKey, backend: str = "auto", refresh: bool = False,
               cache: Path = CACHE) -> dict[str, Any]:
    """The trace of `key`, recorded now if it is not cached (or `refresh`)."""
    path = cache / key.file_name
    if not refresh and path.is_file():
        data = read_trace(path)
        if data is not None:
            return data
    cache.mkdir(parents=True, exist_ok=True)
    write_trace(path, _record(key, backend))
    data = read_trace(path)  # the same form a cached trace has
    assert data is not None
    return data


@dataclass
class Fastest:
    """The fastest of the recordings of one trace made so far, and how many were made:
    recordings may be made one at a time, each beside a run of the point the trace
    prices, and the fastest kept once the point has all its runs (record_fastest)."""

    trace: dict[str, Any] | None = None
    made: int = 0

    def add(self, trace: dict[str, Any]) -> None:
        """Count `trace`, keeping it where it is faster than every one before (host load
        only ever adds time, so the fastest recording is the least disturbed one)."""
        if self.trace is None or sum(trace["wall_ns"].values()) \
                < sum(self.trace["wall_ns"].values()):
            self.trace = trace
        self.made += 1


def record_fastest(key: TraceKey, reps: int, backend: str = "auto",
                   cache: Path = CACHE, so_far: Fastest | None = None) -> dict[str, Any]:
    """Record `key` until there are `reps` recordings (with those `so_far` made) and
    cache the fastest; returns it."""
    fastest = so_far if so_far is not None else Fastest()
    while fastest.made < max(1, reps):
        fastest.add(record_run(key, backend))
    assert fastest.trace is not None
    best = with_lock_releases(fastest.trace, key, backend)
    cache.mkdir(parents=True, exist_ok=True)
    write_trace(cache / key.file_name, best)
    data = read_trace(cache / key.file_name)
    assert data is not None
    return data
