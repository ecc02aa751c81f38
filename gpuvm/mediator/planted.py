"""Test-only: put back one fault the mediator has had, so a test can show that the
fuzzer (`gpuvm bench fuzz`, tests/test_fuzz_planted.py) still finds it.

Why: a fuzzer that reports nothing proves little unless it is seen to catch what it must.
Each fault below was fixed once; the fix now asks `planted(name)` at the one place it
was made and, only while the environment variable GPUVM_PLANT names that fault, behaves
as the code did before the fix.  No user path (CLI, experiment file, daemon) sets it;
it is read here alone.
"""

from __future__ import annotations

import os

SWITCH = "GPUVM_PLANT"

# name -> the fault, as it was before its fix
FAULTS: dict[str, str] = {
    "cached-context": "a channel's shadow RAMIN is rebuilt without a kick: the device "
                      "keeps the context it cached, walking a directory later freed",
    "free-bound-pgd": "HC_FREE_PGD frees a PV space a bound channel or BAR window still "
                      "uses",
    "unscrubbed-slice": "a VRAM slice is handed to the next VM holding what the last "
                        "one left in it",
    "shared-pcopy-next": "the copy engines' next-channel register passes through: one "
                         "register shared by every VM",
    "runlist-drop": "a channel unbound while any VM's runlist is rebuilt drops off the "
                    "physical runlist, and its rebind does not bring it back",
    "raw-bar0": "a BAR0 access the trap table does not handle (not 4 bytes, or a write "
                "to a register only read) reaches the device at the guest's raw offset",
}


def planted(name: str) -> bool:
    """Whether the test-only switch puts fault `name` back (a name not in FAULTS is a
    programming error)."""
    if name not in FAULTS:
        raise KeyError(f"no planted fault {name!r}")
    return os.environ.get(SWITCH) == name


def active() -> str | None:
    """The fault the switch names now, or None; ValueError for a name not in FAULTS."""
    name = os.environ.get(SWITCH) or None
    if name is not None and name not in FAULTS:
        raise ValueError(f"{SWITCH}={name!r}: not one of {', '.join(FAULTS)}")
    return name
