"""The virtualization modes a VM can run in, as sets of independent knobs."""

from __future__ import annotations

from dataclasses import dataclass

PV_BATCH = 512  # entries per multicall hypercall in `pv` (GPUvm used 128, later 2048)


@dataclass(frozen=True)
class Mode:
    """One virtualization mode as switches (mediated, remap, lazy, incremental, pv and
    its batch): the paper's configurations, so that every path asks a switch, never a
    mode's name."""
    name: str
    mediated: bool  # False: the guest drives the device directly (one VM)
    remap: bool = False  # non-sensitive BAR1/BAR3 pages mapped straight into the guest
    lazy: bool = False  # TLB flushes only mark shadows stale; resync at first use
    incremental: bool = False  # resync compares with the last sync instead of rescanning
    pv: bool = False  # the guest's PV build: page tables by hypercall, no scans
    pv_batch: int = 0  # entries per hypercall the guest may batch (1 = pv-naive)

    @property
    def guest_build(self) -> str:
        return "pv" if self.pv else "native"


MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("native", mediated=False),
    Mode("fv", mediated=True),
    Mode("fv+remap", mediated=True, remap=True),
    Mode("fv+lazy", mediated=True, lazy=True, incremental=True),
    Mode("fv-opt", mediated=True, remap=True, lazy=True, incremental=True),
    Mode("pv-naive", mediated=True, pv=True, pv_batch=1),
    Mode("pv", mediated=True, remap=True, pv=True, pv_batch=PV_BATCH),
)}


def mode(name: str) -> Mode:
    try:
        return MODES[name]
    except KeyError:
        raise ValueError(f"mode {name!r} is not one of {', '.join(MODES)}") from None
