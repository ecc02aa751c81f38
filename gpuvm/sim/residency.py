"""VRAM oversubscription in the model: whose pages are on the GPU, and what it costs to
change that when the engine switches VMs.

Each VM has a VRAM working set (bytes) and the GPU a physical VRAM size.  When the
engine is about to run a submission of a VM whose working set is not all resident, the
mediator first makes it resident: it evicts other VMs' pages (least recently run VM
first) to their host backing stores and brings this VM's evicted pages back, on the copy
engine, and rewrites the shadow PTEs of every page it moved.  Pages a VM has never had
evicted need no copy (they are allocated where there is room).  The switch holds the
engine, so nothing else runs meanwhile; its price is

    switch_ns + pages moved x page_ns + bytes moved x byte_ns

with the three prices from the cost profile (`residency_*` keys, costs.py).  A fair-share
policy that alternates VMs every few milliseconds pays a switch at nearly every
dispatch; an exclusive time quantum pays one per quantum.

The counters carry the emulator's names (mediator residency switching), per VM:
pages moved in for it, pages of it moved out, the bytes of both, the switches made for
it and their time.  Everything is integer pages and ns, so a replay stays deterministic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gpuvm.device import regs
from gpuvm.experiment.costs import CostProfile

COUNTER_NAMES = ("residency_pages_in", "residency_pages_out", "residency_bytes",
                 "residency_switches", "residency_switch_ns")


class ResidencyError(ValueError):
    """A VM whose working set alone is larger than the GPU's VRAM; one line."""


@dataclass(frozen=True)
class ResidencyCosts:
    """The price of a switch: a fixed part (TLB flush, bookkeeping), the mediator's work
    per page moved (rewriting its shadow PTE, updating its frame table) and the copy
    engine's time per byte moved between VRAM and host memory."""

    switch_ns: float = 0.0
    page_ns: float = 0.0
    byte_ns: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not value >= 0:
                raise ValueError(f"residency {name}: must be >= 0, got {value!r}")

    def price_ns(self, pages: int, nbytes: int) -> int:
        return int(round(self.switch_ns + pages * self.page_ns + nbytes * self.byte_ns))


@dataclass
class ResidencyCounters:
    """The residency model's counts, named as the mediator's counters are, so model and
    emulator rows compare."""

    residency_pages_in: int = 0
    residency_pages_out: int = 0
    residency_bytes: int = 0
    residency_switches: int = 0
    residency_switch_ns: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class ResidencyModel:
    """Resident and evicted pages of every VM on one GPU (see the module docstring)."""

    def __init__(self, vram_bytes: int, costs: ResidencyCosts,
                 page_bytes: int = regs.SMALL_PAGE) -> None:
        if page_bytes < 1:
            raise ValueError(f"page_bytes: must be >= 1, got {page_bytes}")
        if vram_bytes < page_bytes:
            raise ValueError(f"vram_bytes: must hold at least one page, got {vram_bytes}")
        self.page_bytes = page_bytes
        self.frames = vram_bytes // page_bytes  # physical pages VMs can use
        self.costs = costs
        self._working: dict[object, int] = {}  # working set, pages
        self._resident: dict[object, int] = {}  # of it on the GPU now
        self._evicted: dict[object, int] = {}  # of it in the host backing store
        self._last_run: dict[object, int] = {}  # switch sequence number, for LRU
        self._seq = 0
        self.counters: dict[object, ResidencyCounters] = {}

    def pages(self, nbytes: int) -> int:
        return -(-nbytes // self.page_bytes)

    def check(self, vm: object, working_set_bytes: int) -> int:
        """The working set in pages; ResidencyError when it alone cannot be resident."""
        pages = self.pages(max(0, working_set_bytes))
        if pages > self.frames:
            raise ResidencyError(
                f"{vm}: working set of {working_set_bytes / regs.MiB:,.1f} MiB exceeds the "
                f"GPU's {self.frames * self.page_bytes / regs.MiB:,.1f} MiB of VRAM")
        return pages

    def add_vm(self, vm: object, working_set_bytes: int) -> None:
        if vm in self._working:
            raise ValueError(f"vm {vm!r}: already added")
        self._working[vm] = self.check(vm, working_set_bytes)
        self._resident[vm] = self._evicted[vm] = self._last_run[vm] = 0
        self.counters[vm] = ResidencyCounters()

    def remove_vm(self, vm: object) -> None:
        """The VM has ended: its frames and its backing store are freed (its counters
        stay)."""
        for table in (self._working, self._resident, self._evicted, self._last_run):
            table.pop(vm, None)

    @property
    def free_frames(self) -> int:
        return self.frames - sum(self._resident.values())

    def resident_pages(self, vm: object) -> int:
        return self._resident[vm]

    def make_resident(self, vm: object) -> int:
        """Bring `vm`'s whole working set onto the GPU; returns the switch's ns (0 when
        it already was, or when only never-evicted pages had to be placed in free
        frames)."""
        self._seq += 1
        self._last_run[vm] = self._seq
        missing = self._working[vm] - self._resident[vm]
        if missing == 0:
            return 0
        moved_out = 0
        for victim in sorted((v for v in self._resident if v != vm and self._resident[v]),
                             key=lambda v: self._last_run[v]):
            short = missing - self.free_frames
            if short <= 0:
                break
            take = min(short, self._resident[victim])
            self._resident[victim] -= take
            self._evicted[victim] += take
            c = self.counters[victim]
            c.residency_pages_out += take
            c.residency_bytes += take * self.page_bytes
            moved_out += take
        copy_in = self._evicted[vm]
        self._evicted[vm] = 0
        self._resident[vm] = self._working[vm]
        moved = moved_out + copy_in
        if moved == 0:
            return 0
        ns = self.costs.price_ns(moved, moved * self.page_bytes)
        c = self.counters[vm]
        c.residency_pages_in += copy_in
        c.residency_bytes += copy_in * self.page_bytes
        c.residency_switches += 1
        c.residency_switch_ns += ns
        return ns


def residency_for(profile: CostProfile, vram_bytes: int,
                  page_bytes: int = regs.SMALL_PAGE) -> ResidencyModel:
    """A GPU of `vram_bytes` whose switches are priced by a cost profile's residency_*
    keys (experiments/costs/*.toml)."""
    return ResidencyModel(vram_bytes, ResidencyCosts(profile.residency_switch_ns,
                                                     profile.residency_page_ns,
                                                     profile.residency_byte_ns), page_bytes)
