"""The device clock: what "now" is for the GPU, its PTIMER and the schedulers.

Two clocks, one interface:

- `DeviceClock` (wall): device time is wall time since the GPU was made (times
  `time_scale`).  Engines really wait for the time a kernel or copy takes.  Simple, but
  every scheduling decision then depends on how fast this host runs the guests: on a
  busy host a guest answers a completion later, and BAND's 500 us wait, or a credit
  period, sees a different world.
- `VirtualClock` (virtual): device time advances only with modelled progress, so the
  same run gives the same schedule on an idle host and beside a CPU hog.

How virtual time passes (the choice, made explicit):

- **GPU work** takes the device time the device profile gives it (kernels, copies):
  the engine asks to be woken at the end of its work, and the clock jumps there as soon
  as nothing else can happen earlier.
- **A guest's own time** is the virtual time of its vCPU, counted from what the VMM
  sees it do: every exit (a trapped MMIO access or a port access) costs `exit_ns` of
  guest time (default 12 us: the cost profile's `trap_ns`, an HVM MMIO exit to the
  mediator and back).  Guest computation between exits is not seen by the VMM and so
  costs nothing; a guest waiting for the GPU (PORT_WAIT) is asleep and resumes at the
  device time of the event that woke it.  So a guest's think time between two
  submissions is (exits in between) x exit_ns -- the same on every host.
- **Everything else that acts at a time** -- the scheduler's queue of doorbells and
  completions, its wake-ups (BAND's wait, credit periods), VM arrivals -- is a timer.

The clock is a conservative discrete-event clock over these *parties*: device time is
the smallest time any party may still act at (a running guest's vCPU time, a timer's
earliest pending event; a sleeping guest does not hold it back), and it only moves
forward.  Each event is therefore seen at its own virtual time, in virtual-time order,
whatever the wall-clock order in which the threads got there.  Guests that run ahead in
wall time simply wait (in wall time) at their next sleep for the others to catch up.
Events of one and the same time are put in one order too: an *ordered* timer (the
scheduler, the VM arrivals) acts at T only once every running guest is past T and every
timer made before it (the engines) is done with T.  A VM that ends is removed at its
vCPU's last time, as an event of the scheduler.  So a run gives the same schedule, bit
for bit, on every host.

What stays on wall time: timeouts (a guest's wait, a run's limit) and the watchdog's
last resort (gpuvm/mediator/submission.py): a hung guest is still caught in real
seconds.  What this clock cannot see: a guest that computes for long without an exit
holds device time back for everyone (in wall time) until its next exit.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

CLOCKS = ("wall", "virtual")  # the names a run or an experiment file chooses by
DEFAULT_EXIT_NS = 12_000  # experiments/costs/xen-2014.toml trap_ns
WAKE_POLL_S = 0.002  # a waiter that may have missed its wake-up looks again this often


class NullParty:
    """The wall clock's stand-in for a timer or guest: nothing to hold back."""

    def hold_now(self) -> None: ...

    def set_alarm(self, t: int | None) -> None: ...

    def pending(self, t: int) -> None: ...

    def update(self, handled: list[int], alarm: int | None) -> None: ...

    def due_at(self) -> int | None:
        return None

    def leave(self) -> None: ...


NULL_PARTY = NullParty()


class DeviceClock:
    """Wall time since the GPU was made, times `time_scale` (> 1: device time runs
    faster than wall time, for tests and scaled-down experiments; counts and modelled
    durations do not change)."""

    virtual = False

    def __init__(self, time_scale: float = 1.0) -> None:
        if time_scale <= 0:
            raise ValueError("time_scale must be positive")
        self.time_scale = time_scale
        self._t0 = time.perf_counter_ns()

    def now_ns(self) -> int:
        return int((time.perf_counter_ns() - self._t0) * self.time_scale)

    def wall_seconds_until(self, device_ns: int) -> float:
        """How long to sleep (wall seconds) until the device clock reaches device_ns."""
        return max(0.0, (device_ns - self.now_ns()) / self.time_scale / 1e9)

    def timer(self, name: str, waker: Callable[[], None] | None = None,
              ordered: bool = False) -> NullParty:
        return NULL_PARTY

    def signal(self, scope: object = None) -> None:
        """Something guests wait for happened (no-op: wall-time guests just wake)."""


class TimerParty:
    """A party that acts at times it knows in advance: pending events (each held until
    handled) and one alarm.  `waker` is called (from whichever thread moved the clock,
    with no clock lock held) when device time reaches its horizon; it must not block."""

    def __init__(self, clock: VirtualClock, name: str,
                 waker: Callable[[], None] | None, ordered: bool) -> None:
        self.clock = clock
        self.name = name
        self.waker = waker
        self.ordered = ordered
        self._pending: dict[int, int] = {}  # time -> how many events at it
        self._alarm: int | None = None
        self._was_due = False

    def due_at(self) -> int | None:
        """The time this party may act at now, or None (see VirtualClock.timer)."""
        with self.clock._lock:
            return self.clock._due_at(self)

    def horizon(self) -> int | None:
        times = list(self._pending)
        if self._alarm is not None:
            times.append(self._alarm)
        return min(times) if times else None

    def hold_now(self) -> None:
        """Something to do at once (e.g. the engine was kicked): hold the clock here."""
        with self.clock._lock:
            now = self.clock._now
            self._alarm = now if self._alarm is None else min(self._alarm, now)
        self.clock.advance()  # others may no longer be due

    def set_alarm(self, t: int | None) -> None:
        """Replace the alarm (None: none); may let the clock move on."""
        with self.clock._lock:
            self._alarm = None if t is None else max(t, self.clock._now)
        self.clock.advance()

    def pending(self, t: int) -> None:
        """An event at time t will be handled: hold the clock at t until it is."""
        with self.clock._lock:
            t = max(t, self.clock._now)
            self._pending[t] = self._pending.get(t, 0) + 1
        self.clock.advance()  # others may no longer be due

    def update(self, handled: list[int], alarm: int | None) -> None:
        """Events handled (their times, as given to pending) and the new alarm, at once."""
        with self.clock._lock:
            for t in handled:
                t = max(t, 0)
                for key in (t, *sorted(k for k in self._pending if k >= t)):
                    if key in self._pending:  # pending() may have raised it to `now`
                        self._pending[key] -= 1
                        if not self._pending[key]:
                            del self._pending[key]
                        break
            self._alarm = None if alarm is None else max(alarm, self.clock._now)
        self.clock.advance()

    def leave(self) -> None:
        self.clock._remove(self)


class GuestParty:
    """One vCPU's virtual time.  `tick()` is called by the VMM on every exit (the vCPU
    thread only); `block`/`unblock` bracket a guest's sleep on the GPU."""

    def __init__(self, clock: VirtualClock, name: str, at: int, scope: object = None) -> None:
        self.clock = clock
        self.name = name
        self.scope = scope  # whose signals wake it (its GPU); None: every signal
        self.v = at  # the vCPU's virtual time, ns
        self.blocked = False
        self.exits = 0
        self._cost = clock.exit_ns
        # makes the vCPU's thread look at what it waits for now, where a signal woke it
        # (set by the VMM; called with no clock lock held, must not block): the thread
        # sleeps on its own device's interrupt, which another VM's completion does not
        # raise -- without it the guest, awake in virtual time, held device time back
        # until its wait's next wall-clock look (50 ms; ~3,500 times a BAND run)
        self.waker: Callable[[], None] | None = None

    def tick(self) -> None:
        """One exit: the guest's time moves by exit_ns (no lock unless it may move the
        device clock past something due)."""
        self.exits += 1
        self.v += self._cost
        due = self.clock._due
        if due is not None and self.v >= due:
            self.clock.advance()

    def generation(self) -> int:
        return self.clock._generations.get(self.scope, 0)

    def block(self, generation: int) -> None:
        """The guest sleeps until the GPU signals -- unless it already signalled since
        `generation` was read (then the guest looks again, still awake at that time)."""
        with self.clock._lock:
            if self.clock._generations.get(self.scope, 0) != generation:
                return
            self.blocked = True
        self.clock.advance()

    def unblock(self) -> None:
        """Awake again (a timeout, or a wait that ended without a signal)."""
        with self.clock._lock:
            if self.blocked:
                self.blocked = False
                self.v = max(self.v, self.clock._now)

    def leave(self) -> None:
        self.clock._remove(self)


class VirtualClock:
    """Device time from modelled progress (see the module docstring)."""

    virtual = True
    time_scale = 1.0  # device time per wall time has no meaning here; pacing code reads it

    def __init__(self, exit_ns: int = DEFAULT_EXIT_NS) -> None:
        if exit_ns < 0:
            raise ValueError(f"exit_ns must be >= 0, got {exit_ns}")
        self.exit_ns = int(exit_ns)
        self._lock = threading.Lock()
        self._now = 0
        self._timers: list[TimerParty] = []
        self._guests: list[GuestParty] = []
        self._due: int | None = None  # the earliest timer horizon (guests' fast path)
        self._generations: dict[object, int] = {}  # signals so far, per scope (None: all)
        self._local = threading.local()

    # ------------------------------------------------------------------ parties
    def timer(self, name: str, waker: Callable[[], None] | None = None,
              ordered: bool = False) -> TimerParty:
        """A timer party.  An `ordered` one acts at time T only after every running guest
        is past T and every timer made before it is done with T: so events of one
        virtual time are handled in one order (guests' first, then the timers' in the
        order they were made), whatever the order the threads reached them in."""
        party = TimerParty(self, name, waker, ordered)
        with self._lock:
            self._timers.append(party)
        return party

    def guest(self, name: str, at: int | None = None, scope: object = None) -> GuestParty:
        """A vCPU joining at device time `at` (default: now), woken by `scope`'s signals."""
        with self._lock:
            party = GuestParty(self, name, max(self._now, at or 0), scope)
            self._generations.setdefault(scope, 0)
            self._guests.append(party)
        return party

    def bind_thread(self, party: GuestParty | None) -> None:
        """The calling thread is `party`'s vCPU: events it causes carry its time."""
        self._local.party = party

    def local_now(self) -> int:
        """The time of an event caused by the calling thread: its vCPU's time if it is
        one (never earlier than device time), else device time."""
        party = getattr(self._local, "party", None)
        now = self.now_ns()
        return now if party is None else max(party.v, now)

    def _remove(self, party: object) -> None:
        with self._lock:
            if party in self._timers:
                self._timers.remove(party)
            if party in self._guests:
                self._guests.remove(party)
        self.advance()

    # ------------------------------------------------------------------ time
    def now_ns(self) -> int:
        return self.advance()

    def wall_seconds_until(self, device_ns: int) -> float:
        """0 when device time has reached device_ns; else how long a waiter may sleep
        before looking again (its waker normally comes first)."""
        return 0.0 if self.now_ns() >= device_ns else WAKE_POLL_S

    def guests_running(self) -> int:
        with self._lock:
            return sum(not g.blocked for g in self._guests)

    def signal(self, scope: object = None) -> None:
        """GPU `scope` completed or faulted at the current device time: every guest
        asleep on it is awake from now (each looks at what it waits for, and sleeps again
        if it was not its event).  Called before the signalling party lets time move on."""
        woken: list[Callable[[], None]] = []
        with self._lock:
            keys = set(self._generations) | {None} if scope is None else {scope, None}
            for key in keys:
                self._generations[key] = self._generations.get(key, 0) + 1
            for g in self._guests:
                if g.blocked and (g.scope is None or scope is None or g.scope is scope):
                    g.blocked = False
                    g.v = max(g.v, self._now)
                    if g.waker is not None:
                        woken.append(g.waker)
        for waker in woken:
            waker()

    def _due_at(self, party: TimerParty) -> int | None:
        """(lock held) party's horizon if it may act at it now."""
        h = party.horizon()
        if h is None or h > self._now:
            return None
        if not party.ordered:
            return h
        if any(not g.blocked and g.v <= h for g in self._guests):
            return None
        for t in self._timers:
            if t is party:
                return h
            th = t.horizon()
            if th is not None and th <= h:
                return None
        return h

    def advance(self) -> int:
        """Move device time to the earliest time any party may still act at; wake the
        timers that have become due.  Returns device time."""
        with self._lock:
            horizons = [g.v for g in self._guests if not g.blocked]
            timer_times = [h for t in self._timers if (h := t.horizon()) is not None]
            self._due = min(timer_times, default=None)
            if self._due is not None:
                horizons.append(self._due)
            if horizons and min(horizons) > self._now:
                self._now = min(horizons)
            wakers = []
            for t in self._timers:
                due = self._due_at(t) is not None
                if due and not t._was_due and t.waker is not None:
                    wakers.append(t.waker)
                t._was_due = due
            now = self._now
        for waker in wakers:
            waker()
        return now
