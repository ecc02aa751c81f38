"""The driver both worlds share: per-VM submission queues, one engine, a policy, metrics.

The mediator and the simpy model differ only in how time passes and how work reaches
the engine, so both are injected:
- `start(vm, item)` puts a submission on the engine (mediator: the real GP_PUT write;
  simpy: a process that holds the engine for the kernel's duration).  It must not block
  until the work finishes; the owner calls `complete(now)` when it does.  A synchronous
  engine may call `complete` from inside `start`.
- `request_wakeup(t)` asks the owner to call `wake(now)` at (or after) time t; BAND uses
  it to hold the engine briefly.  Without it, the owner polls `wake_at`.

No threads, locks or simpy here: the mediator serialises calls under its own lock and
passes the device clock; the model passes `env.now`.  Times are integer ns.  A call
whose `now` is earlier than one already seen (two threads that read the clock in one
order and take the lock in the other) is treated as happening at the latest time seen;
the policies themselves reject time going backwards.
"""

from __future__ import annotations

import operator
from collections import deque
from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from scheduler.decision import Dispatch, VmId, Wait
from scheduler.metrics import VmMetrics
from scheduler.policy import Policy

T = TypeVar("T")


@dataclass(frozen=True)
class Running(Generic[T]):
    """The submission on the engine."""

    vm: VmId
    item: T
    queued_at: int
    started_at: int


class Dispatcher(Generic[T]):
    """Queues submissions per VM (FIFO within a VM) and runs one at a time, in the
    order the policy picks, charging each VM the engine time it used."""

    def __init__(self, policy: Policy, start: Callable[[VmId, T], None],
                 request_wakeup: Callable[[int], None] | None = None) -> None:
        self.policy = policy
        self._start = start
        self._request_wakeup = request_wakeup
        self._queues: dict[VmId, deque[tuple[T, int]]] = {}
        self.metrics: dict[VmId, VmMetrics] = {}
        self._running: Running[T] | None = None
        self._wake_at: int | None = None
        self._latest = 0  # latest time seen; every call acts at this time
        self._advancing = False

    # ----------------------------------------------------------------- membership
    def add_vm(self, vm: VmId, share: float = 1.0, now: int = 0) -> None:
        now = self._seen(now)
        self.policy.add_vm(vm, share, now)
        self._queues[vm] = deque()
        self.metrics[vm] = VmMetrics(added_at=now)

    def remove_vm(self, vm: VmId, now: int) -> list[T]:
        """Forget the VM; returns its queued (never started) submissions.  If it is on
        the engine, that submission still completes normally."""
        now = self._seen(now)
        self.policy.remove_vm(vm, now)
        dropped = [item for item, _ in self._queues.pop(vm)]
        self.metrics[vm].removed_at = now
        self._advance()
        return dropped

    # ------------------------------------------------------------------- protocol
    def submit(self, vm: VmId, item: T, now: int) -> None:
        """A doorbell: queue `item` for `vm` and run something if the engine is free."""
        if vm not in self._queues:
            raise ValueError(f"vm {vm!r}: not added to the dispatcher")
        now = self._seen(now)
        self.policy.ready(vm, now)
        self._queues[vm].append((item, now))
        self.metrics[vm].submitted += 1
        self._advance()

    def complete(self, now: int, used: int | None = None) -> Running[T]:
        """The running submission finished at `now`.  `used` is the engine time to
        charge (default: now - started_at).  Returns what finished."""
        done = self._running
        if done is None:
            raise RuntimeError("complete: nothing is running")
        now = self._seen(now)
        if used is None:
            used = now - done.started_at
        self.policy.charge(done.vm, used, now)
        self._running = None
        # the busy interval never reaches back before the start (intervals stay disjoint);
        # a VM removed while it ran has no record left to add it to
        metrics = self.metrics.get(done.vm)
        if metrics is not None:
            metrics.record_completion(max(now - used, done.started_at), now)
        self._advance()
        return done

    def wake(self, now: int) -> None:
        """Time has reached a requested wake-up (early or stale calls are harmless)."""
        now = self._seen(now)
        self.policy.replenish(now)
        self._advance()

    # ------------------------------------------------------------------ inspection
    @property
    def running(self) -> Running[T] | None:
        return self._running

    @property
    def wake_at(self) -> int | None:
        """When the policy wants to be asked again while holding the engine idle."""
        return self._wake_at

    def queued(self, vm: VmId) -> int:
        return len(self._queues[vm])

    # ------------------------------------------------------------------- internals
    def _seen(self, now: int) -> int:
        try:
            now = operator.index(now)
        except TypeError:
            raise ValueError(f"now: must be integer ns, got {now!r}") from None
        self._latest = max(self._latest, now)
        return self._latest

    def _advance(self) -> None:
        if self._advancing:  # re-entered from start(): the outer loop carries on
            return
        self._advancing = True
        try:
            while self._running is None:
                now = self._latest
                decision = self.policy.pick(now)
                if isinstance(decision, Dispatch):
                    item, queued_at = self._queues[decision.vm].popleft()
                    self.metrics[decision.vm].record_dispatch(queued_at, now)
                    self._running = Running(decision.vm, item, queued_at, now)
                    self._wake_at = None
                    self._start(decision.vm, item)
                elif isinstance(decision, Wait):
                    if decision.until != self._wake_at:
                        self._wake_at = decision.until
                        if self._request_wakeup is not None:
                            self._request_wakeup(decision.until)
                    break
                else:
                    self._wake_at = None
                    break
        finally:
            self._advancing = False
