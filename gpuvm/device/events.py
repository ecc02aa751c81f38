"""What the device's blocks tell the rest of the device: work to look at, news for guests.

Handed to each register block and to PFIFO instead of the whole `Gpu`, so a block knows
only how to wake the engine thread and how to say that a channel's work completed or
faulted -- and no block imports the module that composes them all.
"""

from __future__ import annotations

import threading

from gpuvm.device.clock import NullParty, TimerParty


class DeviceEvents:
    """The engine thread's wake-up and the signals guests wait on (all under the device
    lock).  The Gpu's engine loop drains `signalled` after each service pass."""

    def __init__(self, work: threading.Condition, party: NullParty | TimerParty) -> None:
        self._work = work
        self._party = party
        # whose work the signals since the last notice came from (channel ids; empty:
        # none came), or None once one came from no channel in particular: listeners
        # then tell everyone
        self.signalled: set[int] | None = set()

    def kick_engines(self) -> None:
        """Something may be runnable now (called with the lock held)."""
        self._party.hold_now()  # a virtual clock waits until the engines looked
        self._work.notify()

    def signal(self, chid: int | None = None) -> None:
        """GPU work completed or faulted -- on channel `chid` (None: on none in
        particular): wake guests waiting on memory (lock held).  Saying the channel lets
        a mediator interrupt only the VM that owns it, as a real vGPU raises only its
        own interrupts; told nothing, it interrupts every VM."""
        if chid is None:
            self.signalled = None
        elif self.signalled is not None:
            self.signalled.add(chid)
