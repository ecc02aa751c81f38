"""QUANTUM: exclusive use of the GPU for a time quantum, first come first served.

nvshare's scheduler (which lets several processes oversubscribe GPU memory) gives one
client a lock on the whole GPU for a time quantum (30 s by default) and hands it to the
next waiting client, in request order, when the quantum is over -- or earlier, when the
holder goes idle.  Co-located working sets then do not thrash: a VM's memory only has to
be resident while it holds the GPU, and it holds it long enough to amortise bringing it
in.  Fair-share policies (CREDIT, BAND) switch VMs every few milliseconds instead, which
is what an oversubscribed GPU cannot afford.

Here, as everywhere in this package, the GPU is non-preemptive: the quantum is checked
when a submission completes.  "Idle" means the holder has nothing queued for
`quantum_idle_ns` after its last completion while someone else waits (the same grace
BAND gives a VM with short, bursty kernels, so a doorbell gap does not lose the lock).
"""

from __future__ import annotations

from scheduler.decision import IDLE, Decision, Dispatch, VmId, Wait
from scheduler.params import SchedulerParams
from scheduler.policy import NO_VM, Policy


class QuantumPolicy(Policy):
    """QUANTUM (nvshare): one VM holds the GPU for a quantum, so oversubscribed memory is made
    resident once per turn instead of every few milliseconds."""

    name = "quantum"

    def __init__(self, params: SchedulerParams | None = None) -> None:
        super().__init__(params)
        self._holder: object = NO_VM  # the VM that holds the GPU
        self._since = 0  # when it got it
        self._last_done = 0  # its last completion
        self.handovers = 0  # times the GPU changed hands (the first grant included)

    def ready(self, vm: VmId, now: int, count: int = 1) -> None:
        """A VM with nothing queued asks anew: it joins the request queue at the tail."""
        asking = vm in self._pending and self._pending[vm] == 0 and vm != self._holder
        super().ready(vm, now, count)
        if asking:
            self._order.remove(vm)
            self._order.append(vm)

    def _on_remove(self, vm: VmId) -> None:
        if self._holder == vm:
            self._holder = NO_VM

    def _should_demote(self, vm: VmId, now: int) -> bool:
        return False  # the order is the FCFS request queue; _choose moves the holder

    def _after_charge(self, vm: VmId, now: int) -> None:
        self._last_done = now

    @property
    def holder(self) -> VmId | None:
        return None if self._holder is NO_VM else self._holder

    def _hand_over(self, now: int) -> Decision:
        """The holder lets go: it queues again behind everyone who asked meanwhile, and
        the first VM in request order with work gets the GPU."""
        if self._holder is not NO_VM:
            self._order.remove(self._holder)
            self._order.append(self._holder)
        vm = self._first_ready()
        if vm is NO_VM:
            return IDLE
        if vm != self._holder:
            self.handovers += 1
            if self._holder is not NO_VM:
                self.counters[self._holder].demotions += 1
        self._holder, self._since = vm, now
        return Dispatch(vm)

    def _choose(self, now: int) -> Decision:
        p = self.params
        holder = self._holder
        if holder is NO_VM:
            return self._hand_over(now)
        others = any(self._pending[vm] > 0 for vm in self._order if vm != holder)
        in_quantum = now - self._since < p.quantum_ns
        if self._pending[holder] > 0 and (in_quantum or not others):
            if not in_quantum:
                self._since = now  # nobody waits: a fresh quantum
            return Dispatch(holder)
        if not others:
            return IDLE  # keep the lock: nobody else wants the GPU
        if self._pending[holder] == 0 and in_quantum:
            idle_until = self._last_done + p.quantum_idle_ns
            if now < idle_until:
                self.counters[holder].yield_waits += 1
                return Wait(idle_until)
        return self._hand_over(now)
