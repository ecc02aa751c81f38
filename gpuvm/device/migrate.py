"""Page migration on a copy engine, for the GPU's own driver (the mediator).

Moving a tenant's pages between VRAM and host memory is work of the physical GPU's copy
engine, as a kernel driver would submit it on a channel of its own: the bytes really
move, and the engine is occupied for the time the device profile gives a copy of that
many bytes over PCIe (one launch per contiguous run).  The caller waits until the device
clock has passed the end of the work, so the switch costs device time like any copy.

These copies are not entered in the engine write log (device/write_log.py): that log
tells incremental shadows which guest entries changed, and a migration changes none --
the guest's bytes are the same in the frame and in the backing store, and the shadow
entries a move does affect are rewritten by the mediator itself (shadow.frames.repoint).
Logging them would only make the next resync of every moved table compare it again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Sequence

import numpy as np

if TYPE_CHECKING:
    from gpuvm.device.gpu import Gpu

HOST_INST = -1  # the engine's current_inst while it works for the driver (no channel)


def copy_runs(gpu: "Gpu", runs: Sequence[tuple[np.ndarray, np.ndarray]]) -> int:
    """Copy each (source, destination) pair of equal-sized uint8 views on copy engine 1,
    one launch per pair; returns the device time the engine was occupied (ns), after
    waiting for it to pass."""
    if not runs:
        return 0
    profile = gpu.profile.copy
    engine = gpu.engines.copy1
    with gpu.lock:
        now = gpu.clock.now_ns()
        start = max(now, engine.busy_until)
        nbytes = 0
        for src, dst in runs:
            dst[:] = src
            nbytes += src.size
        duration = len(runs) * profile.launch_ns + int(1e9 * nbytes / profile.pcie_bytes_per_s)
        done = engine.occupy(now, duration, HOST_INST)
    wait = gpu.clock.wall_seconds_until(done)
    if wait > 0:
        time.sleep(wait)
    return done - start
