"""Lazy replenishment gives exactly the credits of replenishing every VM every period.

The reference below is CREDIT's replenishment as it was before it was made lazy: every
period's end walks every VM.  Random sequences of adds, removals, share changes, picks
and charges must leave both with the same credits, run queues and decisions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.band import BandPolicy
from scheduler.credit import CreditPolicy, replenished
from scheduler.decision import Dispatch
from scheduler.params import SchedulerParams

PARAMS = SchedulerParams.from_dict({"period_ms": 1})


class EagerCredit(CreditPolicy):
    """Every VM's credit brought up to date at every period's end (O(VMs) per period)."""

    def _on_time(self, now: int) -> None:
        before = self._ticks
        super()._on_time(now)
        if self._ticks != before:
            for vm in self._order:
                self._credit[vm] = replenished(self._credit[vm], self._earning(vm),
                                               self._ticks - self._settled[vm],
                                               self.params.credit_bound)
                self._settled[vm] = self._ticks


class EagerBand(BandPolicy, EagerCredit):
    pass


ops = st.lists(st.tuples(st.sampled_from(["add", "remove", "share", "ready", "run"]),
                         st.integers(0, 5), st.integers(1, 4), st.integers(0, 3_000_000)),
               max_size=60)


def drive(policy, steps) -> list:
    now, seen = 0, []
    for op, vm, weight, dt in steps:
        now += dt
        name = f"vm{vm}"
        if op == "add" and name not in policy.vms:
            policy.add_vm(name, float(weight), now)
        elif op == "remove" and name in policy.vms and policy.running != name:
            policy.remove_vm(name, now)
        elif op == "share" and name in policy.vms:
            policy.set_share(name, float(weight), now)
        elif op == "ready" and name in policy.vms:
            policy.ready(name, now, weight)
        elif op == "run" and not policy.busy:
            decision = policy.pick(now)
            seen.append(decision)
            if isinstance(decision, Dispatch):
                policy.charge(decision.vm, dt // 2, now + dt // 2)
                now += dt // 2
        seen.append((policy.vms, {v: policy.credit(v) for v in policy.vms}))
    return seen


@settings(max_examples=150, deadline=None)
@given(ops)
def test_lazy_credit_equals_eager(steps):
    assert drive(CreditPolicy(PARAMS), steps) == drive(EagerCredit(PARAMS), steps)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_lazy_band_equals_eager(steps):
    assert drive(BandPolicy(PARAMS), steps) == drive(EagerBand(PARAMS), steps)


def test_a_period_no_longer_walks_every_vm():
    policy = CreditPolicy(PARAMS)
    for i in range(1000):
        policy.add_vm(f"vm{i}", 1.0, 0)
    policy.replenish(50 * PARAMS.period_ns)
    assert policy._settled["vm0"] == 0  # nothing settled until looked at
    earn = round(PARAMS.period_ns / 1000)
    first = min(PARAMS.credit_bound, PARAMS.period_ns)  # vm0 was added alone
    assert policy.credit("vm0") == replenished(first, earn, 50, PARAMS.credit_bound)
    assert policy._settled["vm0"] == 50
