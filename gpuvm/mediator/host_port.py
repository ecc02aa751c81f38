"""What a vGPU's parts may do to the physical GPU, passed in rather than reached through.

Channels, Shadowing and Hypercalls are handed this port (the mediator implements it) and
the VRAM they touch; none of them walks from its vGPU to the mediator to the device.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, MutableMapping, Protocol, TypeVar

from gpuvm.device.write_log import EngineWriteLog

T = TypeVar("T")


class HostPort(Protocol):
    lock: threading.RLock  # the mediator's: held while physical state changes
    bar1_pd: int  # the physical BAR1 VM's directory (flushed after a window sync)
    bar1_pt: int  # ... and its page table (a vGPU's arena is a window into it)
    bar3_pd: int
    bar3_pt: int
    engine_writes: EngineWriteLog  # the device's log of VRAM pages its engines wrote

    def rd(self, offset: int) -> int:
        """A physical BAR0 register read."""
        ...

    def wr(self, offset: int, value: int) -> None:
        """A physical BAR0 register write."""
        ...

    def kick(self, pchid: int) -> None: ...

    def flush(self, pd: int, bar_vm: bool = False) -> None: ...

    def set_poll_page(self, pchid: int, userd: int | None) -> None: ...

    def rebuild_runlist(self) -> None: ...

    def submit(self, vm: object, pchid: int, put: int) -> None:
        """A doorbell, to the scheduler."""
        ...

    def channel_reset(self, pchid: int) -> None:
        """A (re)bound channel starts at GP_GET 0."""
        ...


# a VM's counters of its waits for the mediator's lock (gpuvm run --detail shows them;
# traces carry them per event)
MEDIATOR_LOCK_WAITS = "mediator_lock.waits"
MEDIATOR_LOCK_WAIT_NS = "mediator_lock.wait_ns"
# counts that follow how the run's threads took turns, not the VM's work: every other
# count is the same on every rerun, and a VM alone never waits
WALL_CLOCK_COUNTERS = frozenset({MEDIATOR_LOCK_WAITS, MEDIATOR_LOCK_WAIT_NS})


def work_counters(counters: dict[str, int]) -> dict[str, int]:
    """`counters` less WALL_CLOCK_COUNTERS: what a rerun counts alike."""
    return {k: v for k, v in counters.items() if k not in WALL_CLOCK_COUNTERS}


def under_mediator_lock(lock: threading.RLock, counts: MutableMapping[str, int],
                        work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` holding the mediator's lock, taken on a VM's behalf: each time
    another held it, the VM's `counts` count the wait and how long this thread waited.
    Why: every trapped access that changes the mediator's state, and every hypercall
    that reaches the physical GPU (a flush, a free), runs under this one lock, across
    the interpreter lock's releases inside -- when every hypercall did, two pv VMs on a
    lent 16-core machine each waited 8-13 ms of a 60-70 ms run for it, on this 2-core
    host 1.5-5 ms (docs/model-validation.md, 2026-11-29) -- and only the VM's own thread
    sees that wait.  A lock taken at once costs one try and no clock read, so the trap
    path pays nothing for the count where nobody contends."""
    if not lock.acquire(False):
        asked = time.perf_counter_ns()
        lock.acquire()
        counts[MEDIATOR_LOCK_WAITS] += 1
        counts[MEDIATOR_LOCK_WAIT_NS] += time.perf_counter_ns() - asked
    try:
        return work(*args)
    finally:
        lock.release()
