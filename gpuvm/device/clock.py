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
- **A guest's own time** is the virtual time of its vCPU: every event it causes takes
  its price (`EventPrices`, from the run's cost profile): each trapped access, each PTE
  scanned, each sync, hypercall and entry, charged by the device that sees it
  (`GuestParty.charge`) and added as the next exit starts (`tick`).  Guest computation
  between exits is not seen by the VMM and so costs nothing; a guest waiting for the GPU
  (PORT_WAIT) is asleep and resumes at the device time of the event that woke it.
- **The mediator's lock** is held in virtual time (`VirtualLock`): an exit asks for it
  at its start, asks are granted in virtual-time order (`VirtualClock.wait_turn`), and
  it stays held for the priced work done under it, so other VMs wait in virtual time.
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

What stays on wall time: a run's limit and the watchdog's last resort
(gpuvm/mediator/submission.py): a hung guest is still caught in real seconds.  What this clock cannot see: a guest that computes for long without an exit
holds device time back for everyone (in wall time) until its next exit.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

CLOCKS = ("wall", "virtual")  # the names a run or an experiment file chooses by
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
        pending, alarm = self._pending, self._alarm
        if not pending:
            return alarm
        first = min(pending)
        return first if alarm is None or first < alarm else alarm

    def _may_be_due(self) -> None:
        """(clock lock held) This timer's horizon may have come earlier: keep the clock's
        `_due` at or below every timer's horizon at all times, so that a vCPU's turn
        (`VirtualClock._my_turn`) may skip the timers when its ask comes before `_due`."""
        h = self.horizon()
        due = self.clock._due
        if h is not None and (due is None or h < due):
            self.clock._due = h

    def hold_now(self) -> None:
        """Something to do at once (e.g. the engine was kicked): hold the clock at the
        time of whoever caused it -- the kicking vCPU's own time, or device time for
        any other thread -- never at whatever device time the clock last computed,
        which depends on how the threads ran."""
        at = self.clock.local_now()
        with self.clock._lock:
            self._alarm = at if self._alarm is None else min(self._alarm, at)
            self._may_be_due()
        self.clock.advance()  # others may no longer be due

    def set_alarm(self, t: int | None) -> None:
        """Replace the alarm (None: none); may let the clock move on."""
        with self.clock._lock:
            self._alarm = None if t is None else max(t, self.clock._now)
            self._may_be_due()
        self.clock.advance()

    def pending(self, t: int) -> None:
        """An event at time t will be handled: hold the clock at t until it is."""
        with self.clock._lock:
            t = max(t, self.clock._now)
            self._pending[t] = self._pending.get(t, 0) + 1
            self._may_be_due()
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
            self._may_be_due()
        self.clock.advance()

    def leave(self) -> None:
        self.clock._remove(self)


@dataclass(frozen=True)
class EventPrices:
    """What each event a VM causes costs in virtual time: the run's cost profile, turned
    into what the trap path needs (gpuvm.experiment.costs.CostProfile.event_prices).

    Why here: the clock is what these prices move, and the devices that see the events
    (a vGPU, a passed-through GPU) are handed a `GuestParty` to charge, never the profile.
    `exit_ns`: one trapped BAR access, by BAR region; `exit_locked_ns`: of that, the
    mediator's own part, spent holding its lock (charged only where the access takes
    it); `counter_ns`: per counted event by counter name (a PTE scanned, a hypercall and
    its entries, a sync, a remap); `locked`: the counters whose time is spent under the
    mediator's lock (GPUvm: "page shadowing locks GPU resources")."""

    exit_ns: Mapping[int, int] = field(default_factory=dict)
    exit_locked_ns: int = 0
    counter_ns: Mapping[str, float] = field(default_factory=dict)
    locked: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for what, value in (*self.exit_ns.items(), ("exit_locked_ns", self.exit_locked_ns),
                            *self.counter_ns.items()):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"price {what!r} must be a non-negative number, got {value!r}")


FREE = EventPrices()  # a run without a cost profile: only GPU work takes virtual time


class GuestParty:
    """One vCPU's virtual time, and the meter its VM's events are charged to.

    `tick()` is called by the VMM at the start of every exit (the vCPU thread only): the
    price of everything the previous exit caused (`charge`) is added then, so `v` is the
    time the current exit starts at.  `block`/`unblock` bracket a guest's sleep on the
    GPU.  The mediator's lock (`VirtualLock`) is taken in virtual-time order: an exit
    asks for it at `v` and gets it when it is free, so another VM's shadow scan makes
    this one wait in virtual time -- the same on every host.

    Each exit, lock hold and wait is also appended to `stream` (runs of equal exits
    kept as one entry): the priced event stream the simpy model replays."""

    def __init__(self, clock: VirtualClock, name: str, at: int, scope: object,
                 rank: int) -> None:
        self.clock = clock
        self.name = name
        self.scope = scope  # whose signals wake it (its GPU); None: every signal
        self.rank = rank  # ties in virtual time go to the VM that joined first
        self.v = at  # the vCPU's virtual time, ns: the start of its current exit
        self.blocked = False
        self.exits = 0
        self.pending = 0.0  # priced time of the current exit so far
        self.foreign = 0.0  # charged from other threads (a resync at submission)
        self.lock_start: int | None = None  # when the current exit got the lock
        self.locked = 0.0  # of `pending`, the part spent holding the lock
        self.lock_waits = 0
        self.lock_wait_ns = 0
        self.thread: int | None = None
        self._open = False  # an exit is under way (tick opened it, settle closes it)
        self.stream = EventStream()
        self._flat = clock.exit_ns
        # makes the vCPU's thread look at what it waits for now, where a signal woke it
        # (set by the VMM; called with no clock lock held, must not block): the thread
        # sleeps on its own device's interrupt, which another VM's completion does not
        # raise
        self.waker: Callable[[], None] | None = None

    # ------------------------------------------------------------------ pricing
    def charge(self, ns: float, locked: bool = False) -> None:
        """The current exit caused `ns` of work (`locked`: under the mediator's lock)."""
        if threading.get_ident() != self.thread:
            with self.clock._lock:
                self.foreign += ns
            return
        self.pending += ns
        if locked:
            self.locked += ns

    def hold(self, ns: float) -> None:
        """Of the current exit's price already charged, `ns` is spent holding the
        mediator's lock (the mediator's own part of a trap)."""
        self.locked += ns

    def settle(self) -> None:
        """Close the current exit: its priced time moves `v` on (vCPU thread; a guest
        that ends closes its last one)."""
        if self.foreign:
            with self.clock._lock:
                self.pending += self.foreign
                self.foreign = 0.0
        if not self._open:
            return
        self._open = False
        ns = round(self.pending)
        self.stream.exit(ns + self._flat,
                         round(self.locked) if self.lock_start is not None else -1)
        self.v += ns
        self.pending = 0.0
        self.locked = 0.0
        self.lock_start = None

    def wait_starts(self) -> int:
        """The guest waits on the GPU: its exit ends here.  Returns the time it waits
        from (give it to `wait_ends`)."""
        self.settle()
        return self.v

    def wait_ends(self, since: int) -> None:
        """The wait that began at `since` is over (the guest awake at `v`)."""
        self.stream.waited(self.v - since)

    def horizon(self) -> int:
        """(clock lock held) The earliest virtual time this vCPU may still ask for the
        mediator's lock at: its exit's start until that exit has the lock, then that
        exit's end so far (its price only grows)."""
        if self.lock_start is None:
            return self.v
        return self.v + round(self.pending)

    def bind(self) -> None:
        """The guest starts on the calling thread: it is this vCPU's from now on."""
        self.clock.bind_thread(self)

    def unseen_exit(self) -> None:
        """An exit no device saw (a port the VMM answers itself): `tick` counted it.  (A
        vCPU served over vfio-user reports these: gpuvm/vfio/user/vcpu_clock.py.)"""

    def tick(self) -> None:
        """A new exit starts: the last one's price is added (no clock lock unless the
        time may pass something due, or another vCPU waits for this one)."""
        self.settle()
        self._open = True
        self.exits += 1
        self.v += self._flat  # a flat price, paid as the exit starts
        clock = self.clock
        if clock._turn_waiters:
            with clock._lock:
                clock._wake_turn()
        due = clock._due
        if due is not None and self.v >= due:
            clock.advance()

    def generation(self) -> int:
        return self.clock._generations.get(self.scope, 0)

    def block(self, generation: int) -> None:
        """The guest sleeps until the GPU signals -- unless it already signalled since
        `generation` was read (then the guest looks again, still awake at that time)."""
        self.settle()  # the exit that waits ends here; the wait starts at its end
        with self.clock._lock:
            if self.clock._generations.get(self.scope, 0) != generation:
                return
            self.blocked = True
            self.clock._wake_turn()
        self.clock.advance()

    def unblock(self) -> None:
        """Awake again (a timeout, or a wait that ended without a signal)."""
        with self.clock._lock:
            if self.blocked:
                self.blocked = False
                self.v = max(self.v, self.clock._now)

    def leave(self) -> None:
        if self.thread == threading.get_ident():
            self.settle()
        self.clock._remove(self)

    def retire(self) -> TimerParty:
        """Leave the clock as the guest ends, and return an ordered timer holding device
        time at this vCPU's last time: the VMM removes its device there, then lets the
        timer go."""
        leaving = self.clock.timer(f"{self.name} leaving", ordered=True)
        leaving.set_alarm(self.v)
        self.leave()
        return leaving


class EventStream:
    """What one vCPU did, priced, in order: the input of the simpy model's replay.

    Entries: ["x", count, ns, locked_ns] -- `count` consecutive exits each costing `ns`,
    of which `locked_ns` under the mediator's lock (-1: the exit did not take it);
    ["d", engine_ns] -- a doorbell, and the engine time the submission it rang took
    (filled in when it completes; 0: it ran nothing); ["w", ns] -- a wait on the GPU,
    over `ns` later (alone, that is how long its GPU work took).  Plain lists: appending
    must cost the trap path next to nothing."""

    def __init__(self) -> None:
        self.entries: list[list] = []

    def exit(self, ns: int, locked_ns: int) -> None:
        entries = self.entries
        if entries:
            last = entries[-1]
            if last[0] == "x" and last[2] == ns and last[3] == locked_ns:
                last[1] += 1
                return
        entries.append(["x", 1, ns, locked_ns])

    def waited(self, ns: int) -> None:
        self.entries.append(["w", ns])

    def doorbell(self) -> list:
        """A doorbell rung now; the entry to fill in with its engine time."""
        entry = ["d", 0]
        self.entries.append(entry)
        return entry


class VirtualLock:
    """The mediator's lock in virtual time.

    Why: GPUvm serialises shadow scans, resyncs and the mediator's part of every trap
    under one lock, and that is what makes full virtualization degrade with more VMs.
    The real `threading.RLock` keeps the emulator's state safe; this keeps the modelled
    time: an exit asks for the lock at its start time, the asks are granted in virtual-
    time order (`VirtualClock.wait_turn`: no vCPU that could still ask earlier is left),
    and the lock is free again when the holder's priced work under it ends.  Waiting
    for it moves the waiter's virtual time and is counted as its lock wait."""

    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        self.free_at = 0

    def ask(self, party: GuestParty) -> None:
        """Before the real lock: wait for this exit's turn (once per exit)."""
        if party.lock_start is None:
            self.clock.wait_turn(party)

    def taken(self, party: GuestParty) -> None:
        """The real lock is held: the exit holds the virtual one from when it is free."""
        if party.lock_start is not None:
            return
        start = max(party.v, self.free_at)
        if start > party.v:
            party.lock_waits += 1
            party.lock_wait_ns += start - party.v
        party.v = start
        party.lock_start = start

    def released(self, party: GuestParty) -> None:
        """The real lock is let go: free once the exit's priced work under it ends."""
        self.free_at = max(self.free_at, party.lock_start + round(party.locked))
        clock = self.clock
        if clock._turn_waiters:
            with clock._lock:
                clock._wake_turn()


class VirtualClock:
    """Device time from modelled progress (see the module docstring)."""

    virtual = True
    time_scale = 1.0  # device time per wall time has no meaning here; pacing code reads it

    def __init__(self, exit_ns: int = 0) -> None:
        if exit_ns < 0:
            raise ValueError(f"exit_ns must be >= 0, got {exit_ns}")
        self.exit_ns = int(exit_ns)  # a flat price every exit pays beside its events
        self._lock = threading.Lock()
        self._turn_waiters: dict[GuestParty, threading.Condition] = {}  # in wait_turn
        self._ranks = 0
        self._now = 0
        self._timers: list[TimerParty] = []
        self._guests: list[GuestParty] = []
        # at or below every timer's horizon (the earliest after `advance`; a timer whose
        # horizon comes earlier lowers it at once): a guest's fast path in tick and turn
        self._due: int | None = None
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
            party = GuestParty(self, name, max(self._now, at or 0), scope, self._ranks)
            self._ranks += 1
            self._generations.setdefault(scope, 0)
            self._guests.append(party)
        return party

    def bind_thread(self, party: GuestParty | None) -> None:
        """The calling thread is `party`'s vCPU: events it causes carry its time."""
        self._local.party = party
        if party is not None and party.thread is None:
            party.thread = threading.get_ident()

    def wait_turn(self, party: GuestParty) -> None:
        """Return once `party`'s current exit is the earliest ask for the mediator's lock
        that can still come: every other running vCPU could only ask later (or at the
        same time, having joined later), no GPU event (an unordered timer: an engine)
        is due at or before it, and no ordered timer (the scheduler) before it.  Lock
        asks are then granted in virtual-time order whatever order the threads reach
        them in (wall time: the others' vCPUs run on meanwhile)."""
        key = (party.v, party.rank)
        while True:
            with self._lock:
                if self._my_turn(party, key):
                    return
                turn = self._turn_waiters[party] = threading.Condition(self._lock)
                try:
                    turn.wait(WAKE_POLL_S)
                finally:
                    del self._turn_waiters[party]
            self.advance()  # a timer this vCPU waits for may have become due meanwhile

    def _wake_turn(self) -> None:
        """(lock held) Something moved on: wake the waiting vCPU whose ask is earliest,
        if it may go now (only it can be: the others wait for it too)."""
        if not self._turn_waiters:
            return
        first = min(self._turn_waiters, key=lambda g: (g.v, g.rank))
        if self._my_turn(first, (first.v, first.rank)):
            self._turn_waiters[first].notify()

    def _my_turn(self, party: GuestParty, key: tuple[int, int]) -> bool:
        """(lock held) See wait_turn.  Every exit that takes the mediator's lock asks
        this, so it is written for speed: a guest's horizon inline, and the timers looked
        at only when `_due` (at or below each timer's horizon) does not already show that
        none is at or before the ask."""
        v, rank = key
        for g in self._guests:
            if g is not party and not g.blocked:
                h = g.v if g.lock_start is None else g.v + round(g.pending)
                if h < v or h == v and g.rank < rank:
                    return False
        due = self._due
        if due is None or due > v:
            return True
        for t in self._timers:
            h = t.horizon()
            if h is not None and (h < v or (h == v and not t.ordered)):
                return False
        return True

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
            self._wake_turn()
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
            self._wake_turn()
        for waker in wakers:
            waker()
        return now
