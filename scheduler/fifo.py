"""FIFO: every VM goes to the tail after each completion; no budgets.

This is Gdev's and GPUvm's baseline.  It is fair in *turns*, not in GPU time: a VM with
30 ms kernels gets 30 ms per turn while a VM with 1 ms kernels gets 1 ms, so the
long-kernel VM takes most of the GPU ("FIFO does not respect isolation").
"""

from __future__ import annotations

from scheduler.decision import VmId
from scheduler.policy import Policy


class FifoPolicy(Policy):
    """FIFO, the baseline: fair in turns, not in GPU time, so a VM of long kernels takes most
    of the GPU."""

    name = "fifo"

    def _should_demote(self, vm: VmId, now: int) -> bool:
        return True
