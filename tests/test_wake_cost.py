"""gpuvm.calibrate.wake_cost: what waking a sleeping thread costs the waker."""
import pytest

from gpuvm.calibrate import wake_cost
from gpuvm.calibrate.wake_cost import WakeCost


def test_a_release_that_wakes_a_sleeper_costs_more_than_one_nobody_waits_for():
    cost = wake_cost.measure(samples=200, settle_us=50)
    assert cost.samples == 200 and cost.settle_us == 50
    # a futex wake (a syscall, and where the sleeper's core halted, an interrupt to it)
    # against an uncontended release in user space
    assert cost.waking_ns > cost.plain_ns > 0
    assert cost.waking_p10_ns <= cost.waking_ns <= cost.waking_p90_ns
    assert cost.signal_ns == pytest.approx(cost.waking_ns - cost.plain_ns)


def test_the_sleeper_is_let_go_and_nothing_is_left_behind():
    import threading
    before = threading.active_count()
    wake_cost.measure(samples=5, settle_us=0)
    assert threading.active_count() == before


def test_the_signal_is_never_negative():
    assert WakeCost(100.0, 90.0, 120.0, 150.0, 10, 100.0).signal_ns == 0.0


def test_a_bundle_keeps_it_and_one_from_before_has_none():
    cost = WakeCost(5400.0, 5300.0, 6000.0, 80.0, 2000, 100.0)
    about = {wake_cost.ABOUT_KEY: cost.to_about()}
    assert WakeCost.from_about(about) == cost
    assert WakeCost.from_about({}) is None
    assert "5.32 us" in cost.text() and "2000 each" in cost.text()


def test_a_malformed_bundle_entry_names_its_key():
    with pytest.raises(ValueError, match="wake_cost"):
        WakeCost.from_about({wake_cost.ABOUT_KEY: {"waking_ns": 1.0}})


@pytest.mark.parametrize("samples, settle", [(0, 10.0), (5, -1.0)])
def test_bad_arguments_are_refused(samples, settle):
    with pytest.raises(ValueError, match="measure needs"):
        wake_cost.measure(samples=samples, settle_us=settle)
