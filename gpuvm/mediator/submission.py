"""Intercepted doorbells, held per VM and released to the GPU one at a time.

GPU work is not preemptible, so whoever's submission reaches the engine holds it until
done.  Doorbells are queued per VM; a scheduler policy (FIFO, CREDIT, BAND) picks whose
goes next; the mediator performs the real GP_PUT write, learns from the device when that
channel has gone idle, and charges the VM the device time it used.

A thread of its own runs the dispatcher, because the device reports completions from its
engine thread while holding its lock: completions and doorbells arrive here through a
queue, never a lock the device thread could wait on.
"""

from __future__ import annotations

import copy
import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from scheduler import Dispatcher
from scheduler.policy import Policy


log = logging.getLogger(__name__)
STALL_CHECK_S = 0.05


@dataclass(frozen=True)
class Doorbell:
    pchid: int
    put: int


class GpuPort(Protocol):
    """What the submission path needs of the physical GPU (the mediator provides it)."""

    def now_ns(self) -> int:
        """The device clock."""
        ...

    def ring(self, pchid: int, put: int) -> None:
        """The real GP_PUT write of physical channel pchid."""
        ...

    def runnable(self, pchid: int) -> bool:
        """Whether that channel is on the runlist and runnable now."""
        ...


class Submissions:
    def __init__(self, gpu: GpuPort, policy: Policy) -> None:
        self._now = gpu.now_ns
        self._ring = gpu.ring
        self._runnable = gpu.runnable
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        # no request_wakeup callback: the loop reads dispatcher.wake_at every turn, so a
        # wake-up asked for from any thread (or asked for twice) is never missed
        self.dispatcher: Dispatcher[Doorbell] = Dispatcher(policy, self._start)
        self.stalls = 0
        self._last_put: dict[int, int] = {}
        self._running: Doorbell | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="gpu-submissions", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------- called by anyone
    def add_vm(self, vm: object, share: float) -> None:
        with self._lock:
            self.dispatcher.add_vm(vm, share, self._now())
        self._events.put(("nudge", None, None))  # the loop re-reads the wake-up time

    def remove_vm(self, vm: object, pchids: set[int]) -> None:
        with self._lock:
            self.dispatcher.remove_vm(vm, self._now())
            for c in pchids:
                self._last_put.pop(c, None)
        self._events.put(("nudge", None, None))

    def submit(self, vm: object, pchid: int, put: int) -> None:
        self._events.put(("submit", vm, Doorbell(pchid, put)))

    def on_idle(self, pchid: int, busy_ns: int) -> None:
        """Device engine thread (device lock held): only enqueue."""
        self._events.put(("idle", pchid, None))

    def channel_reset(self, pchid: int) -> None:
        """A (re)bound channel starts at GP_GET 0: forget the put we last rang."""
        with self._lock:
            self._last_put.pop(pchid, None)

    def metrics(self, vm: object):
        """A copy of the dispatcher's record of `vm` (taken under the dispatcher's lock)."""
        with self._lock:
            m = self.dispatcher.metrics.get(vm)
            return copy.deepcopy(m) if m is not None else None

    def wait_idle(self, vm: object, timeout: float = 5.0) -> bool:
        """Wait until nothing of `vm` is queued or running (its last completion counted)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                running = self.dispatcher.running
                if not self.dispatcher.queued(vm) and (running is None or running.vm is not vm) \
                        and self._events.empty():
                    return True
            time.sleep(0.001)
        return False

    def close(self) -> None:
        self._stopping = True
        self._events.put(("stop", None, None))
        self._thread.join()

    # ----------------------------------------------------------- dispatcher side
    def _start(self, vm: object, bell: Doorbell) -> None:
        self._running = bell
        if self._last_put.get(bell.pchid, 0) == bell.put or not self._runnable(bell.pchid):
            # Nothing the GPU would run now (no new entries, or a channel not on the
            # runlist): it would never report the channel busy, so don't hold the engine.
            # The put still goes to USERD, so the work runs once the channel can.
            self._running = None
            if self._last_put.get(bell.pchid, 0) != bell.put:
                self._last_put[bell.pchid] = bell.put
                self._ring(bell.pchid, bell.put)
            self.dispatcher.complete(self._now(), used=0)
            return
        self._last_put[bell.pchid] = bell.put
        self._ring(bell.pchid, bell.put)

    def _stalled(self) -> bool:
        """Work queued, nothing on the engine, and no wake-up pending: nothing would ever
        move again.  The policies should never leave this state; if one does, say so."""
        d = self.dispatcher
        return d.running is None and d.wake_at is None and \
            any(d.queued(vm) for vm, m in d.metrics.items() if m.removed_at is None)

    def _loop(self) -> None:
        woken_for: int | None = None  # the wake-up time last handed to the dispatcher
        while not self._stopping:
            with self._lock:
                wake_at = self.dispatcher.wake_at
                stalled = self._stalled()
            timeout = None
            if wake_at is not None:
                timeout = max(0.0, (wake_at - self._now()) / 1e9)
                if wake_at == woken_for:
                    timeout = max(timeout, STALL_CHECK_S / 50)  # a wait that did not move
            if stalled:
                timeout = STALL_CHECK_S if timeout is None else min(timeout, STALL_CHECK_S)
            try:
                kind, a, b = self._events.get(timeout=timeout)
            except queue.Empty:
                kind, a, b = "wake", None, None
            with self._lock:
                now = self._now()
                if kind == "submit":
                    if a in self.dispatcher.metrics and self.dispatcher.metrics[a].removed_at is None:
                        self.dispatcher.submit(a, b, now)
                elif kind == "idle":
                    if self._running is not None and self._running.pchid == a:
                        self._running = None
                        self.dispatcher.complete(now)
                wake_at = self.dispatcher.wake_at
                if wake_at is not None and now >= wake_at:
                    woken_for = wake_at
                    self.dispatcher.wake(now)
                elif kind == "wake" and self._stalled():
                    self.stalls += 1
                    log.error("scheduler %s left queued work with nothing running and no "
                              "wake-up; driving it again", type(self.dispatcher.policy).__name__)
                    self.dispatcher.wake(now)
