"""Who holds the GPU's channels now, and what the scheduler may have done to a VM.

The scheduler (Submissions) ends a channel whose submission held the GPU too long and,
for an oversubscribed vGPU, has its pages made resident before its work is rung.  Both
act on the VM that owns a physical channel; they are asked of this object, which the
mediator keeps current, so the scheduler never calls back up into the mediator that
made it.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from contextlib import nullcontext
from typing import TYPE_CHECKING

from gpuvm.device import regs
from gpuvm.mediator.host_port import HostPort
from gpuvm.mediator.residency import Residency, WorkingSetTooLarge

if TYPE_CHECKING:
    from gpuvm.mediator.vgpu import VGpu


class Tenancy:
    """The mediator's vGPUs, which of them owns each physical channel, and the shared
    residency pool while oversubscribed vGPUs exist (kept current by the mediator).

    Why apart: the scheduler's verdicts (`kill`, `make_resident`) need exactly this --
    the owners, the mediator's lock and counters, the physical GPU's port -- and handed
    this, it holds nothing that owns it."""

    def __init__(self, lock: threading.RLock, host: HostPort, counts: defaultdict[str, int],
                 vgpus: list["VGpu"], owner: dict[int, "VGpu"]) -> None:
        self.lock = lock
        self.host = host
        self.counts = counts  # the mediator's own events
        self.vgpus = vgpus  # the mediator's, kept current by it
        self.owner = owner
        self.residency: Residency | None = None

    def kill(self, pchid: int, reason: str) -> None:
        """The watchdog's verdict on a submission (scheduler thread, no lock held)."""
        vgpu = self.owner.get(pchid)
        # the owner's lock before ours: one of its hypercalls may hold it
        with (vgpu.lock if vgpu is not None else nullcontext()), self.lock:
            self.counts["watchdog.kills"] += 1
            owner = self.owner.get(pchid)
            if owner is None:  # nobody owns it any more: the device must hold nothing for it
                self.host.wr(regs.PFIFO_CHAN_TABLE + pchid * regs.PFIFO_CHAN_STRIDE, 0)
            elif owner is vgpu:  # (a VM that took the channel since has nothing to lose)
                vgpu.channels.kill(pchid, reason)

    def needs_residency(self, vm: object) -> bool:
        """Whether a submission of this VM must wait for its pages (scheduler thread, no
        lock): only oversubscribed vGPUs do."""
        return getattr(vm, "tenant", None) is not None

    def make_resident(self, vm: "VGpu") -> bool:
        """Before the VM's submission is rung: its working set into the pool.  A working
        set that cannot fit faults that VM alone (its channels are ended with the reason);
        returns whether the submission may go."""
        with vm.lock, self.lock:
            if vm not in self.vgpus or self.residency is None:
                return False
            try:
                self.residency.make_resident(vm.tenant)
            except WorkingSetTooLarge as exc:
                self.counts["residency.refused"] += 1
                for ch in list(vm.channels.by_vchid.values()):
                    if ch.bound:
                        vm.channels.kill(ch.pchid, str(exc), "residency.refused")
                return False
            return True
