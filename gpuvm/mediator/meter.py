"""A vGPU's accounting: what its events count, what they cost its vCPU in virtual time,
and its holds of the mediator's lock.

Every part of a vGPU (channels, shadowing, hypercalls, the trap table) counts events and
some of them work under the mediator's lock on the VM's behalf.  They are handed this
meter, not the vGPU, so none of them calls back up to the vGPU to count or to lock.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict

from gpuvm.device.clock import FREE, EventPrices, GuestParty, VirtualLock
from gpuvm.mediator.host_port import MEDIATOR_LOCK_WAIT_NS, MEDIATOR_LOCK_WAITS


class VmMeter:
    """One VM's counters and, on a virtual clock, its vCPU's virtual time (`use`).

    Why one object: a count and its price are one event -- counted here, it is charged
    here (at `prices`, to `party`), so no part can count an event and forget its price.
    `trap_hold` and `hold` take the mediator's lock on this VM's behalf (see
    MediatorHold)."""

    def __init__(self, mediator_lock: threading.RLock) -> None:
        self.counts: defaultdict[str, int] = defaultdict(int)
        self.mediator_lock = mediator_lock
        # virtual time: the VM's vCPU to charge each event to, at these prices, and the
        # mediator's lock in virtual time (None: a wall-clock run)
        self.party: GuestParty | None = None
        self.prices: EventPrices = FREE
        self.vlock: VirtualLock | None = None
        self.trap_hold = MediatorHold(self, trap=True)
        self.hold = MediatorHold(self, trap=False)

    def use(self, party: GuestParty, prices: EventPrices, vlock: VirtualLock | None) -> None:
        """Charge this VM's events to `party`'s virtual time at `prices`, and take the
        mediator's lock in virtual time (`vlock`, the mediator's) as well as for real."""
        self.party, self.prices, self.vlock = party, prices, vlock

    def count(self, name: str, n: int) -> None:
        self.counts[name] += n
        if self.party is not None:
            price = self.prices.counter_ns.get(name)
            if price:
                self.party.charge(price * n, name in self.prices.locked)

    def doorbell_ledger(self) -> list | None:
        """A doorbell is rung: its entry in the vCPU's event stream (filled in with the
        engine time it takes), or None off a virtual clock."""
        return None if self.party is None else self.party.stream.doorbell()


class MediatorHold:
    """`with meter.trap_hold:` -- the mediator's lock, held on one VM's behalf: for real,
    and on a virtual clock also in virtual time, the VM charged the mediator's priced
    work under it (a trap's `exit_locked_ns`; `hold` charges nothing beyond what the
    work counts).  A context, not a wrapper taking the work as a callback, so the work
    is called by whoever owns the decision and the lock adds no hop to the trap path.

    Off a virtual clock a wait for the lock is counted (MEDIATOR_LOCK_WAITS): every
    trapped access that changes the mediator's state, and every hypercall that reaches
    the physical GPU, runs under this one lock, and only the VM's own thread sees that
    wait.  A lock taken at once costs one try and no clock read."""

    __slots__ = ("meter", "trap")

    def __init__(self, meter: VmMeter, trap: bool) -> None:
        self.meter = meter
        self.trap = trap

    def __enter__(self) -> None:
        m = self.meter
        party, lock = m.party, m.mediator_lock
        if party is None:
            if not lock.acquire(False):
                asked = time.perf_counter_ns()
                lock.acquire()
                m.counts[MEDIATOR_LOCK_WAITS] += 1
                m.counts[MEDIATOR_LOCK_WAIT_NS] += time.perf_counter_ns() - asked
            return
        m.vlock.ask(party)
        lock.acquire()
        try:
            m.vlock.taken(party)
            party.hold(m.prices.exit_locked_ns if self.trap else 0)
        except BaseException:
            lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        m = self.meter
        if m.party is not None:
            m.vlock.released(m.party)
        m.mediator_lock.release()
