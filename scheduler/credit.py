"""CREDIT: per-VM GPU-time budgets; a VM that has used up its credit goes to the tail.

Every period each VM earns period·share of credit and pays for the engine time it used;
credit is clamped to ±bound (default: one period) so neither savings nor debt reach back
further than a period.  A VM whose credit is ≤ 0 after a completion is demoted.

Why it fails with bursty VMs (Gdev: CREDIT "does not really work"): the run queue is
only consulted when the engine is free, and a VM with short kernels and small gaps
between them usually has *nothing queued* at that instant, so the other VM's long
kernel runs no matter what the credits say.
"""

from __future__ import annotations

from scheduler.decision import VmId
from scheduler.params import SchedulerParams
from scheduler.policy import Policy


def replenished(credit: int, earn: int, ticks: int, bound: int) -> int:
    """Credit after `ticks` replenishments of `earn`, each followed by the ±bound clamp.

    Closed form of the per-tick loop, so a long idle gap costs O(1): earn ≥ 0, so after
    the first tick the credit only rises, and the clamp can only bite at the first tick
    (from below) or at the top."""
    if ticks <= 0:
        return credit
    first = max(-bound, min(bound, credit + earn))
    return min(bound, first + (ticks - 1) * earn)


class CreditPolicy(Policy):
    """Replenishment is lazy: a period's end only counts a tick, and a VM's credit catches
    up on the ticks it missed when it is next looked at (`_settle`, the closed form
    above), so a period costs O(1) instead of O(VMs).  Ticks apply with the shares they
    were earned under: every VM is settled before any weight changes."""

    name = "credit"

    def __init__(self, params: SchedulerParams | None = None) -> None:
        super().__init__(params)
        self._credit: dict[VmId, int] = {}
        self._settled: dict[VmId, int] = {}  # ticks already applied to each VM's credit
        self._ticks = 0  # replenishment ticks so far
        self._next_replenish: int | None = None

    def credit(self, vm: VmId) -> int:
        """The VM's credit in ns (negative: it has used more than it earned)."""
        self._require(vm)
        return self._settle(vm)

    def _settle(self, vm: VmId) -> int:
        behind = self._ticks - self._settled[vm]
        if behind:
            self._credit[vm] = replenished(self._credit[vm], self._earning(vm), behind,
                                           self.params.credit_bound)
            self._settled[vm] = self._ticks
        return self._credit[vm]

    def _settle_all(self, now: int) -> None:
        self._tick(now)
        for vm in self._order:
            self._settle(vm)

    def add_vm(self, vm: VmId, share: float = 1.0, now: int = 0) -> None:
        self._settle_all(now)
        super().add_vm(vm, share, now)

    def remove_vm(self, vm: VmId, now: int) -> None:
        self._settle_all(now)
        super().remove_vm(vm, now)

    def set_share(self, vm: VmId, share: float, now: int) -> None:
        self._settle_all(now)
        super().set_share(vm, share, now)

    def _earning(self, vm: VmId) -> int:
        return round(self.params.period_ns * self.share(vm))

    def _on_add(self, vm: VmId, now: int) -> None:
        # Gdev replenishes once when a virtual device is created, so a new VM starts
        # with one period's worth rather than waiting up to a period for any credit.
        self._credit[vm] = min(self.params.credit_bound, self._earning(vm))
        self._settled[vm] = self._ticks
        if self._next_replenish is None:
            self._next_replenish = now + self.params.period_ns

    def _on_remove(self, vm: VmId) -> None:
        del self._credit[vm], self._settled[vm]

    def _on_time(self, now: int) -> None:
        if self._next_replenish is None or now < self._next_replenish:
            return
        period = self.params.period_ns
        ticks = (now - self._next_replenish) // period + 1
        self._ticks += ticks
        self._next_replenish += ticks * period

    def _account(self, vm: VmId, used: int, now: int) -> None:
        self._credit[vm] = self._settle(vm) - used

    def _should_demote(self, vm: VmId, now: int) -> bool:
        return self._settle(vm) <= 0
