"""A VM's vCPU on the virtual clock when the VM runs in a VMM process of its own.

The virtual clock (gpuvm/device/clock.py) lives in the mediator's process, where the
vGPUs are; a VM isolated in its own VMM process (gpuvm/run/isolated.py) reaches them over
vfio-user.  Its vCPU is then a `GuestParty` in the server's process, driven by two things:

- every REGION_READ/WRITE the connection receives is one exit of that vCPU: the server
  ticks the party before it hands the access to the device, which prices it as it does
  in-process (the trap, the lock, the PTEs scanned) -- the message the access already
  sends carries its time;
- what the VMM alone sees -- the guest starting, a port it answers itself (console,
  results, phase marks, waits, host-memory reports, exit), the start and end of a wait on
  the GPU, the guest's end -- travels as GPUVM_CLOCK ops (protocol.CLOCK_*), handled here
  by `ServedVcpu`; `RemoteVcpu` is the VMM's side, what its GuestSession calls where an
  in-process one calls its GuestParty.

The connection's serving thread is the vCPU's thread (a thread per connection: a vCPU
waits for its turn at the mediator's lock, which one thread serving every VM could not).
So lock asks, doorbells and prices happen on the same calls, in the same order and at the
same virtual times as for a vCPU thread in the mediator's process, and the rows are the
threaded shape's.
"""

from __future__ import annotations

import errno
from typing import Callable

from gpuvm.device.clock import GuestParty, TimerParty
from gpuvm.vfio.device import VfioError
from gpuvm.vfio.user import protocol as p


def _refused(why: str) -> VfioError:
    exc = VfioError(f"GPUVM_CLOCK: {why}")
    exc.errno = errno.EINVAL  # type: ignore[attr-defined]
    return exc


class ServedVcpu:
    """The server's side: one connection's vCPU (`party`) and the ops that drive it.

    Why a state of its own: the VMM is another process, trusted with nothing.  An op out
    of order (before START, after END, BLOCK outside a wait) is refused; an access made
    during a wait ends the wait first (the guest is running again); a VMM that hangs up
    retires its vCPU as an END would -- its vGPU is then removed at its last time and the
    other VMs go on."""

    def __init__(self, party: GuestParty) -> None:
        self.party = party
        self.started = False
        self.leaving: TimerParty | None = None  # set once it left the clock
        self._since: int | None = None  # while the guest waits: when the wait began

    @property
    def ended(self) -> bool:
        return self.leaving is not None

    def exit(self) -> None:
        """One exit that reached the server (an access): the vCPU's tick."""
        if self._since is not None:
            self._awake()
        self.party.tick()

    def handle(self, op: int, arg: int) -> p.ClockState:
        """Do `op` on the calling (serving) thread; the vCPU's state after it."""
        party = self.party
        if self.ended:
            raise _refused(f"{p.CLOCK_OPS.get(op, op)} after the guest ended")
        if op == p.CLOCK_START:
            if self.started:
                raise _refused("START sent twice")
            self.started = True
            party.bind()
            return self.state()
        if not self.started:
            raise _refused(f"{p.CLOCK_OPS.get(op, op)} before START")
        if op == p.CLOCK_EXIT:
            self.exit()
        elif op == p.CLOCK_NOW:
            pass
        elif op == p.CLOCK_SETTLE:
            party.settle()
        elif op == p.CLOCK_WAIT:
            if self._since is not None:
                raise _refused("WAIT inside a wait")
            self._since = party.wait_starts()
        elif op == p.CLOCK_BLOCK:
            if self._since is None:
                raise _refused("BLOCK outside a wait")
            party.block(arg)
        elif op == p.CLOCK_AWAKE:
            if self._since is None:
                raise _refused("AWAKE outside a wait")
            self._awake()
        elif op == p.CLOCK_END:
            self.retire()
        else:
            raise _refused(f"no op {op}")
        return self.state()

    def state(self) -> p.ClockState:
        party = self.party
        return p.ClockState(party.v, party.generation(), party.lock_waits,
                            party.lock_wait_ns)

    def _awake(self) -> None:
        party, since = self.party, self._since
        self._since = None
        party.unblock()
        party.wait_ends(since)

    def retire(self) -> None:
        """The guest ended (END) or its VMM went away: the vCPU leaves the clock, a timer
        holding device time at its last time until its vGPU is removed there."""
        if self.ended:
            return
        if self._since is not None:
            self._awake()
        if self.started:
            self.party.settle()
        self.leaving = self.party.retire()


class RemoteVcpu:
    """The VMM's side: the GuestParty calls a GuestSession makes, as GPUVM_CLOCK ops on
    `clock_op` (VfioUserDevice.clock_op).  The state each reply brings (time, signal
    generation, lock waits) is what the session then reads."""

    def __init__(self, clock_op: Callable[[int, int], p.ClockState]) -> None:
        self._op = clock_op
        self.state = p.ClockState()
        self.waker: Callable[[], None] | None = None  # the server wakes the VMM itself

    def _do(self, op: int, arg: int = 0) -> None:
        self.state = self._op(op, arg)

    def bind(self) -> None:
        self._do(p.CLOCK_START)

    def tick(self) -> None:
        """An exit: an access counts itself on the server; see unseen_exit."""

    def unseen_exit(self) -> None:
        self._do(p.CLOCK_EXIT)

    @property
    def v(self) -> int:
        self._do(p.CLOCK_NOW)
        return self.state.v

    @property
    def lock_waits(self) -> int:
        return self.state.lock_waits

    @property
    def lock_wait_ns(self) -> int:
        return self.state.lock_wait_ns

    def settle(self) -> None:
        self._do(p.CLOCK_SETTLE)

    def wait_starts(self) -> int:
        self._do(p.CLOCK_WAIT)
        return self.state.v

    def generation(self) -> int:
        """The generation the last reply brought: read on the server before this
        process looks at what it waits for, as GuestParty.generation is."""
        return self.state.generation

    def block(self, generation: int) -> None:
        self._do(p.CLOCK_BLOCK, generation)

    def unblock(self) -> None:
        self._do(p.CLOCK_AWAKE)

    def wait_ends(self, since: int) -> None:
        """(AWAKE ended the wait on the server)"""

    def retire(self) -> None:
        """The guest ended; the server keeps the timer that holds its last time."""
        self._do(p.CLOCK_END)
