"""What the VMM learns from a guest's host-memory reports (PORT_HOSTMEM, issue 16).

In a real hypervisor, guest pages are pinned when a device DMA-maps them.  Here the VMM
maps all of guest RAM for the device once, at attach (gpuvm/vmm/vfio_attach.py), so the
per-transfer pinning a vendor driver or a GPU proxy does is modelled as the guest
runtime's requests to the VMM: before a chunk of pageable memory is copied the runtime
says "pin [gpa, gpa+len)", afterwards "unpin".  The tracker counts them per VM, prices
nothing (gpuvm/experiment/costs.py does), and keeps the whole history (allocations, pins,
transfers, with the VMM's clock) for the smart-pinning profile run.

Huge pages: with guest RAM on transparent huge pages (GuestRam backing "thp", checked
from smaps at the first report -- RAM the host did not give huge pages counts as 4 KiB),
two different things are counted.  `huge_splits` is what the kernel really did: the
guest RAM's huge-mapped kB (smaps) read before and after the VMM acts on a pin, the drop
in 2 MiB pages.  `huge_cuts` is arithmetic: the huge pages a device-written pin range
covers only partly -- what a kernel that splits compound pages on a partial pin (the
field report's gVisor case, blamed on pin_user_pages) would split.  Measured prices
charge the first (gpu-h200: the kernel split nothing while a GPU pinned and copied);
only the labelled scenario `hostmem-field-split` charges the second.  With
`nohugepage_pinned`, the VMM advises every range the guest pins MADV_NOHUGEPAGE (a real
madvise on guest RAM, which splits huge mappings the range cuts -- counted as splits)
and counts those ranges as 4 KiB-backed from that pin on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from gpuvm.device import regs
from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam

HUGE_PAGE = 2 * regs.MiB


@dataclass
class HostMemTracker:
    """What one guest's host-memory reports add up to: pins and allocations counted and kept as
    a history, priced later by the cost profile."""

    ram: GuestRam
    nohugepage_pinned: bool = False
    clock: Callable[[], int] = time.perf_counter_ns
    counters: dict[str, int] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)
    pinned_bytes: int = 0  # pinned now
    pinned_peak_bytes: int = 0
    # kB of guest RAM on huge pages (smaps) at the first report and when the guest ended
    huge_kib_first: int | None = None
    huge_kib_end: int | None = None
    _t0: int = 0
    _advised: np.ndarray = field(init=False, repr=False)  # per huge page: NOHUGEPAGE

    def __post_init__(self) -> None:
        self._t0 = self.clock()
        self._advised = np.zeros(-(-self.ram.size // HUGE_PAGE), dtype=bool)

    @property
    def thp(self) -> bool:
        """THP backing asked for and given: smaps showed huge pages at the first report."""
        return self.ram.backing == "thp" and bool(self.huge_kib_first)

    def _add(self, key: str, n: int = 1) -> None:
        self.counters[f"hostmem.{key}"] = self.counters.get(f"hostmem.{key}", 0) + n

    def huge_pages(self, gpa: int, length: int) -> tuple[int, int]:
        """(first, last) huge page index the range touches."""
        return gpa // HUGE_PAGE, (gpa + length - 1) // HUGE_PAGE

    def cuts(self, gpa: int, length: int) -> int:
        """Huge pages of THP memory (not advised away) that [gpa, gpa+length) covers only
        partly: arithmetic, not what the kernel did (see the module)."""
        if not self.thp or length <= 0:
            return 0
        first, last = self.huge_pages(gpa, length)
        cut = set()
        if gpa % HUGE_PAGE:
            cut.add(first)
        if (gpa + length) % HUGE_PAGE:
            cut.add(last)
        return sum(1 for page in cut if not self._advised[page])

    def thp_bytes(self, gpa: int, length: int) -> int:
        """Bytes of the range on huge pages (THP backing, not advised NOHUGEPAGE)."""
        if not self.thp or length <= 0:
            return 0
        first, last = self.huge_pages(gpa, length)
        lo, hi = gpa, gpa + length
        total = 0
        for page in np.flatnonzero(~self._advised[first:last + 1]) + first:
            start, end = int(page) * HUGE_PAGE, (int(page) + 1) * HUGE_PAGE
            total += min(hi, end) - max(lo, start)
        return total

    def handle(self, ev: abi.HostmemEvent) -> None:
        """One report from the guest runtime."""
        op, arg, alloc, gpa, length = (int(ev.op), int(ev.arg), int(ev.alloc), int(ev.gpa),
                                       int(ev.bytes))
        if op not in abi.HM_OPS:
            raise ValueError(f"host-memory report with unknown op {op}")
        self.ram.check(gpa, length)
        if self.huge_kib_first is None:
            self.huge_kib_first = self.ram.huge_kib()
        record: dict[str, Any] = {"t_ns": self.clock() - self._t0, "op": abi.HM_OPS[op],
                                  "alloc": alloc, "gpa": gpa, "bytes": length}
        if op in (abi.HM_HTOD, abi.HM_DTOH):
            if arg >= len(abi.HM_HOW_NAMES):
                raise ValueError(f"host-memory transfer with unknown kind {arg}")
            how = abi.HM_HOW_NAMES[arg]
            record["how"] = how
            direction = "htod" if op == abi.HM_HTOD else "dtoh"
            self._add(f"xfer.{direction}.{how}.bytes", length)
            self._add(f"xfer.{direction}.{how}.calls")
        elif op in (abi.HM_ALLOC, abi.HM_FREE):
            record["pinned"] = bool(arg)
            self._add("allocs" if op == abi.HM_ALLOC else "frees")
        else:
            record["write"] = bool(arg)
            if op == abi.HM_PIN:
                self._pin(gpa, length, bool(arg))
            else:
                self._unpin(gpa, length)
        self.events.append(record)

    def _pin(self, gpa: int, length: int, write: bool) -> None:
        before = self.ram.huge_kib() if self.thp else 0
        if self.nohugepage_pinned and self.thp and length:
            self.ram.advise_nohugepage(gpa, length)
            first, last = self.huge_pages(gpa, length)
            self._advised[first:last + 1] = True
        if self.thp:
            self._add("huge_splits", max(0, before - self.ram.huge_kib()) // (HUGE_PAGE >> 10))
        if write:  # after the advice: pages advised 4 KiB are not cut (the report's cure)
            self._add("huge_cuts", self.cuts(gpa, length))
        huge = self.thp_bytes(gpa, length)
        self._add("pins")
        self._add("pin_bytes", length)
        self._add("pin_bytes_thp", huge)
        self._add("pin_bytes_4k", length - huge)
        self.pinned_bytes += length
        self.pinned_peak_bytes = max(self.pinned_peak_bytes, self.pinned_bytes)

    def _unpin(self, gpa: int, length: int) -> None:
        huge = self.thp_bytes(gpa, length)
        self._add("unpins")
        self._add("unpin_bytes", length)
        self._add("unpin_bytes_thp", huge)
        self._add("unpin_bytes_4k", length - huge)
        self.pinned_bytes -= length

    def finish(self) -> None:
        """The guest has ended (its RAM is still mapped): read the huge pages once more."""
        if self.events:
            self.huge_kib_end = self.ram.huge_kib()

    def transfers_per_alloc(self) -> dict[int, int]:
        """memcpy calls per allocation id (0 = memory the runtime did not allocate)."""
        out: dict[int, int] = {}
        for e in self.events:
            if e["op"] in ("htod", "dtoh"):
                out[e["alloc"]] = out.get(e["alloc"], 0) + 1
        return out

    def summary(self) -> dict[str, Any]:
        """What an experiment row keeps (the history itself goes to its own file)."""
        return {"backing": self.ram.backing, "anonymous": self.ram.anonymous,
                "nohugepage_pinned": self.nohugepage_pinned,
                "huge_kib_first": self.huge_kib_first, "huge_kib_end": self.huge_kib_end, "pinned_peak_bytes": self.pinned_peak_bytes,
                "events": len(self.events),
                "transfers_per_alloc": {str(k): v for k, v in
                                        sorted(self.transfers_per_alloc().items())}}

    def history(self) -> dict[str, Any]:
        """The transfer history, JSON-ready: every event with the VMM's clock (ns since
        the VM started)."""
        return {"backing": self.ram.backing, "events": list(self.events)}


def hot_mask(transfers: dict[int, int], threshold: int) -> int:
    """Bit id-1 set for every allocation transferred more than `threshold` times."""
    mask = 0
    for alloc, count in transfers.items():
        if 1 <= alloc <= 64 and count > threshold:
            mask |= 1 << (alloc - 1)
    return mask
