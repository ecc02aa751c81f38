"""Where gpuvm keeps what outlives one command: the defined vGPUs (gpuvm.mdevctl), the
vfio-user sockets of `gpuvm serve`, and the status files of running `gpuvm run`s that
`gpuvm smi` reads.  $GPUVM_STATE_DIR, else $XDG_STATE_HOME/gpuvm (~/.local/state/gpuvm).

A module of its own that imports nothing of gpuvm, so `gpuvm smi` finds the status files
without loading the run machinery that writes them.
"""

from __future__ import annotations

import os
from pathlib import Path

STATUS_SUBDIR = "runs"  # under the state dir: one <pid>-<n>.json per running `gpuvm run`


def state_dir() -> Path:
    if "GPUVM_STATE_DIR" in os.environ:
        return Path(os.environ["GPUVM_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "gpuvm"


def status_dir(state: Path | None = None) -> Path:
    """The directory of the running runs' status files (gpuvm/run/observe.py writes them)."""
    return (state or state_dir()) / STATUS_SUBDIR
