"""Each policy's decisions on a hand-driven clock (no simpy, no Dispatcher)."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler import (IDLE, BandPolicy, CreditPolicy, Dispatch, FifoPolicy,
                       SchedulerParams, SlidingWindowMeter, Wait)
from scheduler.credit import replenished

MS = 1_000_000
US = 1_000


def run_one(policy, vm, now, used):
    """Dispatch `vm` (it must be the policy's choice) and charge it `used` ns later."""
    assert policy.pick(now) == Dispatch(vm)
    policy.charge(vm, used, now + used)
    return now + used


# ---------------------------------------------------------------------------- FIFO
def test_fifo_rotates_finished_vm_to_the_tail():
    fifo = FifoPolicy()
    for vm in "ABC":
        fifo.add_vm(vm, 1, 0)
        fifo.ready(vm, 0, count=3)
    order = []
    now = 0
    for _ in range(6):
        decision = fifo.pick(now)
        order.append(decision.vm)
        now += 30 * MS if decision.vm == "A" else MS  # lengths don't matter to FIFO
        fifo.charge(decision.vm, 30 * MS if decision.vm == "A" else MS, now)
    assert order == list("ABCABC")
    assert fifo.counters["A"].demotions == 2


def test_fifo_idle_and_protocol_errors():
    fifo = FifoPolicy()
    fifo.add_vm("A", 1, 0)
    assert fifo.pick(0) is IDLE
    fifo.ready("A", 0)
    assert fifo.pick(0) == Dispatch("A")
    with pytest.raises(RuntimeError, match="still running"):
        fifo.pick(1)
    with pytest.raises(ValueError, match="charged but not running"):
        fifo.charge("B", 1, 1)
    with pytest.raises(ValueError, match="used"):
        fifo.charge("A", -1, 1)
    fifo.charge("A", 1, 1)
    with pytest.raises(ValueError, match="backwards"):
        fifo.ready("A", 0)


# -------------------------------------------------------------------------- CREDIT
def test_credit_starts_with_one_period_and_demotes_at_zero():
    # a long period keeps replenishment out of the way; start credit = one period's
    # earning (Gdev replenishes on creation), within the ±100 ms bound
    credit = CreditPolicy(SchedulerParams(period_ns=1000 * MS, credit_bound_ns=100 * MS))
    credit.add_vm("A", 1, 0)
    assert credit.credit("A") == 100 * MS
    credit.add_vm("B", 1, 0)
    credit.ready("A", 0, count=2)
    credit.ready("B", 0)
    now = run_one(credit, "A", 0, 40 * MS)       # credit 60 ms: keeps the head
    assert credit.vms == ("A", "B") and credit.credit("A") == 60 * MS
    now = run_one(credit, "A", now, 60 * MS)     # credit exactly 0: demoted (≤ 0)
    assert credit.credit("A") == 0
    assert credit.vms == ("B", "A") and credit.counters["A"].demotions == 1
    assert credit.pick(now) == Dispatch("B")


def test_credit_replenishes_lazily_by_share_and_clamps():
    credit = CreditPolicy(SchedulerParams(period_ns=30 * MS))
    credit.add_vm("A", 2, 0)
    credit.add_vm("B", 1, 0)
    credit.ready("A", 0)
    credit.pick(0)
    credit.charge("A", 100 * MS, 100 * MS)   # three ticks (30, 60, 90 ms) came first
    # A: 30 (at add) + 3 * 20 = 90 -> clamped to 30 at the first tick; then -100 ms
    assert credit.credit("A") == 30 * MS - 100 * MS
    credit.replenish(120 * MS)                # one tick: -70 + 20 -> clamp to -30
    assert credit.credit("A") == -30 * MS
    assert credit.credit("B") == 30 * MS      # idle VM saturates at +bound
    credit.replenish(150 * MS)
    assert credit.credit("A") == -10 * MS


@given(credit=st.integers(-10**9, 10**9), earn=st.integers(0, 10**8),
       ticks=st.integers(0, 50), bound=st.integers(1, 10**8))
def test_closed_form_replenish_equals_tick_by_tick(credit, earn, ticks, bound):
    stepwise = credit
    for _ in range(ticks):
        stepwise = max(-bound, min(bound, stepwise + earn))
    assert replenished(credit, earn, ticks, bound) == stepwise


def test_weights_are_normalised():
    credit = CreditPolicy()
    credit.add_vm("A", 2, 0)
    credit.add_vm("B", 1, 0)
    assert credit.share("A") == pytest.approx(2 / 3)
    credit.set_share("B", 2, 0)
    assert credit.share("B") == pytest.approx(0.5)
    credit.remove_vm("A", 0)
    assert credit.share("B") == 1.0 and credit.vms == ("B",)


# ---------------------------------------------------------------------------- BAND
def band(**kw):
    params = dict(period_ns=30 * MS, band_wait_ns=500 * US, util_window_ns=1000 * MS)
    params.update(kw)
    return BandPolicy(SchedulerParams(**params))


def test_band_does_not_demote_a_vm_in_debt_but_under_its_share():
    policy = band()
    policy.add_vm("A", 1, 0)
    policy.add_vm("B", 1, 0)
    policy.ready("A", 0)
    policy.ready("B", 0)
    # A idles for 900 ms, then runs one 40 ms kernel: credit < 0 after it, but A's
    # utilisation is 40/940 < 50%, so A keeps its place (CREDIT would demote it)
    policy.replenish(900 * MS)
    assert policy.pick(900 * MS) == Dispatch("A")
    policy.charge("A", 40 * MS, 940 * MS)
    assert policy.credit("A") < 0 and policy.utilisation("A") < 0.5
    assert policy.vms == ("A", "B") and policy.counters["A"].demotions == 0


def test_band_demotes_when_in_debt_and_over_share():
    policy = band()
    policy.add_vm("A", 1, 0)
    policy.add_vm("B", 1, 0)
    policy.ready("A", 0)
    policy.ready("B", 0)
    run_one(policy, "A", 0, 40 * MS)  # 100% of its life on the GPU, credit -25 ms
    assert policy.vms == ("B", "A") and policy.counters["A"].demotions == 1


def bursty_setup():
    """A (short kernels) just finished; B (over its share) is queued."""
    policy = band()
    policy.add_vm("A", 1, 0)
    policy.add_vm("B", 1, 0)
    policy.ready("B", 0)
    now = run_one(policy, "B", 0, 30 * MS)        # B: 100% util, demoted
    for _ in range(5):
        policy.ready("A", now)
        now = run_one(policy, "A", now, MS)       # A: well under its share
    policy.ready("B", now)
    return policy, now


def test_band_waits_for_the_bursty_vm_and_it_keeps_its_turn():
    policy, now = bursty_setup()
    assert policy.over_share("B") and not policy.over_share("A")
    assert policy.pick(now) == Wait(now + 500 * US)
    assert policy.pick(now + 100 * US) == Wait(now + 500 * US)  # asked early: same wait
    policy.ready("A", now + 200 * US)                          # A resubmits in time
    assert policy.pick(now + 200 * US) == Dispatch("A")
    assert (policy.counters["A"].yield_waits, policy.counters["A"].kept_turns) == (1, 1)


def test_band_switches_after_the_wait_runs_out():
    policy, now = bursty_setup()
    assert policy.pick(now) == Wait(now + 500 * US)
    assert policy.pick(now + 500 * US) == Dispatch("B")
    assert policy.counters["A"].kept_turns == 0


def test_band_no_wait_for_an_under_share_vm_or_with_wait_zero():
    policy, now = bursty_setup()
    policy.set_share("B", 1000, now)   # now B is far under its share: run it at once
    assert policy.pick(now) == Dispatch("B")
    policy, now = bursty_setup()
    policy.params = SchedulerParams(band_wait_ns=0)
    assert policy.pick(now) == Dispatch("B")


def test_band_no_wait_when_the_finished_vm_is_over_its_share_too():
    policy = band()
    policy.add_vm("A", 1, 0)
    policy.add_vm("B", 1, 0)
    policy.ready("A", 0)
    now = run_one(policy, "A", 0, 10 * MS)    # A: 100% so far
    policy.ready("B", now)
    policy.ready("B", now)
    now = run_one(policy, "B", now, 30 * MS)  # B: 30/40 = 75%, demoted
    policy.ready("B", now)
    # B just finished and is over its share; next is B anyway -> plain dispatch
    assert policy.pick(now) == Dispatch("B")


def test_band_sampled_utilisation_is_stale_until_the_next_sample():
    policy = band(util_sample_ns=30 * MS)
    policy.add_vm("A", 1, 0)
    policy.ready("A", 0)
    run_one(policy, "A", 0, 10 * MS)
    assert policy.utilisation("A") == 0.0        # not sampled yet
    policy.replenish(30 * MS)
    assert policy.utilisation("A") == pytest.approx(10 / 30)


def test_removed_vm_may_still_be_charged():
    policy = band()
    policy.add_vm("A", 1, 0)
    policy.add_vm("B", 1, 0)
    policy.ready("A", 0)
    policy.ready("B", 0)
    assert policy.pick(0) == Dispatch("A")
    policy.remove_vm("A", 1)
    policy.charge("A", 5, 5)
    assert policy.pick(5) == Dispatch("B")


# --------------------------------------------------------------------------- meter
def test_meter_is_exact_over_a_sliding_window():
    meter = SlidingWindowMeter(window=100, since=0)
    meter.add(0, 30)
    assert meter.utilisation(50) == pytest.approx(30 / 50)  # younger than the window
    meter.add(50, 60)
    assert meter.utilisation(100) == pytest.approx(40 / 100)
    assert meter.busy(120) == 10 + 10                      # [20, 30) + [50, 60)
    assert meter.utilisation(160) == 0.0
