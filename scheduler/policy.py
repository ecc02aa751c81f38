"""The interface every policy offers, and the run queue they all share.

A policy is a plain object driven by whoever owns the clock: the mediator's dispatcher
passes the device clock, the simpy model passes `env.now` (both integer ns).  It never
sleeps, spawns or locks; time only moves when a caller passes a larger `now`, and
periodic work (credit replenishment, utilisation sampling) is caught up lazily at that
point, which gives the same result as a timer firing on every tick because policy state
is only ever read at those calls.

Protocol (GPU work is non-preemptive, one submission in flight at a time):
    add_vm(vm, share, now)    register a VM with a weight (normalised over all VMs)
    ready(vm, now)            one more submission of vm is queued
    pick(now) -> Decision     engine is free: Dispatch(vm) | Wait(until) | IDLE
    charge(vm, used, now)     the dispatched submission finished after `used` ns
    remove_vm(vm, now)        forget the VM (its queued submissions are dropped)

All share the Gdev shape: VMs sit in a run-queue order; after a completion the policy
decides whether the finished VM goes to the tail ("demotion"), and the next VM is the
first in order that has queued work.  Policies differ only in that decision and in
what they may do before switching VMs.
"""

from __future__ import annotations

import operator
from abc import ABC
from dataclasses import dataclass
from typing import ClassVar

from scheduler.decision import IDLE, Decision, Dispatch, VmId
from scheduler.params import SchedulerParams

NO_VM = object()  # "no VM" for this package; a VmId may legitimately be None or 0


@dataclass
class PolicyCounters:
    """Exact per-VM event counts of the policy's own decisions."""

    demotions: int = 0   # moved to the tail of the run queue after a completion
    yield_waits: int = 0  # BAND held the engine for this VM to resubmit
    kept_turns: int = 0   # ...and it did, so it ran again instead of switching


class Policy(ABC):
    """Run queue, weights and pending counts; subclasses decide demotion and choice."""

    name: ClassVar[str]

    def __init__(self, params: SchedulerParams | None = None) -> None:
        self.params = params if params is not None else SchedulerParams()
        self._order: list[VmId] = []  # run-queue order, head first
        self._weights: dict[VmId, float] = {}
        # sum(self._weights.values()), recomputed (same order, so the same float) whenever
        # a weight changes: share() is asked for every VM at every replenishment, and
        # summing there made a period cost O(N^2) in the number of VMs
        self._weight_sum = 0.0
        self._pending: dict[VmId, int] = {}
        self._running: object = NO_VM
        self._now: int | None = None
        self.counters: dict[VmId, PolicyCounters] = {}

    # ----------------------------------------------------------------- membership
    def add_vm(self, vm: VmId, share: float = 1.0, now: int = 0) -> None:
        """Register `vm` at the tail of the run queue with weight `share` (> 0)."""
        now = self._tick(now)
        if vm in self._weights:
            raise ValueError(f"vm {vm!r}: already added")
        self._weights[vm] = _check_share(vm, share)
        self._weight_sum = sum(self._weights.values())
        self._order.append(vm)
        self._pending[vm] = 0
        self.counters[vm] = PolicyCounters()
        self._on_add(vm, now)

    def remove_vm(self, vm: VmId, now: int) -> None:
        """Forget `vm`; if it is running, its later charge() is accepted and ignored."""
        now = self._tick(now)
        self._require(vm)
        del self._weights[vm], self._pending[vm]
        self._weight_sum = sum(self._weights.values())
        self._order.remove(vm)
        self._on_remove(vm)

    def set_share(self, vm: VmId, share: float, now: int) -> None:
        """Change a VM's weight; takes effect at the next replenishment / decision."""
        now = self._tick(now)
        self._require(vm)
        self._weights[vm] = _check_share(vm, share)
        self._weight_sum = sum(self._weights.values())

    def share(self, vm: VmId) -> float:
        """The VM's weight normalised over all registered VMs (shares sum to 1)."""
        self._require(vm)
        return self._weights[vm] / self._weight_sum

    @property
    def vms(self) -> tuple[VmId, ...]:
        """Registered VMs in run-queue order, head first."""
        return tuple(self._order)

    def pending(self, vm: VmId) -> int:
        self._require(vm)
        return self._pending[vm]

    @property
    def running(self) -> VmId | None:
        """The VM dispatched and not yet charged (None if the engine is free)."""
        return None if self._running is NO_VM else self._running

    @property
    def busy(self) -> bool:
        return self._running is not NO_VM

    # ------------------------------------------------------------------- protocol
    def ready(self, vm: VmId, now: int, count: int = 1) -> None:
        """`count` more submissions of `vm` are queued."""
        now = self._tick(now)
        self._require(vm)
        if count < 1:
            raise ValueError(f"count: must be >= 1, got {count}")
        self._pending[vm] += count

    def pick(self, now: int) -> Decision:
        """The engine is free: say which VM runs next, or how long to hold off."""
        now = self._tick(now)
        if self.busy:
            raise RuntimeError(f"pick: vm {self._running!r} is still running; charge it first")
        decision = self._choose(now)
        if isinstance(decision, Dispatch):
            self._pending[decision.vm] -= 1
            self._running = decision.vm
        return decision

    def charge(self, vm: VmId, used: int, now: int) -> None:
        """The submission dispatched for `vm` finished at `now` after `used` ns of engine
        time; account for it and decide whether `vm` keeps its place in the run queue."""
        now = self._tick(now)
        if not self.busy or self._running != vm:
            raise ValueError(f"vm {vm!r}: charged but not running (running: {self.running!r})")
        if used < 0:
            raise ValueError(f"used: must be >= 0 ns, got {used}")
        self._running = NO_VM
        if vm not in self._weights:  # removed while its last submission ran
            return
        self._account(vm, used, now)
        if self._should_demote(vm, now):
            self._order.remove(vm)
            self._order.append(vm)
            self.counters[vm].demotions += 1
        self._after_charge(vm, now)

    def replenish(self, now: int) -> None:
        """Bring periodic state (credits, utilisation samples) up to `now`.  Optional:
        every other call does the same, so a driver need not run a timer."""
        now = self._tick(now)

    # -------------------------------------------------------- hooks for subclasses
    def _on_add(self, vm: VmId, now: int) -> None:
        pass

    def _on_remove(self, vm: VmId) -> None:
        pass

    def _on_time(self, now: int) -> None:
        """Called with every new `now`, before anything else happens at that time."""

    def _account(self, vm: VmId, used: int, now: int) -> None:
        pass

    def _should_demote(self, vm: VmId, now: int) -> bool:
        raise NotImplementedError

    def _after_charge(self, vm: VmId, now: int) -> None:
        pass

    def _choose(self, now: int) -> Decision:
        vm = self._first_ready()
        return IDLE if vm is NO_VM else Dispatch(vm)

    # -------------------------------------------------------------------- helpers
    def _first_ready(self) -> object:
        for vm in self._order:
            if self._pending[vm] > 0:
                return vm
        return NO_VM

    def _require(self, vm: VmId) -> None:
        if vm not in self._weights:
            raise ValueError(f"vm {vm!r}: not added to the scheduler")

    def _tick(self, now: int) -> int:
        if isinstance(now, bool):
            raise ValueError(f"now: must be integer ns, got {now!r}")
        try:
            now = operator.index(now)  # int, or numpy's integer types
        except TypeError:
            raise ValueError(f"now: must be integer ns, got {now!r}") from None
        if self._now is not None and now < self._now:
            raise ValueError(f"now: time went backwards ({now} < {self._now})")
        self._now = now
        self._on_time(now)
        return now


def _check_share(vm: VmId, share: float) -> float:
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not share > 0:
        raise ValueError(f"share: vm {vm!r} needs a share > 0, got {share!r}")
    if share == float("inf"):
        raise ValueError(f"share: vm {vm!r} needs a finite share")
    return float(share)
