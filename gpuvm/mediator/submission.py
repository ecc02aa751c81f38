"""Intercepted doorbells, held per VM and released to the GPU one at a time.

GPU work is not preemptible, so whoever's submission reaches the engine holds it until
done.  Doorbells are queued per VM; a scheduler policy (FIFO, CREDIT, BAND) picks whose
goes next; the mediator performs the real GP_PUT write, learns from the device when that
channel has gone idle, and charges the VM the device time it used.

A watchdog bounds how long anyone holds it: a submission that keeps the GPU longer than
`WatchdogLimits.submission_ns` of device time (a kernel that never ends, a semaphore
acquire never satisfied), or a VM past its `vm_ns` total, has its channel killed (the
mediator unbinds it: preemption, engine scrubbed), is charged what it used, and the GPU
goes to the next.  A VM removed while its work runs is treated the same way at once.

A thread of its own runs the dispatcher, because the device reports completions from its
engine thread while holding its lock: completions and doorbells arrive here through a
queue, never a lock the device thread could wait on.

A VM whose pages must be made resident first (an oversubscribed vGPU) has its submission
rung only after the mediator has switched residency to it.  That takes the mediator's
lock, which is never taken under ours (the mediator calls in here holding it), so the
dispatch is only noted under our lock and the switch runs on this thread after it.

Every event is stamped with the time it happened at: a doorbell with the ringing vCPU's
time, a completion with device time.  Under the wall clock that is simply "now".  Under
a virtual clock (gpuvm/device/clock.py) this thread is a timer party: it holds device
time at its earliest unhandled event and at the dispatcher's wake-up, so each is handled
exactly at its own virtual time -- BAND's wait ends, a credit period turns over, a
doorbell arrives, in virtual-time order, however late the host ran any of the threads.
The watchdog then cuts a submission off at `submission_ns` of virtual device time (a
deterministic verdict), and, as the wall-time last resort, after that many wall seconds
in which device time stood still while no guest ran (nothing but the GPU itself could be
holding device time back).
"""

from __future__ import annotations

import copy
import heapq
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from gpuvm.device.clock import DeviceClock
from scheduler import Dispatcher
from scheduler.policy import Policy


log = logging.getLogger(__name__)
STALL_CHECK_S = 0.05
REMOVE_WAIT_S = 5.0  # a virtual-clock removal the loop has not handled by then is forced


@dataclass(frozen=True)
class WatchdogLimits:
    """Device time one submission may hold the GPU, and one VM may use in all (None: no
    limit).  The default suits the isolation experiment: its kernels take milliseconds,
    a hung one is cut off after five seconds of device time.

    `wall_floor_s`: a submission is also given at least this much wall time.  The device
    clock may run far faster than wall time (tests run it 1000x), and then the emulator's
    own slowness alone would look like seconds of device time; a hang is one that lasts
    in both clocks."""

    submission_ns: int | None = 5_000_000_000
    vm_ns: int | None = None
    wall_floor_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("submission_ns", "vm_ns"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"watchdog {name} must be positive, got {value}")


@dataclass(frozen=True)
class Doorbell:
    """A GP_PUT the mediator intercepted and holds for the scheduler: which physical
    channel, the put value to write, and where to record the engine time it takes."""
    pchid: int
    put: int
    # the ringing vCPU's event-stream entry, given the engine time this submission takes
    # (gpuvm.device.clock.EventStream.doorbell; None: nothing records it)
    ledger: list | None = field(default=None, compare=False)


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


class ResidencyPort(Protocol):
    """What the submission path needs to switch residency before a VM's work runs."""

    def needs_residency(self, vm: object) -> bool:
        """Whether this VM's pages must be made resident before its work runs (no lock)."""
        ...

    def make_resident(self, vm: object) -> bool:
        """Make them resident; False: the VM cannot run (it was faulted)."""
        ...


class Submissions:
    """The one submission path to the physical GPU: intercepted doorbells queue here per
    VM, the policy picks whose goes next, the real GP_PUT is written, completions and
    the watchdog free the GPU (the module docstring says how, on either clock).  Its own
    thread, because completions arrive from the device's engine thread."""
    def __init__(self, gpu: GpuPort, policy: Policy,
                 kill: Callable[[int, str], None] | None = None,
                 limits: WatchdogLimits | None = None,
                 residency: ResidencyPort | None = None,
                 clock: DeviceClock | None = None) -> None:
        self._now = gpu.now_ns
        self._clock = clock
        self._virtual = bool(clock is not None and clock.virtual)
        self._party = clock.timer("scheduler", self._nudge, ordered=True) \
            if clock is not None else None
        self._rank: dict[object, int] = {}  # VMs in the order they were added (ties)
        self._ranks = 0
        self._ring = gpu.ring
        self._runnable = gpu.runnable
        self._kill = kill
        self._residency = residency
        self._to_place: tuple[object, Doorbell] | None = None  # dispatched, awaiting residency
        self.limits = limits or WatchdogLimits()
        self.kills: list[tuple[object, int, str]] = []  # (vm, pchid, reason)
        self._used: dict[object, int] = {}  # device time charged per VM
        # doorbells per VM rung (its vCPU's thread the only writer) and handed to the
        # dispatcher (the loop's the only writer): equal when none is on the way
        self._rung: dict[object, int] = {}
        self._taken: dict[object, int] = {}
        self._started_at = 0
        self._started_wall = 0.0
        self._seen_now = -1  # device time as the watchdog last saw it, and when it moved
        self._seen_moved_wall = 0.0
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        # taken from the queue, not yet handled: (stamp, kind rank, VM rank, seq, kind,
        # a, b) -- events of one time in one order: completions first, then doorbells by
        # VM (a vCPU's events never share a time: each exit moves its clock)
        self._ready: list[tuple] = []
        self._lock = threading.Lock()
        # no request_wakeup callback: the loop reads dispatcher.wake_at every turn, so a
        # wake-up asked for from any thread (or asked for twice) is never missed.  Its
        # start port only notes the pick (_start_picked rings it), so the dispatcher
        # never calls back up into this object.
        self._picked: dict[object, Doorbell] = {}
        self.dispatcher: Dispatcher[Doorbell] = Dispatcher(policy, self._picked.__setitem__)
        self.stalls = 0
        self._last_put: dict[int, int] = {}
        self._running: Doorbell | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="gpu-submissions", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------- called by anyone
    def _nudge(self) -> None:
        """The loop re-reads the wake-up time (a virtual clock's waker: never blocks)."""
        self._events.put(("nudge", None, None, None))

    def _stamp(self) -> int:
        """When an event caused by the calling thread happens (held until handled)."""
        if not self._virtual:
            return self._now()
        t = self._clock.local_now()
        self._party.pending(t)
        return t

    def add_vm(self, vm: object, share: float) -> None:
        with self._lock:
            if vm not in self._rank:
                self._rank[vm] = self._ranks
                self._ranks += 1
            self.dispatcher.add_vm(vm, share, self._now())
        self._nudge()

    def remove_vm(self, vm: object, pchids: set[int]) -> None:
        """Forget the VM; if its submission holds the GPU, it is ended now (the mediator
        then unbinds its channels): nothing keeps the GPU for a VM that is gone.

        Under a virtual clock the removal is an event like the others: stamped with the
        caller's time (the VMM removes a VM with its vCPU's last time; gpuvm/run) and
        handled by the loop in time order, while this call waits for it."""
        if self._virtual and self._thread.is_alive():
            done = threading.Event()
            self._events.put(("remove", vm, (pchids, done), self._stamp()))
            if done.wait(REMOVE_WAIT_S):
                return
            log.error("scheduler: removal of %r not handled in %g s; removing it now",
                      vm, REMOVE_WAIT_S)
        with self._lock:
            self._remove(vm, pchids, self._now())
        self._nudge()

    def _remove(self, vm: object, pchids: set[int], now: int) -> None:
        """(lock held)"""
        if vm not in self.dispatcher.metrics or \
                self.dispatcher.metrics[vm].removed_at is not None:
            return
        running = self.dispatcher.running
        if running is not None and running.vm is vm:
            self._running = None
            if self._to_place is not None and self._to_place[0] is vm:
                self._to_place = None
            self.dispatcher.complete(now)
            self._start_picked()
        self.dispatcher.remove_vm(vm, now)
        self._start_picked()
        for c in pchids:
            self._last_put.pop(c, None)
        # nothing of a removed VM is kept (a long-running daemon served thousands)
        self._rank.pop(vm, None)
        self._used.pop(vm, None)
        self._rung.pop(vm, None)
        self._taken.pop(vm, None)
        self.dispatcher.metrics.pop(vm, None)

    def submit(self, vm: object, pchid: int, put: int, ledger: list | None = None) -> None:
        self._rung[vm] = self._rung.get(vm, 0) + 1
        self._events.put(("submit", vm, Doorbell(pchid, put, ledger), self._stamp()))

    def on_idle(self, pchid: int, busy_ns: int) -> None:
        """Device engine thread (device lock held): only enqueue."""
        self._events.put(("idle", pchid, None, self._stamp()))

    def channel_reset(self, pchid: int) -> None:
        """A (re)bound channel starts at GP_GET 0: forget the put we last rang."""
        with self._lock:
            self._last_put.pop(pchid, None)

    def metrics(self, vm: object):
        """A copy of the dispatcher's record of `vm` (taken under the dispatcher's lock)."""
        with self._lock:
            m = self.dispatcher.metrics.get(vm)
            return copy.deepcopy(m) if m is not None else None

    def standing(self, vm: object) -> tuple[float, float | None] | None:
        """`vm`'s share of the GPU and its credit in ns (None under a policy without
        credit), read under the lock; None once it has left the scheduler.  For status
        screens, which run on threads of their own: the policy is the scheduler
        thread's, and a VM that ends is removed on its own thread (run/removals.py)."""
        with self._lock:
            policy = self.dispatcher.policy
            if vm not in policy.vms:
                return None
            credit = getattr(policy, "credit", None)
            return policy.share(vm), float(credit(vm)) if credit is not None else None

    def wait_idle(self, vm: object, timeout: float = 5.0) -> bool:
        """Wait until nothing of `vm` is queued or running (its last completion counted).
        Only `vm`'s own work: under a virtual clock another VM's events may wait for
        device time that this VM's removal, after this wait, lets pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                running = self.dispatcher.running
                if not self.dispatcher.queued(vm) and (running is None or running.vm is not vm) \
                        and not self._submits_pending(vm):
                    return True
            time.sleep(0.001)
        return False

    def _submits_pending(self, vm: object) -> bool:
        """A doorbell of `vm` not yet handed to the dispatcher."""
        return self._rung.get(vm, 0) != self._taken.get(vm, 0)

    def close(self) -> None:
        self._stopping = True
        self._events.put(("stop", None, None, None))
        self._thread.join()
        if self._party is not None:
            self._party.leave()

    # ----------------------------------------------------------- dispatcher side
    def _start_picked(self) -> None:
        """Put what the dispatcher just picked on the engine (lock held), right after
        the dispatcher's call that picked it.  A start that finds nothing to run
        completes at once, and the dispatcher's next pick is started in turn."""
        picked = self._picked
        while picked:
            vm, bell = picked.popitem()
            self._start(vm, bell)

    def _start(self, vm: object, bell: Doorbell) -> None:
        if self._residency is not None and self._residency.needs_residency(vm):
            self._to_place = (vm, bell)  # rung by _place_pending, after the switch
            return
        self._ring_start(vm, bell)

    def _place_pending(self) -> None:
        """Switch residency to each dispatched VM that needs it, then ring its submission
        (no lock of ours held while the mediator works)."""
        while True:
            with self._lock:
                pending, self._to_place = self._to_place, None
            if pending is None:
                return
            vm, bell = pending
            ok = self._residency.make_resident(vm)
            with self._lock:
                running = self.dispatcher.running
                if running is None or running.vm is not vm or running.item is not bell:
                    continue  # removed meanwhile: the dispatcher has moved on
                if ok:
                    self._ring_start(vm, bell)
                else:
                    self.dispatcher.complete(self._now(), used=0)
                self._start_picked()

    def _ring_start(self, vm: object, bell: Doorbell) -> None:
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
        self._started_at = self._now()
        self._started_wall = time.monotonic()
        self._ring(bell.pchid, bell.put)

    def used(self, vm: object) -> int:
        return self._used.get(vm, 0)

    def _deadline(self) -> int | None:
        """When the running submission is cut off (lock held), or None."""
        running = self.dispatcher.running
        if running is None or self._running is None:
            return None
        out = None
        if self.limits.submission_ns is not None:
            out = self._started_at + self.limits.submission_ns
        if self.limits.vm_ns is not None:
            left = self._started_at + self.limits.vm_ns - self._used.get(running.vm, 0)
            out = left if out is None else min(out, left)
        return out

    def _watchdog(self, now: int, settled: bool = True) -> tuple[int, str] | None:
        """Cut off the running submission if it is past its limit (lock held); returns
        (pchid, reason) for the mediator to kill, outside the lock.  `settled`: a
        virtual clock's `now` may be acted at (else only the wall-time last resort)."""
        deadline = self._deadline()
        if deadline is None:
            return None
        wall = time.monotonic()
        held_wall = wall - self._started_wall
        hung_wall = False
        if self._virtual:
            # virtual time: the device deadline is exact; the wall-time last resort needs
            # every guest asleep (a running guest may be what holds device time back)
            # and device time standing still that long: a host too loaded to run the
            # engine promptly slows device time down, it does not stop it
            if now != self._seen_now:
                self._seen_now, self._seen_moved_wall = now, wall
            held_wall = wall - max(self._started_wall, self._seen_moved_wall)
            limit = self.limits.submission_ns
            hung_wall = limit is not None and \
                held_wall >= max(limit / 1e9, self.limits.wall_floor_s) and \
                self._clock.guests_running() == 0
            if (now < deadline or not settled) and not hung_wall:
                return None
        elif now < deadline or held_wall < self.limits.wall_floor_s:
            return None
        bell, running = self._running, self.dispatcher.running
        held = now - self._started_at
        total = self._used.get(running.vm, 0) + held
        if hung_wall and (now < deadline or not settled):
            reason = f"watchdog: device time stood still {held_wall:.1f} s of wall time " \
                f"with every guest asleep (limit {self.limits.submission_ns / 1e9:g} s)"
        elif self.limits.vm_ns is not None and total >= self.limits.vm_ns:
            reason = f"watchdog: VM used {total / 1e6:.0f} ms of GPU time (limit " \
                f"{self.limits.vm_ns / 1e6:.0f} ms)"
        else:
            reason = f"watchdog: submission held the GPU {held / 1e6:.0f} ms (limit " \
                f"{self.limits.submission_ns / 1e6:.0f} ms)"
        self.kills.append((running.vm, bell.pchid, reason))
        self._running = None
        self._charge(running.vm, held)
        self.dispatcher.complete(now, used=held)
        self._start_picked()
        return bell.pchid, reason

    def _charge(self, vm: object, used: int) -> None:
        self._used[vm] = self._used.get(vm, 0) + max(0, used)

    def _stalled(self) -> bool:
        """Work queued, nothing on the engine, and no wake-up pending: nothing would ever
        move again.  The policies should never leave this state; if one does, say so."""
        d = self.dispatcher
        return d.running is None and d.wake_at is None and \
            any(d.queued(vm) for vm, m in d.metrics.items() if m.removed_at is None)

    def _wall_timeout(self, woken_for: int | None) -> float | None:
        """How long the loop may sleep under the wall clock."""
        with self._lock:
            wake_at = self.dispatcher.wake_at
            stalled = self._stalled()
            deadline = self._deadline()
        timeout = None
        if wake_at is not None:
            timeout = max(0.0, (wake_at - self._now()) / 1e9)
            if wake_at == woken_for:
                timeout = max(timeout, STALL_CHECK_S / 50)  # a wait that did not move
        if stalled:
            timeout = STALL_CHECK_S if timeout is None else min(timeout, STALL_CHECK_S)
        if deadline is not None:
            # the cut-off is the later of the device deadline and the wall floor; the
            # device clock may run faster than wall time: look again soon enough
            until = max(0.0, (deadline - self._now()) / 1e9,
                        self.limits.wall_floor_s - (time.monotonic() - self._started_wall))
            until = min(until, STALL_CHECK_S)
            timeout = until if timeout is None else min(timeout, until)
        return timeout

    def _virtual_timeout(self) -> float | None:
        """Under a virtual clock the waker (a nudge) says when device time has reached
        what we wait for; look again now and then anyway (the watchdog's wall time, a
        stalled policy)."""
        if self._party.due_at() is not None:
            return 0.0  # due already (e.g. more events of the time just handled)
        with self._lock:
            idle = not self._ready and self.dispatcher.wake_at is None and \
                self.dispatcher.running is None and not self._stalled()
        return None if idle else STALL_CHECK_S

    def _alarm(self, now: int) -> int | None:
        """What device time must wait for besides queued events (lock held): the
        dispatcher's wake-up and the watchdog's device deadline, if still ahead."""
        times = [t for t in (self.dispatcher.wake_at, self._deadline())
                 if t is not None and t > now]
        return min(times) if times else None

    def _handle(self, kind: str, a: object, b: object, now: int) -> None:
        if kind == "remove":
            pchids, done = b
            try:
                self._remove(a, pchids, now)
            finally:
                done.set()
        elif kind == "submit":
            self._taken[a] = self._taken.get(a, 0) + 1
            if a in self.dispatcher.metrics and self.dispatcher.metrics[a].removed_at is None:
                self.dispatcher.submit(a, b, now)
                self._start_picked()
        elif kind == "idle":
            if self._running is not None and self._running.pchid == a:
                self._running = None
                running = self.dispatcher.running
                if running is not None:
                    self._charge(running.vm, now - self._started_at)
                    if running.item.ledger is not None:
                        running.item.ledger[1] += now - self._started_at
                self.dispatcher.complete(now)
                self._start_picked()

    def _loop(self) -> None:
        woken_for: int | None = None  # the wake-up time last handed to the dispatcher
        seq = 0  # ties between equal stamps go in arrival order
        while not self._stopping:
            timeout = self._virtual_timeout() if self._virtual else self._wall_timeout(woken_for)
            try:
                items = [self._events.get(timeout=timeout)]
            except queue.Empty:
                items = [("wake", None, None, None)]
            while True:  # everything queued: handled in stamp order, not arrival order
                try:
                    items.append(self._events.get_nowait())
                except queue.Empty:
                    break
            kinds = {item[0] for item in items}
            handled: list[int] = []
            with self._lock:
                for kind, a, b, t in items:
                    if kind == "idle":
                        heapq.heappush(self._ready, (t, 0, 0, seq, kind, a, b))
                    elif kind in ("submit", "remove"):
                        heapq.heappush(self._ready, (t, 1, self._rank.get(a, -1), seq,
                                                     kind, a, b))
                    seq += 1
                # under a virtual clock, act only once this time is settled (every guest
                # and the engines are past it): the events of one time all at once
                due = self._party.due_at() if self._virtual else None
                acting = due is not None or not self._virtual
                now = due if due is not None else self._now()
                while acting and self._ready and self._ready[0][0] <= now:
                    t, _, _, _, kind, a, b = heapq.heappop(self._ready)
                    handled.append(t)
                    self._handle(kind, a, b, now)
                killed = self._watchdog(now, acting)
                wake_at = self.dispatcher.wake_at
                if not acting:
                    pass
                elif wake_at is not None and now >= wake_at:
                    woken_for = wake_at
                    self.dispatcher.wake(now)
                    self._start_picked()
                elif "wake" in kinds and self._stalled():
                    self.stalls += 1
                    log.error("scheduler %s left queued work with nothing running and no "
                              "wake-up; driving it again", type(self.dispatcher.policy).__name__)
                    self.dispatcher.wake(now)
                    self._start_picked()
                alarm = self._alarm(now)
            if killed is not None and self._kill is not None:
                self._kill(*killed)  # the mediator takes its own lock: never under ours
            if self._residency is not None:
                self._place_pending()
            if self._party is not None:
                self._party.update(handled, alarm)  # only now may a virtual clock move on
