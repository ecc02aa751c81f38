"""What a vGPU's parts may do to the physical GPU, passed in rather than reached through.

Channels, Shadowing and Hypercalls are handed this port (the mediator implements it) and
the VRAM they touch; none of them walks from its vGPU to the mediator to the device.
"""

from __future__ import annotations

import threading
from typing import Protocol

from gpuvm.device.write_log import EngineWriteLog


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
