"""What a policy answers when the engine is free: run a VM, wait until t, or idle.

`Wait` exists for BAND: before switching to a VM over its share it holds the engine
briefly so the VM that just finished can resubmit and keep its turn.  The driver must
ask again at `until` (or earlier, when new work arrives).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, TypeAlias

VmId: TypeAlias = Hashable


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Run the oldest queued submission of `vm` now."""

    vm: VmId


@dataclass(frozen=True, slots=True)
class Wait:
    """Leave the engine idle; ask again at `until` ns or when new work is ready."""

    until: int


@dataclass(frozen=True, slots=True)
class Idle:
    """Nothing is queued; ask again when new work is ready."""


IDLE = Idle()

Decision: TypeAlias = Dispatch | Wait | Idle
