"""BAR memslots: host memory mapped straight into a guest's BAR window ("BAR remap").

A page backed by a memslot is accessed by the guest at native speed (no exit); a page
without one exits as MMIO and is trapped.  The mediator maps slices of the GPU's VRAM
mmap here where it is safe and unmaps pages that must trap again.

Ranges that are contiguous in both guest-physical and host address (and have the same
read-only flag) share one KVM slot, so mapping a BAR page by page costs one slot, not one
per page; unmapping part of a slot splits it.  KVM cannot resize a slot, so merging or
splitting deletes the old slot(s) first and then adds the new one(s): during that short
window the affected pages trap, which is correct (the trapped path reaches the same
memory), only slower.  If the kernel refuses an add, the range stays unmapped (trapping)
and the table says so -- never mapped to the wrong place.

The table can be filled before the VM exists; `bind` applies it.  All methods take a lock
and may be called from any thread while the vCPU runs (KVM_SET_USER_MEMORY_REGION is
allowed concurrently with KVM_RUN).
"""

from __future__ import annotations

import bisect
import heapq
import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from gpuvm.vmm.kvm import kvm_api as api

PAGE = 0x1000


class MemslotError(Exception):
    """A bad map/unmap request, or KVM refused a slot change (one line)."""


class SlotSink(Protocol):
    """What the table needs of a VM (KvmVm implements it)."""

    max_memslots: int
    readonly_mem: bool

    def set_memory_region(self, slot: int, gpa: int, size: int, host_address: int,
                          flags: int = 0) -> None: ...


class PostingSink(SlotSink, Protocol):
    """A VM whose MMIO stores to a zone may queue for its next exit (KvmVm: KVM's
    coalesced ring)."""

    def coalesce(self, gpa: int, size: int) -> None: ...

    def uncoalesce(self, gpa: int, size: int) -> None: ...


@dataclass(frozen=True)
class Mapping:
    """One KVM slot: guest-physical [gpa, gpa+size) backed by host [host_address, ...)."""

    gpa: int
    size: int
    host_address: int
    readonly: bool
    slot: int

    @property
    def end(self) -> int:
        return self.gpa + self.size

    def host_at(self, gpa: int) -> int:
        return self.host_address + (gpa - self.gpa)


class MemslotTable:
    """The BAR memslots of one VM (slot numbers from `first_slot`; slot 0 is guest RAM)."""

    def __init__(self, first_slot: int = 1,
                 reserved: tuple[tuple[int, int], ...] = ()) -> None:
        self._lock = threading.Lock()
        self._reserved = reserved  # (gpa, size) ranges owned by someone else (RAM)
        self._maps: list[Mapping] = []  # sorted by gpa, non-overlapping
        self._starts: list[int] = []  # gpa of each entry of _maps, for bisect
        self._free: list[int] = []  # released slot numbers (min-heap)
        self._next_slot = first_slot
        self._vm: SlotSink | None = None
        # Set by a device whose mapped pages stand for accesses the model counts (a
        # passed-through GPU's apertures): told (bar, reads, writes) of those the guest
        # made without an exit; the runner then counts them from the guest's own counts.
        self.direct_counter: Callable[[int, int, int], None] | None = None
        # whether the runner counts such accesses (the KVM runner does; until it says
        # so, such a device maps nothing and every access exits)
        self.accepts_direct = False
        # whether a device maps pages here as it judges (BAR remap), set when one is
        # connected: its decisions follow the guest's trapped accesses
        self.device_maps = False
        # zones a device says may queue their stores (`post`), and whether the runner
        # queues them (the KVM runner, where its coalesced ring is on)
        self._posted: set[tuple[int, int]] = set()
        self.accepts_posting = False

    # ---------------------------------------------------------------- binding
    def bind(self, vm: SlotSink) -> None:
        """Attach to a created VM and register every mapping made so far."""
        with self._lock:
            self._vm = vm
            if any(m.readonly for m in self._maps) and not vm.readonly_mem:
                raise MemslotError("read-only memslots requested but KVM lacks "
                                   "KVM_CAP_READONLY_MEM")
            for m in list(self._maps):
                self._add_to_kernel(m)
            if self.accepts_posting:
                for gpa, size in sorted(self._posted):
                    self._posting_vm().coalesce(gpa, size)

    def unbind(self) -> None:
        """Detach before the VM fd closes; later calls only update the table."""
        with self._lock:
            self._vm = None

    def post(self, gpa: int, size: int, allowed: bool) -> None:
        """A device says its stores to [gpa, gpa+size) may wait, in order, for the guest's
        next exit (allowed) -- they take effect only at a later trapped access -- or
        from now on must each exit.  Called on the trap path of the access that changes
        it, before the guest goes on, so the guest's next store already sees the zone."""
        _check_range(gpa, size)
        with self._lock:
            if allowed == ((gpa, size) in self._posted):
                return
            if allowed:
                self._posted.add((gpa, size))
            else:
                self._posted.discard((gpa, size))
            if self._vm is not None and self.accepts_posting:
                vm = self._posting_vm()
                (vm.coalesce if allowed else vm.uncoalesce)(gpa, size)

    def _posting_vm(self) -> PostingSink:
        vm = self._vm
        assert vm is not None and hasattr(vm, "coalesce"), "accepts_posting without a ring"
        return vm  # type: ignore[return-value]

    # ---------------------------------------------------------------- queries
    @property
    def slots_in_use(self) -> int:
        """KVM slots held for BAR mappings (guest RAM's slot not included)."""
        with self._lock:
            return len(self._maps)

    def mappings(self) -> list[Mapping]:
        with self._lock:
            return list(self._maps)

    def lookup(self, gpa: int) -> Mapping | None:
        """The mapping that backs guest-physical `gpa`, if any."""
        with self._lock:
            i = bisect.bisect_right(self._starts, gpa) - 1
            if i >= 0 and gpa < self._maps[i].end:
                return self._maps[i]
            return None

    # ---------------------------------------------------------------- changes
    def map(self, gpa: int, host_address: int, size: int, readonly: bool = False,
            replace: bool = False) -> None:
        """Back guest-physical [gpa, gpa+size) with host memory at `host_address`.

        The host memory must stay mapped while the slot exists.  With `replace`, pages
        already mapped in the range are unmapped first; without it they are an error."""
        _check_range(gpa, size)
        if host_address % PAGE:
            raise MemslotError(f"host address {host_address:#x} is not page aligned")
        for rgpa, rsize in self._reserved:
            if gpa < rgpa + rsize and rgpa < gpa + size:
                raise MemslotError(f"range {gpa:#x}+{size:#x} overlaps reserved guest "
                                   f"memory {rgpa:#x}+{rsize:#x}")
        with self._lock:
            if readonly and self._vm is not None and not self._vm.readonly_mem:
                raise MemslotError("read-only memslot requested but KVM lacks "
                                   "KVM_CAP_READONLY_MEM")
            overlapping = self._overlapping(gpa, gpa + size)
            if overlapping and not replace:
                m = overlapping[0]
                raise MemslotError(f"range {gpa:#x}+{size:#x} overlaps mapped "
                                   f"{m.gpa:#x}+{m.size:#x}")
            if overlapping:
                self._unmap_locked(gpa, size)
            start, end, host = gpa, gpa + size, host_address
            i = bisect.bisect_left(self._starts, gpa)
            left = self._maps[i - 1] if i > 0 else None
            right = self._maps[i] if i < len(self._maps) else None
            merged: list[Mapping] = []
            if left is not None and left.end == gpa and left.readonly == readonly \
                    and left.host_at(gpa) == host_address:
                start, host = left.gpa, left.host_address
                merged.append(left)
            if right is not None and right.gpa == end and right.readonly == readonly \
                    and right.host_address == host_address + size:
                end = right.end
                merged.append(right)
            for m in merged:
                self._remove(m)
            self._insert(start, end - start, host, readonly)

    def unmap(self, gpa: int, size: int) -> None:
        """Make guest-physical [gpa, gpa+size) trap again (unmapped parts are ignored)."""
        _check_range(gpa, size)
        with self._lock:
            self._unmap_locked(gpa, size)

    def unmap_all(self) -> None:
        with self._lock:
            for m in list(self._maps):
                self._remove(m)

    # ---------------------------------------------------------------- internals
    def _unmap_locked(self, gpa: int, size: int) -> None:
        end = gpa + size
        for m in self._overlapping(gpa, end):
            self._remove(m)
            if m.gpa < gpa:
                self._insert(m.gpa, gpa - m.gpa, m.host_address, m.readonly)
            if m.end > end:
                self._insert(end, m.end - end, m.host_at(end), m.readonly)

    def _overlapping(self, start: int, end: int) -> list[Mapping]:
        i = max(bisect.bisect_right(self._starts, start) - 1, 0)
        out = []
        while i < len(self._maps) and self._maps[i].gpa < end:
            if self._maps[i].end > start:
                out.append(self._maps[i])
            i += 1
        return out

    def _alloc_slot(self) -> int:
        if self._free:
            return heapq.heappop(self._free)
        limit = self._vm.max_memslots if self._vm is not None else None
        if limit is not None and self._next_slot >= limit:
            raise MemslotError(f"out of KVM memslots ({limit})")
        self._next_slot += 1
        return self._next_slot - 1

    def _insert(self, gpa: int, size: int, host: int, readonly: bool) -> None:
        m = Mapping(gpa, size, host, readonly, self._alloc_slot())
        i = bisect.bisect_left(self._starts, gpa)
        self._maps.insert(i, m)
        self._starts.insert(i, gpa)
        if self._vm is not None:
            self._add_to_kernel(m)

    def _add_to_kernel(self, m: Mapping) -> None:
        assert self._vm is not None
        try:
            self._vm.set_memory_region(m.slot, m.gpa, m.size, m.host_address,
                                       api.KVM_MEM_READONLY if m.readonly else 0)
        except Exception as exc:
            self._forget(m)
            raise MemslotError(f"mapping {m.gpa:#x}+{m.size:#x} failed: {exc}") from exc

    def _remove(self, m: Mapping) -> None:
        if self._vm is not None:
            try:
                self._vm.set_memory_region(m.slot, m.gpa, 0, m.host_address, 0)
            except Exception as exc:
                raise MemslotError(f"unmapping {m.gpa:#x}+{m.size:#x} failed: {exc}") \
                    from exc
        self._forget(m)

    def _forget(self, m: Mapping) -> None:
        i = self._maps.index(m)
        del self._maps[i]
        del self._starts[i]
        heapq.heappush(self._free, m.slot)


def _check_range(gpa: int, size: int) -> None:
    if size <= 0 or gpa < 0 or gpa % PAGE or size % PAGE:
        raise MemslotError(f"range {gpa:#x}+{size:#x} is not a non-empty run of whole pages")
