"""The Dispatcher core: queues, metrics, wake-ups and a synchronous engine."""

import numpy as np
import pytest

from scheduler import Dispatcher, SchedulerParams, make_policy

MS = 1_000_000
US = 1_000


class Recorder:
    """An engine that only records what it was asked to start."""

    def __init__(self):
        self.started = []

    def __call__(self, vm, item):
        self.started.append((vm, item))


def test_submissions_of_one_vm_run_in_order_and_metrics_add_up():
    engine = Recorder()
    d = Dispatcher(make_policy("fifo"), engine)
    d.add_vm("A", 1, 0)
    d.add_vm("B", 1, 0)
    d.submit("A", "a1", 0)        # engine free: starts at once
    d.submit("A", "a2", 1 * MS)
    d.submit("B", "b1", 2 * MS)
    assert engine.started == [("A", "a1")] and d.queued("A") == 1
    assert d.complete(5 * MS).item == "a1"   # FIFO: A to the tail, B next
    assert engine.started[-1] == ("B", "b1")
    d.complete(8 * MS)
    assert engine.started[-1] == ("A", "a2")
    d.complete(9 * MS, used=500 * US)        # the device may report engine time itself
    a, b = d.metrics["A"], d.metrics["B"]
    assert (a.submitted, a.dispatches, a.completions) == (2, 2, 2)
    assert a.gpu_time_ns == 5 * MS + 500 * US and b.gpu_time_ns == 3 * MS
    assert a.queue_delay_max_ns == 7 * MS and a.mean_queue_delay_ns == 3.5 * MS
    assert b.queue_delay_sum_ns == 3 * MS
    assert a.busy == [(0, 5 * MS), (8 * MS + 500 * US, 9 * MS)]
    assert d.running is None


def test_complete_without_running_is_an_error():
    d = Dispatcher(make_policy("band"), Recorder())
    with pytest.raises(RuntimeError, match="nothing is running"):
        d.complete(0)
    with pytest.raises(ValueError, match="vm 'X'"):
        d.submit("X", 1, 0)


def test_synchronous_engine_may_complete_inside_start():
    clock = {"now": 0}
    done = []

    def engine(vm, length):
        clock["now"] += length
        done.append(vm)
        d.complete(clock["now"])  # re-enters the dispatcher

    d = Dispatcher(make_policy("fifo"), engine)
    d.add_vm("A", 1, 0)
    d.add_vm("B", 1, 0)
    d.submit("A", 10, 0)      # runs to completion right here
    for _ in range(3):
        d.submit("A", 10, clock["now"])
    assert done == ["A"] * 4 and d.metrics["A"].gpu_time_ns == 40 and d.running is None


def test_band_wait_requests_one_wakeup_and_wake_dispatches():
    wakeups = []
    engine = Recorder()
    d = Dispatcher(make_policy("band", SchedulerParams(band_wait_ns=500 * US)), engine,
                   wakeups.append)
    d.add_vm("A", 1, 0)
    d.add_vm("B", 1, 0)
    d.submit("B", "b1", 0)
    d.complete(30 * MS)                      # B: 100% so far, over its share
    d.submit("A", "a1", 30 * MS)
    d.complete(31 * MS)                      # A finishes; only B is queued next
    d.submit("B", "b2", 31 * MS)
    assert wakeups == [31 * MS + 500 * US] and d.wake_at == wakeups[0]
    d.wake(31 * MS + 100 * US)               # early wake: still waiting, no new request
    assert engine.started[-1] == ("A", "a1") and wakeups == [31 * MS + 500 * US]
    d.wake(31 * MS + 500 * US)
    assert engine.started[-1] == ("B", "b2") and d.wake_at is None


def test_remove_vm_returns_queued_work_and_lets_the_running_one_finish():
    engine = Recorder()
    d = Dispatcher(make_policy("credit"), engine)
    d.add_vm("A", 1, 0)
    d.add_vm("B", 1, 0)
    for item in ("a1", "a2", "a3"):
        d.submit("A", item, 0)
    d.submit("B", "b1", 0)
    assert d.remove_vm("A", 1 * MS) == ["a2", "a3"]
    assert d.complete(2 * MS).vm == "A"
    assert engine.started[-1] == ("B", "b1") and d.metrics["A"].removed_at == 1 * MS


def test_utilisation_series_is_exact_on_a_hand_example():
    d = Dispatcher(make_policy("fifo"), Recorder())
    d.add_vm("A", 1, 100)
    d.submit("A", 0, 100)
    d.complete(150)
    d.submit("A", 0, 300)
    d.complete(400)
    m = d.metrics["A"]
    util = m.utilisation_series(np.array([50, 100, 150, 200, 400, 450]), window=200)
    # 50: before the VM existed; 150: 50 of 50; 200: 50 of 100; 400: [200,400] holds
    # 100; 450: [250,450] holds 100
    assert util.tolist() == pytest.approx([0, 0, 1.0, 0.5, 0.5, 0.5])
    assert m.gpu_time_between(120, 350) == 30 + 50
    assert m.utilisation_between(100, 400) == pytest.approx(150 / 300)


def test_a_late_timestamp_counts_as_the_latest_time_seen():
    # a doorbell thread read the clock after the completion thread but got the lock
    # first: the completion is taken to happen at the doorbell's time
    engine = Recorder()
    d = Dispatcher(make_policy("fifo"), engine)
    d.add_vm("A", 1, 0)
    d.submit("A", "a1", 0)
    d.submit("A", "a2", 10 * MS)
    d.complete(9 * MS)
    assert d.metrics["A"].busy == [(0, 10 * MS)]
    assert d.running.started_at == 10 * MS
    with pytest.raises(ValueError, match="now"):
        d.submit("A", "a3", 20 * MS + 0.5)  # not integer ns
