"""Modelled time: exact counts times a cost profile, plus the device's engine time.

Emulation costs differ from the paper's hardware (a Python trap is ~20 us, not ~1 us), so
wall time alone cannot be compared with the paper's ratios.  The counts are exact, so
pricing them with a stated profile (experiments/costs/*.toml) gives times that can; the
profile says what it assumes.
"""

from __future__ import annotations

import bisect
import math
import tomllib
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Mapping

from gpuvm.device import regs
from gpuvm.mediator.modes import MODES

# the checkout's experiments/costs/, or the copy a `pip install .` puts in the package
_CHECKOUT_COSTS = Path(__file__).resolve().parents[2] / "experiments" / "costs"
COSTS_DIR = _CHECKOUT_COSTS if _CHECKOUT_COSTS.is_dir() else \
    Path(__file__).resolve().parent / "files" / "costs"


def mmio_exits(counters: Mapping[str, int]) -> int:
    """Every MMIO exit a row or phase counted (`exits.mmio.<bar>.<read|write>`): in a
    mediated mode the traps, natively the bare-metal accesses they stand for."""
    return sum(v for k, v in counters.items() if k.startswith("exits.mmio."))


def _beyond_first(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """ys at x (linear between the points xs, flat beyond them) less ys at the first
    point; 0 before it or without points."""
    i = bisect.bisect_right(xs, x)
    if i == 0:
        return 0.0
    if i == len(xs):
        return ys[-1] - ys[0]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0) - ys[0]


# The modes that take a measured quantity from a field of their own where one was
# measured on their runs: every PV mode pv's (pv_...), fv-opt its own (fv_opt_...);
# every other mode takes the plain field, measured on fv
OWN_FIELD_PREFIX = {mode: "pv_" for mode, spec in MODES.items() if spec.pv} \
    | {"fv-opt": "fv_opt_"}
OWN_FIELD_MODES = ("fv-opt", "pv")  # the modes those fields are measured on
# the work under the lock's growth with the VMs, timed (gpuvm.calibrate.lock_use)
LOCK_WORK_SCALE_OF = {mode: f"{prefix}lock_work_scale"
                      for mode, prefix in OWN_FIELD_PREFIX.items()}
MODE_LOCK_WORK_SCALES = tuple(dict.fromkeys(LOCK_WORK_SCALE_OF.values()))  # each once
# the guests' time inside KVM_RUN's growth with the VMs, timed in the same runs
GUEST_WORK_SCALE_OF = {mode: f"{prefix}guest_work_scale"
                       for mode, prefix in OWN_FIELD_PREFIX.items()}
GUEST_WORK_SCALES = ("guest_work_scale",
                     *dict.fromkeys(GUEST_WORK_SCALE_OF.values()))  # each once
# how often the host's scheduler took a vCPU thread's core, per ms of its CPU, inside
# KVM_RUN (its guest running) and outside it (holding the lock), timed in the same runs
GUEST_PREEMPTS_OF = {mode: f"{prefix}guest_preempts_per_ms"
                     for mode, prefix in OWN_FIELD_PREFIX.items()}
HELD_PREEMPTS_OF = {mode: f"{prefix}held_preempts_per_ms"
                    for mode, prefix in OWN_FIELD_PREFIX.items()}
PREEMPT_RATES = ("guest_preempts_per_ms", *dict.fromkeys(GUEST_PREEMPTS_OF.values()),
                 "held_preempts_per_ms", *dict.fromkeys(HELD_PREEMPTS_OF.values()))
# keys that profiles written before no longer price: read, and let go
RETIRED_KEYS = frozenset({
    # the share of releases inside handlers that cost the lock, fitted on 2 VMs: the
    # lock as CPython writes it (gpuvm.sim.replay) decides that at each release
    "lock_release_takes"})
# the recorder's cost per event, measured in place (gpuvm.calibrate.record_cost.in_situ)
RECORD_EVENT_OF = {mode: f"{prefix}record_event_ns"
                   for mode, prefix in OWN_FIELD_PREFIX.items()}
MODE_RECORD_EVENTS = tuple(dict.fromkeys(RECORD_EVENT_OF.values()))  # each once
RECORD_EVENT_MODE = {"record_event_ns": "fv"} \
    | {RECORD_EVENT_OF[mode]: mode for mode in OWN_FIELD_MODES}  # measured on


@dataclass(frozen=True)
class CostProfile:
    name: str
    mmio_native_ns: float
    aperture_native_ns: float
    trap_ns: float
    hypercall_ns: float
    hcall_entry_ns: float
    pt_alloc_ns: float
    pte_scanned_ns: float
    shadow_sync_ns: float
    remap_ns: float
    # Optional keys (a profile without them prices those events at 0 / keeps the default):
    # the mediator's own part of trap_ns, done under its lock (the model of the whole
    # system serialises it; gpuvm.sim.replay)
    trap_mediator_ns: float = 0.0
    # one 64-bit word of a new PV page directory or table zeroed by the hypervisor: the
    # PV path allocates whole tables, and zeroing them is what the native driver does
    # itself with BAR stores (pt_zero_words), so both pay for it
    pt_zero_word_ns: float = 0.0
    # one byte of a pageable copy staged through the runtime's pinned bounce buffer
    # (a guest memcpy; counted as copy.bounce_bytes)
    bounce_byte_ns: float = 0.0
    # host cores the model of the whole system gives the VMs (gpuvm.sim.replay)
    host_cores: float = 8.0
    # a port I/O exit (phase marks, waits): nearly free on the paper's platform, not on
    # this emulator (gpuvm calibrate --emulator)
    io_exit_ns: float = 0.0
    # VRAM oversubscription (gpuvm.sim.residency): one residency switch's fixed part,
    # the mediator's work per page moved (its shadow PTE rewritten), and the copy
    # engine's time per byte moved between VRAM and host memory
    residency_switch_ns: float = 0.0
    residency_page_ns: float = 0.0
    residency_byte_ns: float = 0.0
    # This emulator's host side (gpuvm calibrate --emulator): of each exit's price, the
    # part spent off the interpreter lock (KVM_RUN: the exit and re-entry); how long a
    # port wait takes beyond the engine time it waits for (the doorbell-to-interrupt
    # round trip through the scheduler and engine threads); whether the VMs' Python work
    # is serialised by one interpreter lock (1: they are threads of one process); and
    # whether a replay adds the guest's own time between exits recorded in its trace (1:
    # predicting this emulator, where the guest runs on the same cores).
    exit_free_ns: float = 0.0
    wait_ns: float = 0.0
    interpreter_lock: float = 0.0
    guest_time: float = 0.0
    # 1: a replay of a per-event trace takes each run's times as recorded (handler time
    # under the interpreter lock, time between events off it, a wait's latency) and
    # models only the contention; the prices above still price counts (reports, rows).
    # It is how the model is validated on a host whose load moves the prices between
    # calibration and validation: the trace is recorded just before the runs it predicts.
    recorded_times: float = 0.0
    # What recording the trace cost per event (the recorder's Python around each exit,
    # timed apart: gpuvm.calibrate.record_cost), which a run that records nothing does
    # not spend: a replay of recorded times takes it off each run's exit-loop time.  0:
    # the traces are replayed as recorded (profiles and bundles from before).  Where it
    # was measured in place, on plain and recorded runs of each mode (record_cost.in_situ),
    # record_event_ns is fv's and these are fv-opt's and pv's (RECORD_EVENT_OF); 0: the
    # mode's traces take record_event_ns.
    record_event_ns: float = 0.0
    fv_opt_record_event_ns: float = 0.0
    pv_record_event_ns: float = 0.0
    # How long a thread woken for the interpreter lock takes to be running again (in a
    # virtual machine a wake-up is an interprocessor interrupt to an idle vCPU, tens of
    # microseconds); meanwhile the lock is free and a thread already running may take
    # it (gpuvm.sim.replay).  The validation takes the wake-up curve's first latency,
    # measured beside the runs (gpuvm.calibrate.validation.price_lock); bundles without
    # a curve fit it on the 2-VM runs.  0 with interpreter_lock: a take costs nothing.
    lock_handoff_ns: float = 0.0
    # How long a thread takes to run again once woken, by how long it slept (measured
    # by `gpuvm calibrate --emulator` as the time the interpreter lock sits free when
    # threads taking turns at it pass it on, gpuvm/calibrate/lock_turns.py; in bundles
    # from before that, through a pipe, gpuvm/calibrate/wake.py): on a virtual machine an
    # idle vCPU polls for a while before it halts (Linux cpuidle-haltpoll,
    # guest_halt_poll_ns, 200 us by default), so a thread woken within that window runs
    # again in a few microseconds and one woken after it waits for the halted vCPU to
    # be brought back.  A thread that waited for the interpreter lock longer pays the
    # difference on top of lock_handoff_ns (fitted where the waits are short).  Both
    # empty: every hand-off costs the same.
    wake_slept_ns: tuple[float, ...] = ()
    wake_latency_ns: tuple[float, ...] = ()
    # And how long the exit a woken thread then handles takes, by how long it slept
    # (measured on this emulator's own exits, gpuvm/calibrate/wake.py): on the lent
    # machines an exit handled after 0.6-1 ms asleep took 5-11 us more than one after
    # 50-300 us -- its core went idle meanwhile, and its caches cold.  A thread that
    # waited for the lock longer pays that difference too.  Empty: not measured.
    wake_work_ns: tuple[float, ...] = ()
    # What letting the interpreter lock go costs the thread that lets it go, where that
    # wakes a thread asleep for it: CPython's drop signals one waiter (a futex wake,
    # through the hypervisor where the waiter's vCPU halted) and the dropper pays for it
    # on its own core, off the lock (gpuvm.sim.replay._System.drop_lock).  Measured by
    # `gpuvm calibrate --emulator` (gpuvm.calibrate.wake_cost): 5.3-8.7 us on the 2-core
    # development host, 1.3-1.8 us on lent 16-core machines.  0: free.
    lock_signal_ns: float = 0.0
    # How much longer the work under the interpreter lock takes with this many VMs run
    # as threads than with the first count of lock_work_vms: timed in runs of their own
    # (gpuvm.calibrate.lock_use: each vCPU thread's CPU outside KVM_RUN, per exit, fv VMs
    # of the `idle` benchmark).  From one VM (the trace's own work) where the runs timed
    # one VM alone: on the lent machines fv's grew 1.25-1.41x to 2 VMs and 1.4-1.7x to
    # 8; profiles from before begin at 2 VMs (the count lock_handoff_ns was fitted on,
    # which then held the growth to 2).  Linear in log2 of the VM count between the
    # measured counts, flat beyond them, 1 below the first.  Both empty: the work is one
    # VM's at any count.  lock_work_scale is also every mode's without its own below.
    # Where a sitting also ran the VMs untimed (gpuvm.calibrate.untimed_growth), a mode
    # so run takes their CPU per VM's growth here and in its guest_work_scale.
    lock_work_vms: tuple[float, ...] = ()
    lock_work_scale: tuple[float, ...] = ()
    # The same for VMs whose exits are hypercalls (Mode.pv), at the same counts: timed
    # on pv VMs running kernels (gpuvm.calibrate.lock_use), whose work grew 1.27-1.40x
    # at 8 VMs on lent machines where fv's grew 1.15-1.21x.  Empty: as lock_work_scale.
    pv_lock_work_scale: tuple[float, ...] = ()
    # And for fv-opt VMs (fewer, lighter exits than fv's: its BAR pages remapped, its
    # shadows synced lazily), at the same counts, timed on fv-opt VMs of `idle`: on
    # the lent machines its work grew 1.12-1.39x from one VM to two where fv's grew
    # 1.25-1.41x in the same rounds.  Empty: as lock_work_scale.
    fv_opt_lock_work_scale: tuple[float, ...] = ()
    # How much longer the guests' time on their cores between exits (inside KVM_RUN) takes
    # with this many VMs as threads than with one, at the counts of lock_work_vms: timed
    # in the same runs (gpuvm.calibrate.lock_use: each vCPU thread's CPU inside KVM_RUN
    # per exit, each count's fastest run).  With the VMs' threads keeping their cores
    # through their guest stretches, the cores' other threads and the hypervisor's
    # wake-ups slow the guests: on the development host fv's grew 1.27x at 4 VMs and
    # 1.56x at 8 (20261129-020242).
    # Without it the lock as CPython writes it put 71 of 96 points of eight bundles
    # within 10%, with it 90 (docs/model-validation.md).  Per mode as the work under the
    # lock is (GUEST_WORK_SCALE_OF); empty: the guest's time as traced at any count.
    guest_work_scale: tuple[float, ...] = ()
    pv_guest_work_scale: tuple[float, ...] = ()
    fv_opt_guest_work_scale: tuple[float, ...] = ()
    # How often the host's scheduler takes a vCPU thread's core where threads outnumber
    # cores, per ms of the thread's CPU, at the counts of lock_work_vms: inside KVM_RUN
    # (a guest's stretch cut short: its thread waits for a core again behind the
    # threads waiting already) and outside it (the same befalling a thread that holds
    # the lock, which every thread wanting it then waits out).  Timed in the lock's
    # runs (gpuvm.calibrate.lock_use: the threads' involuntary context switches, split
    # at KVM_RUN, each count's fastest run).  On the 2-core development host fv's
    # guests lost their core 7-9 times a ms of their CPU at 4 VMs and 11-12 at 8, and
    # holders 0.7 and 2.0-2.3; on lent 16-core machines never.  A model whose threads
    # keep their cores until they block lets two threads take turns at the lock in
    # lock-step, one's handler inside the other's guest stretch, and they almost never
    # meet it held (0.02-0.04 sleeps an exit at 4 and 8 fv VMs, where untimed runs
    # sleep at 0.2-0.3 and 0.8-0.9); cut at these rates they meet it as the runs do
    # (docs/model-validation.md, "Cores taken at the measured rates").  Per mode as
    # the work's growth is (GUEST_PREEMPTS_OF, HELD_PREEMPTS_OF); linear in log2 of the
    # count between the measured counts, flat beyond them, 0 below the first; empty:
    # never.
    guest_preempts_per_ms: tuple[float, ...] = ()
    pv_guest_preempts_per_ms: tuple[float, ...] = ()
    fv_opt_guest_preempts_per_ms: tuple[float, ...] = ()
    held_preempts_per_ms: tuple[float, ...] = ()
    pv_held_preempts_per_ms: tuple[float, ...] = ()
    fv_opt_held_preempts_per_ms: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.lock_work_vms) != len(self.lock_work_scale):
            raise ValueError("lock_work_vms and lock_work_scale differ in length")
        for key in (*MODE_LOCK_WORK_SCALES, *GUEST_WORK_SCALES, *PREEMPT_RATES):
            if getattr(self, key) and len(getattr(self, key)) != len(self.lock_work_vms):
                raise ValueError(f"lock_work_vms and {key} differ in length")
        if list(self.lock_work_vms) != sorted(self.lock_work_vms) or \
                any(v < 1 for v in self.lock_work_vms):
            raise ValueError("lock_work_vms must ascend from 1 VM or more")
        if len(self.wake_slept_ns) != len(self.wake_latency_ns):
            raise ValueError("wake_slept_ns and wake_latency_ns differ in length")
        if self.wake_work_ns and len(self.wake_work_ns) != len(self.wake_slept_ns):
            raise ValueError("wake_work_ns and wake_slept_ns differ in length")
        if list(self.wake_slept_ns) != sorted(self.wake_slept_ns):
            raise ValueError("wake_slept_ns must ascend")

    def wake_extra_ns(self, slept_ns: float) -> float:
        """What a thread that slept `slept_ns` takes to wake, and then to handle its
        exit, beyond one that slept the shortest time measured (linear between the
        measured sleeps, flat beyond them; 0 without a measured curve).  Not numpy: the
        replay asks once per hand-off."""
        xs = self.wake_slept_ns
        extra = _beyond_first(xs, self.wake_latency_ns, slept_ns)
        if self.wake_work_ns:
            extra += _beyond_first(xs, self.wake_work_ns, slept_ns)
        return max(0.0, extra)

    def record_event_ns_of(self, mode: str | None) -> float:
        """What recording `mode`'s trace cost per event: the field RECORD_EVENT_OF names
        for the mode where measured, else record_event_ns."""
        own = RECORD_EVENT_OF.get(mode or "")
        return (getattr(self, own) if own else 0.0) or self.record_event_ns

    def with_record_costs(self, by_mode: Mapping[str, float]) -> "CostProfile":
        """This profile with the recorder's cost per event measured per mode (`by_mode`,
        record_cost.in_situ): fv's (else any mode's without a field of its own) as
        record_event_ns, fv-opt's and pv's in theirs; a mode not in `by_mode` leaves its
        field as it is.  Where two modes share a field (fv and fv+lazy; pv and pv-naive)
        the one named like the field's own mode (RECORD_EVENT_MODE) is kept."""
        values: dict[str, float] = {}
        for mode, ns in by_mode.items():
            field = RECORD_EVENT_OF.get(mode, "record_event_ns")
            if field not in values or mode == RECORD_EVENT_MODE[field]:
                values[field] = float(ns)
        return replace(self, **values)

    def lock_work_factor(self, vms: int, mode: str = "fv") -> float:
        """How much longer the work under the interpreter lock takes with `vms` VMs of
        `mode` as threads (lock_work_vms and the scale LOCK_WORK_SCALE_OF names for the
        mode where measured, else lock_work_scale; 1 where nothing is measured)."""
        grown = self._at_count(vms, self._of_mode(LOCK_WORK_SCALE_OF, "lock_work_scale", mode))
        return 1.0 if grown is None else grown

    def guest_work_factor(self, vms: int, mode: str = "fv") -> float:
        """How much longer the guests' stretches between exits take with `vms` VMs of
        `mode` as threads (lock_work_vms and the scale GUEST_WORK_SCALE_OF names for the
        mode where measured, else guest_work_scale; 1 where nothing is measured)."""
        grown = self._at_count(vms, self._of_mode(GUEST_WORK_SCALE_OF, "guest_work_scale",
                                                  mode))
        return 1.0 if grown is None else grown

    def guest_preempts_per_ns(self, vms: int, mode: str = "fv") -> float:
        """How often a guest's thread loses its core, per ns of its stretch, with `vms`
        VMs of `mode` as threads (guest_preempts_per_ms, the mode's own where measured;
        0 where nothing is)."""
        per_ms = self._at_count(vms, self._of_mode(GUEST_PREEMPTS_OF, "guest_preempts_per_ms",
                                                   mode))
        return 0.0 if per_ms is None else max(0.0, per_ms) / 1e6

    def held_preempts_per_ns(self, vms: int, mode: str = "fv") -> float:
        """The same for a thread holding the lock, per ns of its work under it."""
        per_ms = self._at_count(vms, self._of_mode(HELD_PREEMPTS_OF, "held_preempts_per_ms",
                                                   mode))
        return 0.0 if per_ms is None else max(0.0, per_ms) / 1e6

    def _of_mode(self, own_of: Mapping[str, str], plain: str, mode: str
                 ) -> tuple[float, ...]:
        """The field `own_of` names for `mode` where it was measured, else `plain`."""
        return getattr(self, own_of.get(mode, plain)) or getattr(self, plain)

    def _at_count(self, vms: int, ys: tuple[float, ...]) -> float | None:
        """`ys` at `vms` VMs on lock_work_vms' counts: linear in log2 of the count
        between them, flat beyond them; None below the first or without values."""
        xs = tuple(math.log2(v) for v in self.lock_work_vms)
        x = math.log2(max(1, vms))
        if not xs or not ys or x < xs[0]:
            return None
        return ys[0] + _beyond_first(xs, ys, x)

    @staticmethod
    def pv_zero_words(counters: dict[str, int]) -> int:
        """Words the hypervisor zeroes for PV: a directory per SET_PGD, a small table per
        table it allocates (shadow.pv_space zeroes both whole)."""
        return (counters.get("hcall.set_pgd", 0) * regs.PDE_COUNT
                + counters.get("pv.pts_allocated", 0) * regs.SMALL_PTES_PER_PT)

    def mediator_ns(self, counters: dict[str, int], mediated: bool) -> float:
        """The part of modelled_ns the mediator spends under its one lock: shadow syncs
        and the entries they scan (GPUvm: "page shadowing locks GPU resources") and its
        share of every trap.  PV work (validating hypercall entries, allocating and
        zeroing tables) is per VM and runs on the VM's own hypercall path."""
        if not mediated:
            return 0.0
        return (mmio_exits(counters) * self.trap_mediator_ns
                + counters.get("shadow.ptes_scanned", 0) * self.pte_scanned_ns
                + (counters.get("shadow.syncs", 0) + counters.get("shadow.bar_syncs", 0))
                * self.shadow_sync_ns)

    def modelled_ns(self, counters: dict[str, int], mediated: bool) -> float:
        """Engine time plus every counted event at its price.

        In native mode an MMIO exit stands for a bare-metal access (an uncached register
        read/write on BAR0, a posted store through BAR1/BAR3); in a mediated mode it is a
        trap (remapped accesses never exit, so cost nothing here)."""
        bar0 = sum(v for k, v in counters.items() if k.startswith("exits.mmio.bar0."))
        aperture = mmio_exits(counters) - bar0
        mmio = (bar0 + aperture) * self.trap_ns if mediated else \
            bar0 * self.mmio_native_ns + aperture * self.aperture_native_ns
        return (counters.get("engine.busy_ns", 0) + mmio
                + counters.get("pv.pts_allocated", 0) * self.pt_alloc_ns
                + self.pv_zero_words(counters) * self.pt_zero_word_ns
                + counters.get("copy.bounce_bytes", 0) * self.bounce_byte_ns
                + counters.get("exits.io", 0) * self.io_exit_ns
                + counters.get("port.wait", 0) * self.wait_ns
                + counters.get("hcall.calls", 0) * self.hypercall_ns
                + counters.get("hcall.entries", 0) * self.hcall_entry_ns
                + counters.get("shadow.ptes_scanned", 0) * self.pte_scanned_ns
                + (counters.get("shadow.syncs", 0) + counters.get("shadow.bar_syncs", 0))
                * self.shadow_sync_ns
                + (counters.get("remap.maps", 0) + counters.get("remap.unmaps", 0)) * self.remap_ns)


def load_costs(name_or_path: str) -> CostProfile:
    path = Path(name_or_path)
    if not path.suffix:
        path = COSTS_DIR / f"{name_or_path}.toml"
    try:
        table = tomllib.loads(path.read_text())["costs"]
    except FileNotFoundError:
        raise ValueError(f"cost profile {name_or_path!r} not found ({path})") from None
    except (tomllib.TOMLDecodeError, KeyError) as exc:
        raise ValueError(f"cost profile {path}: needs a [costs] table ({exc})") from None
    names = {f.name for f in fields(CostProfile)} - {"name"}
    required = {f.name for f in fields(CostProfile) if f.default is MISSING} - {"name"}
    table = {k: v for k, v in table.items() if k not in RETIRED_KEYS}
    if not required <= set(table) <= names:
        missing, extra = sorted(required - set(table)), sorted(set(table) - names)
        raise ValueError(f"cost profile {path}: "
                         + (f"missing {missing[0]!r}" if missing else f"unknown {extra[0]!r}"))
    try:
        return CostProfile(path.stem, **{k: tuple(float(x) for x in v) if isinstance(v, list)
                                         else float(v) for k, v in table.items()})
    except (TypeError, ValueError) as exc:
        raise ValueError(f"cost profile {path}: {exc}") from None


# ------------------------------------------------------------------ host memory (issue 16)
@dataclass(frozen=True)
class HostMemCosts:
    """Prices of the host-memory events a guest reports (gpuvm/vmm/hostmem.py counters).

    Every value but the split cost is a median measured by `gpuvm calibrate --gpu`
    (experiments/costs/gpu-*.toml): copy bandwidths at the largest size measured, and
    cudaHostRegister/Unregister per chunk of a memfd in 4 KiB pages or on shmem THP.
    `thp_split_us` (per 2 MiB huge page a pin cuts) is 0 unless a profile says otherwise:
    on the H100 measured, pinning never split a huge page (smaps showed the memfd still
    huge-page mapped after pinning) and pageable D2H was not slower on THP memory.  The
    only non-zero value comes from the field report (experiments/costs/hostmem-field-split.toml
    says how it is derived) -- not from our measurement."""

    name: str
    h2d_pinned_gib_s: float
    d2h_pinned_gib_s: float
    h2d_pageable_gib_s: float
    d2h_pageable_gib_s: float
    chunk_bytes: int
    pin_chunk_4k_us: float
    unpin_chunk_4k_us: float
    pin_chunk_thp_us: float
    unpin_chunk_thp_us: float
    thp_split_us: float = 0.0

    def breakdown_ns(self, counters: dict[str, int]) -> dict[str, float]:
        """Modelled ns per kind of event: DMA of pinned and chunk-pinned bytes at the
        pinned bandwidth, staged (bounce-buffer) bytes at the pageable bandwidth, pins and
        unpins per chunk-sized piece by backing, and huge-page splits."""
        def c(key: str) -> int:
            return counters.get(f"hostmem.{key}", 0)

        def at(nbytes: int, gib_s: float) -> float:
            return nbytes / (gib_s * (1 << 30)) * 1e9

        per_byte = 1e3 / self.chunk_bytes  # us per chunk -> ns per byte
        return {
            "pinned_dma": at(c("xfer.htod.pinned.bytes") + c("xfer.htod.chunks.bytes"),
                             self.h2d_pinned_gib_s)
            + at(c("xfer.dtoh.pinned.bytes") + c("xfer.dtoh.chunks.bytes"), self.d2h_pinned_gib_s),
            "staged": at(c("xfer.htod.staged.bytes"), self.h2d_pageable_gib_s)
            + at(c("xfer.dtoh.staged.bytes"), self.d2h_pageable_gib_s),
            "pin": (c("pin_bytes_4k") * self.pin_chunk_4k_us
                    + c("pin_bytes_thp") * self.pin_chunk_thp_us) * per_byte,
            "unpin": (c("unpin_bytes_4k") * self.unpin_chunk_4k_us
                      + c("unpin_bytes_thp") * self.unpin_chunk_thp_us) * per_byte,
            "split": c("huge_splits") * self.thp_split_us * 1e3,
        }

    def modelled_ns(self, counters: dict[str, int]) -> float:
        return sum(self.breakdown_ns(counters).values())


def hostmem_costs_from_gpu_profile(name: str, costs: dict[str, float], chunk_bytes: int,
                                   thp_split_us: float = 0.0) -> HostMemCosts:
    """The prices from a measured profile's [costs] table (gpuvm/calibrate/profile.py)."""
    try:
        return HostMemCosts(
            name, costs["h2d_pinned_gib_s"], costs["d2h_pinned_gib_s"],
            costs["h2d_pageable_gib_s"], costs["d2h_pageable_gib_s"], chunk_bytes,
            costs["pin_chunk_memfd_4k_us"], costs["unpin_chunk_memfd_4k_us"],
            costs["pin_chunk_memfd_thp_us"], costs["unpin_chunk_memfd_thp_us"], thp_split_us)
    except KeyError as exc:
        raise ValueError(f"host-memory profile {name!r}: the measured profile has no "
                         f"{exc.args[0]!r}") from None


def load_hostmem_costs(name_or_path: str) -> HostMemCosts:
    """A measured GPU profile (gpu-*.toml: [costs] + [device]) or a file with a [hostmem]
    table naming its `base` measured profile and the values it overrides."""
    path = Path(name_or_path)
    if not path.suffix:
        path = COSTS_DIR / f"{name_or_path}.toml"
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"host-memory profile {name_or_path!r} not found ({path})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"host-memory profile {path}: not valid TOML ({exc})") from None
    if "hostmem" in data:
        table = dict(data["hostmem"])
        base = table.pop("base", None)
        if not isinstance(base, str):
            raise ValueError(f"host-memory profile {path}: [hostmem] needs base = "
                             "\"<measured profile>\"")
        costs = load_hostmem_costs(base)
        names = {f.name for f in fields(HostMemCosts)} - {"name"}
        extra = sorted(set(table) - names)
        if extra:
            raise ValueError(f"host-memory profile {path}: unknown {extra[0]!r}")
        values = {f.name: getattr(costs, f.name) for f in fields(HostMemCosts)}
        values.update({k: type(values[k])(v) for k, v in table.items()})
        values["name"] = path.stem
        return HostMemCosts(**values)
    if "costs" not in data or "device" not in data:
        raise ValueError(f"host-memory profile {path}: needs [costs] and [device] (a "
                         "measured profile) or a [hostmem] table")
    return hostmem_costs_from_gpu_profile(path.stem, data["costs"],
                                          int(data["device"]["chunk_bytes"]))
