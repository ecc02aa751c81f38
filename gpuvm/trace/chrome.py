"""A RunObserver that records a run as Chrome trace-event JSON (Perfetto loads it).

Times: slices of the guest (its phases) are wall time; engine slices come from the
scheduler's record in device time and are placed on the wall clock through the GPU's
time scale (device ns = wall ns x time_scale since the GPU started), so both line up.

Track layout (tids inside each VM's process):
  1 vCPU       one slice per guest phase (Init, HtoD, ...)
  2 engine     one slice per submission the scheduler ran for this VM
Counters per VM: channels, utilisation, credit (CREDIT/BAND), shadow syncs, hypercalls
(cumulative, so the last value is the run's count).  The GPU process (pid 1) holds
`scheduler`: one instant per dispatch decision, named after the VM chosen.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from gpuvm.run.spec import Machine, VmSpec
from gpuvm.vmm.guest_session import GuestSession

GPU_PID = 1
VCPU_TID, ENGINE_TID, SCHED_TID = 1, 2, 1
COUNTER_PERIOD_S = 0.05


class TraceRecorder:
    """A run observer that writes the run as Chrome trace-event JSON (Perfetto opens it): guest
    phases, engine slices and counters per VM."""

    def __init__(self, time_scale: float = 1.0) -> None:
        self.time_scale = time_scale
        self.t0 = time.monotonic_ns()
        self.events: list[dict[str, Any]] = [
            _meta("process_name", GPU_PID, 0, "GPU"),
            _meta("thread_name", GPU_PID, SCHED_TID, "scheduler"),
        ]
        self.vms: dict[str, tuple[int, VmSpec, Any, GuestSession]] = {}
        self._phases_seen: dict[str, int] = {}
        self._cursor: dict[str, float] = {}  # vm -> where its next phase begins (us)
        self._next = 0.0
        self._dev0: tuple[int, int] | None = None  # (wall ns since t0, device ns) at start

    # -------------------------------------------------------------- observer
    def started(self, machine: Machine, spec: VmSpec, device: Any,
                session: GuestSession) -> None:
        pid = GPU_PID + 1 + len(self.vms)
        self.vms[spec.name] = (pid, spec, device, session)
        self._phases_seen[spec.name] = 0
        self._cursor[spec.name] = self._now_us()
        gpu = getattr(machine, "gpu", None)
        if gpu is not None and self._dev0 is None:
            self._dev0 = (self._now_us() * 1000, gpu.device_time_ns())
        kind = getattr(device, "type_id", None) or spec.mdev_type or "whole GPU"
        self.events += [_meta("process_name", pid, 0, f"{spec.name} ({spec.benchmark}, "
                                                      f"{kind})"),
                        _meta("thread_name", pid, VCPU_TID, "vCPU"),
                        _meta("thread_name", pid, ENGINE_TID, "engine")]

    def tick(self, machine: Machine) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + COUNTER_PERIOD_S
        for name in list(self.vms):
            self._sample(machine, name)

    def finished(self, machine: Machine, result: Any) -> None:
        name = result.spec.name
        self._sample(machine, name)
        pid = self.vms[name][0]
        m = result.scheduler
        if m is not None:
            for start, end in m.busy:
                ts = self._device_to_us(start)
                self.events.append({"ph": "X", "name": "submission", "pid": pid,
                                    "tid": ENGINE_TID, "ts": ts,
                                    "dur": max(self._device_to_us(end) - ts, 0.001)})
                self.events.append({"ph": "i", "s": "t", "name": name, "pid": GPU_PID,
                                    "tid": SCHED_TID, "ts": ts, "args": {"dispatch": name}})

    def closing(self, machine: Machine) -> None:
        pass

    # -------------------------------------------------------------- recording
    def _now_us(self) -> float:
        return (time.monotonic_ns() - self.t0) / 1000

    def _device_to_us(self, device_ns: int) -> float:
        if self._dev0 is None:
            return 0.0
        wall0_ns, dev0 = self._dev0
        return (wall0_ns + (device_ns - dev0) / self.time_scale) / 1000

    def _sample(self, machine: Machine, name: str) -> None:
        pid, spec, device, session = self.vms[name]
        now = self._now_us()
        phases = list(session.phases)
        for p in phases[self._phases_seen[name]:]:
            # phases follow one another from the VM's start, so each begins where the one
            # before ended: exact, however late the run loop gets to look
            self.events.append({"ph": "X", "name": p.name, "pid": pid, "tid": VCPU_TID,
                                "ts": self._cursor[name], "dur": p.wall_ns / 1000,
                                "args": {"device_ms": p.device_ns / 1e6}})
            self._cursor[name] += p.wall_ns / 1000
        self._phases_seen[name] = len(phases)
        counters = device.counters()
        values: dict[str, float] = {
            "shadow syncs": counters.get("shadow.syncs", 0),
            "hypercalls": counters.get("hcall.calls", 0),
        }
        channels = getattr(device, "channels", None)
        if channels is not None:
            values["channels"] = len(channels.by_vchid)
        med = getattr(machine, "med", None)
        if med is not None:
            m = med.submissions.metrics(device)
            gpu_now = med.gpu.device_time_ns()
            if m is not None:
                values["utilisation"] = m.utilisation_series(
                    np.array([gpu_now]), 100_000_000)[0].item()
            standing = med.submissions.standing(device)  # None: it has left
            if standing is not None and standing[1] is not None:
                values["credit ms"] = standing[1] / 1e6
        for key, value in values.items():
            self.events.append({"ph": "C", "name": key, "pid": pid, "ts": now,
                                "args": {"value": value}})

    def write(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"traceEvents": self.events, "displayTimeUnit": "ms"}))
        return path


def _meta(kind: str, pid: int, tid: int, name: str) -> dict[str, Any]:
    return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}
