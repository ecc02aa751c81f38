"""The mediator's submission path: doorbells queue per VM and reach the GPU one at a time
in the policy's order; wake-ups asked for from any thread are honoured; a policy that
leaves work queued with nothing to wake it is driven again (and the stall counted)."""

from __future__ import annotations

import threading
import time

from gpuvm.mediator.submission import Submissions
from scheduler import CreditPolicy, FifoPolicy
from scheduler.decision import IDLE, Wait

from waiting import wait_for


class Engine:
    """Stands in for the GPU: records rung doorbells, completes each after `busy_s`."""

    def __init__(self, busy_s: float = 0.002) -> None:
        self.rung: list[tuple[int, int]] = []
        self.busy_s = busy_s
        self.sub: Submissions | None = None
        self.t0 = time.monotonic_ns()

    def now_ns(self) -> int:
        return time.monotonic_ns() - self.t0

    def ring(self, pchid: int, put: int) -> None:
        self.rung.append((pchid, put))
        threading.Timer(self.busy_s, lambda: self.sub.on_idle(pchid, 0)).start()

    def runnable(self, pchid: int) -> bool:
        return True


def make(policy, busy_s: float = 0.002) -> tuple[Submissions, Engine]:
    engine = Engine(busy_s)
    sub = Submissions(engine, policy)
    engine.sub = sub
    return sub, engine


def test_one_at_a_time_in_order_and_repeated_puts_cost_nothing():
    sub, engine = make(FifoPolicy())
    a, b = object(), object()
    sub.add_vm(a, 1.0)
    sub.add_vm(b, 1.0)
    for put in (1, 2):
        sub.submit(a, 0, put)
        sub.submit(b, 8, put)
    sub.submit(a, 0, 2)  # the same put again: nothing new for the GPU
    assert wait_for(lambda: sub.dispatcher.metrics[a].completions == 3)
    assert wait_for(lambda: sub.dispatcher.metrics[b].completions == 2)
    assert sorted(engine.rung) == [(0, 1), (0, 2), (8, 1), (8, 2)]
    assert sub.stalls == 0
    sub.close()


class WaitFirst(FifoPolicy):
    """Answers Wait once (as BAND does before switching), then behaves like FIFO."""

    def __init__(self) -> None:
        super().__init__()
        self.waited = False

    def _choose(self, now: int):
        if not self.waited and any(self._pending.values()):
            self.waited = True
            return Wait(now + 5_000_000)
        return super()._choose(now)


def test_a_wait_asked_for_is_honoured():
    sub, engine = make(WaitFirst())
    a = object()
    sub.add_vm(a, 1.0)
    sub.submit(a, 0, 1)
    assert wait_for(lambda: engine.rung == [(0, 1)])
    assert sub.dispatcher.metrics[a].queue_delay_max_ns >= 5_000_000
    sub.close()


class ForgetsOnce(FifoPolicy):
    """A buggy policy: says IDLE once although work is queued."""

    def __init__(self) -> None:
        super().__init__()
        self.forgot = False

    def _choose(self, now: int):
        if not self.forgot and any(self._pending.values()):
            self.forgot = True
            return IDLE
        return super()._choose(now)


def test_a_stalled_policy_is_driven_again_and_counted():
    sub, engine = make(ForgetsOnce())
    a = object()
    sub.add_vm(a, 1.0)
    sub.submit(a, 0, 1)
    assert wait_for(lambda: engine.rung == [(0, 1)])
    assert sub.stalls == 1
    sub.close()


def test_watchdog_cuts_off_a_submission_that_never_ends():
    """A submission the engine never reports idle is killed at its limit, the VM charged,
    and the next VM's submission runs; a per-VM total limit kills on its own too."""
    from gpuvm.mediator.submission import WatchdogLimits

    class Hanging(Engine):
        def ring(self, pchid: int, put: int) -> None:
            if pchid == 7:  # never completes
                self.rung.append((pchid, put))
            else:
                super().ring(pchid, put)

    for limits, why in ((WatchdogLimits(submission_ns=20_000_000, wall_floor_s=0.0),
                         "submission held the GPU"),
                        (WatchdogLimits(submission_ns=None, vm_ns=20_000_000, wall_floor_s=0.0),
                         "VM used")):
        engine = Hanging()
        killed: list[tuple[int, str]] = []
        sub = Submissions(engine, FifoPolicy(),
                          lambda pchid, reason: killed.append((pchid, reason)), limits)
        engine.sub = sub
        a, b = object(), object()
        sub.add_vm(a, 1.0)
        sub.add_vm(b, 1.0)
        sub.submit(a, 7, 1)
        sub.submit(b, 8, 1)
        try:
            assert wait_for(lambda: sub.dispatcher.metrics[b].completions == 1)
            assert [p for p, _ in killed] == [7] and why in killed[0][1]
            assert sub.used(a) >= 20_000_000
            assert sub.dispatcher.running is None
        finally:
            sub.close()


def test_removing_the_vm_on_the_gpu_frees_it():
    class Silent(Engine):
        def ring(self, pchid: int, put: int) -> None:
            self.rung.append(pchid)  # never reported idle

    engine = Silent()
    sub = Submissions(engine, FifoPolicy())
    engine.sub = sub
    a, b = object(), object()
    sub.add_vm(a, 1.0)
    sub.add_vm(b, 1.0)
    sub.submit(a, 0, 1)
    assert wait_for(lambda: engine.rung == [0])
    sub.remove_vm(a, {0})
    assert sub.dispatcher.running is None
    sub.submit(b, 8, 1)
    assert wait_for(lambda: engine.rung == [0, 8])
    sub.close()


def test_a_status_screen_reads_a_vms_standing_until_it_leaves():
    """A status screen (the run's trace, `gpuvm smi`) reads each VM's share and credit
    from its own thread, while a VM that ends is removed on another: it gets None once
    the VM has left, not the policy's "not added" error -- which, read from the policy
    directly, once ended a traced two-VM BAND run with a traceback."""
    sub, _ = make(CreditPolicy())
    a, b = object(), object()
    sub.add_vm(a, 1.0)
    sub.add_vm(b, 3.0)
    share, credit = sub.standing(b)
    assert share == 0.75 and credit is not None and credit > 0
    sub.remove_vm(a, set())
    assert sub.standing(a) is None and sub.standing(b)[0] == 1.0
    sub.close()
    fifo, _ = make(FifoPolicy())  # no credit under FIFO
    fifo.add_vm(a, 1.0)
    assert fifo.standing(a) == (1.0, None)
    fifo.close()
