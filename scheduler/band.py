"""BAND (Gdev, ATC'12): CREDIT made to hold shares for bursty, non-preemptive work.

Two changes to CREDIT:
1. Demote a VM only if its credit is < 0 *and* its measured utilisation (GPU time /
   elapsed over a sliding window) exceeds its share.  Credit alone reacts to one long
   kernel; utilisation says whether the VM has really had more than its share.
   (Gdev's code tests credit ≤ 0; the paper's description and GPUvm's a3 use < 0.)
2. Before switching from the VM that just finished to a VM that is over its share, hold
   the engine for a short wait (500 µs).  A VM issuing short kernels with small gaps
   resubmits within that time and keeps its turn instead of handing the engine to a
   long-kernel VM for tens of ms.  One chance per completion (Gdev's
   GDEV_VSCHED_BAND_SELECT_CHANCES = 1); there is no wait if the finished VM is itself
   over its share (GPUvm's a3 adds that test: waiting for it would only be undone by
   its own demotion).  Work from a VM that is *not* over its share is never held back.

Left out from Gdev: the matching wait on the submission path (a VM over its share that
finds the engine free yields 500 µs first); the switch-time wait covers the case the
isolation experiment depends on.
"""

from __future__ import annotations

from scheduler.credit import CreditPolicy
from scheduler.decision import IDLE, Decision, Dispatch, VmId, Wait
from scheduler.meter import SlidingWindowMeter
from scheduler.params import SchedulerParams
from scheduler.policy import NO_VM


class BandPolicy(CreditPolicy):
    """BAND (Gdev): CREDIT that demotes a VM only when it is also over its share of measured
    use, and holds the engine briefly before a switch, so bursty non-preemptive work keeps
    its shares."""

    name = "band"

    def __init__(self, params: SchedulerParams | None = None) -> None:
        super().__init__(params)
        self._meters: dict[VmId, SlidingWindowMeter] = {}
        self._util: dict[VmId, float] = {}  # last sample, if util_sample_ns > 0
        self._next_sample: int | None = None
        self._last: object = NO_VM  # the VM whose completion is being followed up
        self._yield_until: int | None = None

    def utilisation(self, vm: VmId) -> float:
        """The measured utilisation the policy is acting on (0..1): exact at the latest
        time seen, or the last sample if util_sample_ns > 0."""
        self._require(vm)
        if self.params.util_sample_ns == 0:
            return self._meters[vm].utilisation(self._now or 0)
        return self._util[vm]

    def over_share(self, vm: VmId) -> bool:
        return self.utilisation(vm) > self.share(vm)

    # ------------------------------------------------------------------- hooks
    def _on_add(self, vm: VmId, now: int) -> None:
        super()._on_add(vm, now)
        self._meters[vm] = SlidingWindowMeter(self.params.util_window_ns, since=now)
        self._util[vm] = 0.0
        if self._next_sample is None and self.params.util_sample_ns:
            self._next_sample = now + self.params.util_sample_ns

    def _on_remove(self, vm: VmId) -> None:
        super()._on_remove(vm)
        del self._meters[vm], self._util[vm]

    def _on_time(self, now: int) -> None:
        super()._on_time(now)
        if self._next_sample is None or now < self._next_sample:
            return
        for vm, meter in self._meters.items():
            self._util[vm] = meter.utilisation(now)
        step = self.params.util_sample_ns
        self._next_sample += ((now - self._next_sample) // step + 1) * step

    def _account(self, vm: VmId, used: int, now: int) -> None:
        super()._account(vm, used, now)
        self._meters[vm].add(now - used, now)

    def _should_demote(self, vm: VmId, now: int) -> bool:
        return self._settle(vm) < 0 and self.over_share(vm)

    def _after_charge(self, vm: VmId, now: int) -> None:
        self._last = vm
        self._yield_until = None  # a fresh chance for every completion

    def _choose(self, now: int) -> Decision:
        last = self._last
        waiting = self._yield_until is not None and now < self._yield_until
        if waiting and self._pending.get(last, 0) > 0:
            self.counters[last].kept_turns += 1
            return Dispatch(last)
        nxt = self._first_ready()
        if nxt is NO_VM:
            return IDLE
        if nxt == last or not self.over_share(nxt):
            return Dispatch(nxt)
        if last in self._weights and not self.over_share(last) and self.params.band_wait_ns:
            if self._yield_until is None:
                self._yield_until = now + self.params.band_wait_ns
                self.counters[last].yield_waits += 1
            if now < self._yield_until:
                return Wait(self._yield_until)
        return Dispatch(nxt)
