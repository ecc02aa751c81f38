"""Whether the host can give a run's VMs the memory they take up front, checked before
any VM starts.

Why: guest RAM allocated as the VM is built (ram_alloc "immediate", the default) is
taken whole, VM after VM; `gpuvm run -b madd --mode native --vms 100` asked for 25 GiB
on a 24 GiB host, ran silently for 76 s and was killed by the kernel.  Refused instead,
in one line that names the numbers.  RAM allocated on demand is taken as guests touch it
(how much is not known before they run), and VRAM is backed only where touched
(gpuvm/device/vram.py), so neither is counted.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from gpuvm.device import regs

MEMINFO = Path("/proc/meminfo")


def available_bytes() -> int | None:
    """The host's MemAvailable (what it can give without swapping), or None where the
    kernel does not say."""
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def shortfall(up_front: Sequence[int], available: int | None,
              on_demand: str = "--ram-alloc ondemand") -> str | None:
    """Why VMs taking `up_front` bytes of RAM each cannot all be given them (one line),
    or None when they fit (or the host's memory is not known).  `on_demand` is how the
    user asks for RAM on demand where the check is made."""
    total = sum(up_front)
    if available is None or total <= available:
        return None
    sizes = sorted({s // regs.MiB for s in up_front})
    each = f"{sizes[0]:,} MiB" if len(sizes) == 1 else f"{sizes[0]:,}-{sizes[-1]:,} MiB"
    return (f"{len(up_front)} VMs would take {total // regs.MiB:,} MiB of guest RAM up "
            f"front ({each} each) but the host has {available // regs.MiB:,} MiB "
            f"available (MemAvailable); run fewer VMs, or allocate their RAM on demand "
            f"({on_demand})")
