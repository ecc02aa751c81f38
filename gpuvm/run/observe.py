"""Watching a run from outside its logic: a progress display and the status file that
`gpuvm smi` reads.

Both are RunObservers (gpuvm/run/execute.py): the run loop tells them what started and
ended, and ticks them every few milliseconds; each keeps its own pace.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from gpuvm.run.spec import Machine, VmSpec
from gpuvm.state import status_dir
from gpuvm.vmm.guest_session import GuestSession

STATUS_PERIOD_S = 0.5  # how often the status file is rewritten
PAGE = 4096


# ------------------------------------------------------------------------ progress
class ProgressObserver:
    """A rich progress display: VMs started and finished, phases done, ETA.  Shown only on
    a terminal; transient, so the tables that follow stand alone."""

    def __init__(self, total_vms: int, label: str, console: Any = None) -> None:
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("{task.fields[detail]}"),
                                 TimeElapsedColumn(), TimeRemainingColumn(),
                                 console=console, transient=True)
        self.task = self.progress.add_task(label, total=total_vms, detail="")
        self.sessions: dict[str, GuestSession] = {}
        self.started_vms = 0
        self.finished_vms = 0
        self._next = 0.0

    def __enter__(self) -> "ProgressObserver":
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def started(self, machine: Machine, spec: VmSpec, device: object,
                session: GuestSession) -> None:
        self.sessions[spec.name] = session
        self.started_vms += 1

    def tick(self, machine: Machine) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + 0.1
        phases = sum(len(s.phases) for s in self.sessions.values())
        self.progress.update(self.task, completed=self.finished_vms,
                             detail=f"started {self.started_vms}, {phases} phases done")

    def finished(self, machine: Machine, result: Any) -> None:
        self.finished_vms += 1
        self._next = 0.0
        self.tick(machine)

    def closing(self, machine: Machine) -> None:
        pass


# ------------------------------------------------------------------------ status file
@dataclass
class VgpuStatus:
    """One vGPU (or a whole GPU passed through, in native mode) as `gpuvm smi` shows it."""

    vm: str
    uuid: str
    type: str
    mode: str
    benchmark: str
    vram_used: int  # bytes of its VRAM slice backed by host memory (written), -1: unknown
    vram_total: int
    channels: int  # channels the guest has bound
    utilisation: float  # compute work it gave the engine in the window, over the window
    share: float  # its scheduler weight, normalised over the running vGPUs
    credit: float | None  # the scheduler's credit (CREDIT/BAND), ns; None for FIFO
    traps_per_s: float
    shadow_syncs: int
    phase: str  # the guest's last finished phase


@dataclass
class RunStatus:
    """What a running `gpuvm run` publishes for `gpuvm smi`: one JSON file per run, rewritten
    as it goes."""

    pid: int
    started: float  # unix time
    updated: float
    mode: str
    policy: str
    window_s: float  # utilisation is over the device time between the last two updates
    engine_utilisation: float | None  # the compute engine (PGRAPH) over the same window
    vgpus: list[VgpuStatus] = field(default_factory=list)
    label: str = ""  # what the run is part of (an experiment's point), for smi's title


_libc = ctypes.CDLL(None, use_errno=True)


def _vram_used(vram: Any, base: int, size: int) -> int:
    """Bytes of [base, base+size) resident in host memory: pages the guest or the GPU has
    written (VRAM is a lazily backed mapping).  mincore() asks without touching a page --
    reading them would make the kernel back every page of the slice."""
    pages = (size + PAGE - 1) // PAGE
    vec = np.zeros(pages, dtype=np.uint8)
    rc = _libc.mincore(ctypes.c_void_p(vram.host_address + base), ctypes.c_size_t(size),
                       vec.ctypes.data_as(ctypes.c_void_p))
    return int(np.count_nonzero(vec & 1)) * PAGE if rc == 0 else -1


def _engine_work(gpu: Any) -> int:
    """Device time of work the compute engine (PGRAPH) has accepted: the engine's own
    count, which the per-channel counts that make each vGPU's share must add up to."""
    return gpu.engines.graph.busy_ns


def _channel_work(gpu: Any, part: Any) -> int:
    """Compute work the engine accepted from a vGPU's channels (the device's own count)."""
    per_chan = gpu.counts.per_channel
    return sum(per_chan.get(c, {}).get("engine.busy_ns", 0)
               for c in range(part.chid_base, part.chid_base + part.channels))


class StatusWriter:
    """Rewrites <state>/runs/<pid>-<n>.json atomically every STATUS_PERIOD_S while the run
    lasts and removes it at the end; `gpuvm smi` reads these (and drops stale ones whose
    process is gone)."""

    _count = 0

    def __init__(self, mode: str, policy: str, state: Path | None = None,
                 period_s: float = STATUS_PERIOD_S, label: str = "") -> None:
        StatusWriter._count += 1
        self.dir = status_dir(state)
        self.path = self.dir / f"{os.getpid()}-{StatusWriter._count}.json"
        self.period_s = period_s
        self.status = RunStatus(os.getpid(), time.time(), 0.0, mode, policy,
                                period_s, None, label=label)
        self.vms: dict[str, tuple[VmSpec, object, GuestSession]] = {}
        self._next = 0.0
        self._last: dict[str, tuple[float, int]] = {}  # vm -> (monotonic, traps)
        self._engine_last: tuple[int, int] | None = None  # (device ns, engine work done)
        self._window: tuple[int, int] | None = None  # device-time window of utilisation
        self._work: dict[str, int] = {}  # vm -> its channels' engine work at the last update
        self._channel_work: dict[str, int] = {}  # vm -> its channels' engine work now

    def started(self, machine: Machine, spec: VmSpec, device: object,
                session: GuestSession) -> None:
        self.vms[spec.name] = (spec, device, session)

    def finished(self, machine: Machine, result: Any) -> None:
        self.vms.pop(result.spec.name, None)
        self._next = 0.0

    def tick(self, machine: Machine) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.period_s
        try:
            self.write(self.snapshot(machine))
        except OSError:
            pass  # a full or read-only state dir must not stop the run

    def closing(self, machine: Machine) -> None:
        self.path.unlink(missing_ok=True)

    # -------------------------------------------------------------- what is written
    def snapshot(self, machine: Machine) -> RunStatus:
        med = getattr(machine, "med", None)
        gpu = getattr(machine, "gpu", None)
        st = self.status
        st.updated = time.time()
        st.vgpus = []
        window = None
        if gpu is not None:
            # one moment for the engine and every vGPU: read under the GPU's lock, which
            # the engine holds while it accepts work and counts it against a channel
            with gpu.lock:
                dev_now = gpu.device_time_ns()
                done = _engine_work(gpu)
                self._channel_work = {name: _channel_work(gpu, device.part)
                                      for name, (_, device, _) in self.vms.items()
                                      if hasattr(device, "part")}
            if self._engine_last is not None and dev_now > self._engine_last[0]:
                window = (self._engine_last[0], dev_now)
                st.engine_utilisation = (done - self._engine_last[1]) / (window[1] - window[0])
            # utilisation is work accepted in the window (a kernel counts when it starts),
            # so one window may read over 1 and the next under; a run's average is exact
                st.window_s = (window[1] - window[0]) / 1e9
            self._engine_last = (dev_now, done)
        self._window = window
        for name, (spec, device, session) in list(self.vms.items()):
            st.vgpus.append(self._vgpu(name, spec, device, session, med))
        return st

    def _vgpu(self, name: str, spec: VmSpec, device: Any, session: GuestSession,
              med: Any) -> VgpuStatus:
        counters = device.counters()
        traps = sum(v for k, v in counters.items() if k.startswith("trap.bar"))
        now = time.monotonic()
        last_t, last_traps = self._last.get(name, (now, traps))
        self._last[name] = (now, traps)
        rate = (traps - last_traps) / (now - last_t) if now > last_t else 0.0
        phase = session.phases[-1].name if session.phases else "-"
        if med is not None:  # a vGPU
            part = device.part
            gpu = med.gpu
            util = self._utilisation(name, self._channel_work.get(name, 0))
            # (a VM that has just ended may have left the scheduler: no share, no credit)
            share, credit = med.submissions.standing(device) or (0.0, None)
            return VgpuStatus(name, device.uuid, device.type_id, device.mode.name,
                              spec.benchmark, _vram_used(gpu.vram, part.vram_base,
                                                         part.vram_size),
                              part.vram_size, len(device.channels.by_vchid), util,
                              share, credit, rate,
                              counters.get("shadow.syncs", 0), phase)
        gpu = device.gpu  # native: a whole GPU of its own
        dev_now = gpu.device_time_ns()
        busy = _engine_work(gpu)
        return VgpuStatus(name, spec.mdev_uuid or "-", spec.mdev_type or "whole GPU",
                          "native", spec.benchmark,
                          _vram_used(gpu.vram, 0, gpu.profile.vram_size),
                          gpu.profile.vram_size, 0,
                          min(1.0, busy / dev_now) if dev_now else 0.0, 1.0, None, rate,
                          0, phase)

    def _utilisation(self, name: str, work_ns: int) -> float:
        """The compute work this vGPU's channels gave the engine inside the window, over
        the window (the device counts it per channel as the engine accepts it)."""
        last = self._work.get(name)
        self._work[name] = work_ns
        if self._window is None or last is None:
            return 0.0
        return (work_ns - last) / (self._window[1] - self._window[0])

    def write(self, status: RunStatus) -> None:
        """Atomically: a reader sees the old file or the new one, never half of one."""
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(status)))
        os.replace(tmp, self.path)
