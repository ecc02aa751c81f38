"""The vCPU exit loop: KVM_RUN, decode the exit, hand it to the target or the session.

This is the measured path (`gpuvm bench exits`), so it is written for CPython speed:
KVM_RUN is a two-argument ioctl (the three-argument form costs ~2 µs more); exit fields
are read through memoryview casts of the kvm_run mapping (no per-exit objects beyond the
ints themselves, no struct parsing); BAR0 is tested inline and the other BAR windows are a
precomputed tuple; counters are list slots; every attribute lookup is hoisted out of the
loop; the virtual clock's tick is its party's own method, bound once (nothing to call
without a clock), and the coalesced ring is looked at only where there is one (two u32
reads: small ints, where one u64 of both would be a large one made on every exit).
The VMM's own work per BAR0 store, replayed warm without KVM, is ~0.3 µs to a register
file and ~0.4 µs to an fv vGPU on the 2-core host.  Measured on KVM-PVM: after each
KVM_RUN the host's caches/TLB are cold, so every extra object or call touched per exit
costs ~10x its warm price (a no-op target call is nearly free, reading the four MMIO
fields and counting costs ~10 % of a raw exit).
"""

from __future__ import annotations

import fcntl
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from gpuvm.vfio.device import VALUE_MASKS, PostedStores
from gpuvm.vmm.guest_session import GuestSession
from gpuvm.vmm.kvm import kvm_api as api
from gpuvm.vmm.kvm.flusher import FLUSHER
from gpuvm.vmm.kvm.vm import KvmVm

COALESCED_STORES = "kvm.coalesced_stores"
# posted stores a vCPU holds before it hands them on unasked (~96 rings full; one
# REGION_WRITE_MULTI of ~390 KB, under max_data_xfer_size)
HELD_STORES_MAX = 1 << 14
DIRECT_ACCESSES = "kvm.direct_accesses"
# value masks by access size (index = bytes)
MASKS = tuple(VALUE_MASKS.tolist())


def _no_tick() -> None:
    """No virtual clock: an exit has no time to count."""


@dataclass(frozen=True)
class BarRange:
    """Where the guest finds one BAR (guest-physical)."""

    bar: int
    base: int
    size: int

    @property
    def end(self) -> int:
        return self.base + self.size


class ExitCounters:
    """Exit counts kept as list slots (cheap to bump on the exit path), read as a dict.

    Slot 0 is "exits.io"; BAR window i has its read count at 1 + 2i, writes at 2 + 2i;
    then "kvm.coalesced_stores" counts the writes among those that came through the
    coalesced ring and "kvm.direct_accesses" those made to pages mapped as memory and
    counted from the guest's own counts (neither had a KVM exit of its own): KVM's
    exits are the sum of exits.* less these two."""

    def __init__(self, windows: tuple[BarRange, ...]) -> None:
        self.names = ["exits.io"]
        for w in windows:
            self.names += [f"exits.mmio.bar{w.bar}.read", f"exits.mmio.bar{w.bar}.write"]
        self.names += [COALESCED_STORES, DIRECT_ACCESSES]
        self.coalesced_slot = len(self.names) - 2
        self.direct_slot = len(self.names) - 1
        self.slots = [0] * len(self.names)

    def as_dict(self) -> dict[str, int]:
        return dict(zip(self.names, self.slots))


@dataclass
class DirectAccesses:
    """Where the guest counts its own BAR accesses (a u64 view: reads per BAR, then
    writes per BAR) and whom to tell about those that did not exit, when a device maps
    pages into the guest that stand for accesses the model counts (native mode)."""

    guest_counts: memoryview
    device_count: Callable[[int, int, int], None]  # (bar, reads, writes)


class ExitLoop:
    """Runs one vCPU until the guest exits (None) or must stop (a one-line reason)."""

    def __init__(self, vm: KvmVm, session: GuestSession, windows: tuple[BarRange, ...],
                 counters: ExitCounters, stop_reason: Callable[[], str | None],
                 coalesced: bool = False, direct: DirectAccesses | None = None) -> None:
        assert vm.run is not None
        self.vm = vm
        self.session = session
        self.windows = windows
        self.counters = counters
        self._stop_reason = stop_reason
        mv = memoryview(vm.run)
        self._u8 = mv
        self._u16 = mv.cast("H")
        self._u32 = mv.cast("I")
        self._u64 = mv.cast("Q")
        # The coalesced-MMIO ring, where the runner registered zones: u32 indices of its
        # `first` and `last`, both 0 (always equal: never drained) when there is none.
        ring = vm.coalesced_ring if coalesced else 0
        self.ring_first_at = (ring + api.RING_FIRST) // 4 if ring else 0
        self.ring_last_at = (ring + api.RING_LAST) // 4 if ring else 0
        # its entries, read a drain at a time (none without a ring)
        self._ring = np.frombuffer(vm.run, dtype=api.RING_ENTRY_DTYPE, count=api.RING_MAX,
                                   offset=ring + api.RING_ENTRIES) if ring else \
            np.zeros(0, dtype=api.RING_ENTRY_DTYPE)
        self.coalesced = bool(ring)  # without a ring the exit path does not look at it
        # Posted stores taken from the ring (and stores that found it full) not yet handed
        # to the device, in order: chunks of ring entries.  `_held_exits` of them exited.
        self._held: list[np.ndarray] = []
        self._held_n = 0
        self._held_exits = 0
        # a store that found the ring full may wait with them (not where accesses to
        # pages mapped as memory are counted: those are ticked in order with the exits)
        self._holds = bool(ring) and direct is None
        # where a queued store goes: (base, end, write slot) per window, and each
        # window's BAR and base as columns (a drain's stores are placed at once)
        self._write_windows = tuple((w.base, w.end, 2 + 2 * i)
                                    for i, w in enumerate(windows))
        self._window_bars = np.array([w.bar for w in windows], dtype=np.uint32)
        self._window_bases = np.array([w.base for w in windows], dtype=np.uint64)
        # where the drain sends its stores at once (None: one device.write each)
        self._many = getattr(session.device, "write_many", None)
        self.direct = direct
        # (bar, read slot, write slot) per window, to count what did not exit
        self._direct_slots = tuple((w.bar, 1 + 2 * i, 2 + 2 * i)
                                   for i, w in enumerate(windows))

    def ring_state(self) -> tuple[int, int, int]:
        """The coalesced ring's (first, last) and the posted stores held since they left
        it: stores wait while first and last differ or any are held (any thread may
        ask)."""
        u32 = self._u32
        return u32[self.ring_first_at], u32[self.ring_last_at], self._held_n

    def count_direct(self) -> None:
        """Count the guest's BAR accesses that did not exit (pages of a passed-through
        GPU's apertures mapped as memory) from its own counts of every access, each as
        the exit path counts one: the vCPU's tick, the window's count, and the device
        counting and pricing it as if it had trapped.  Called before each exit is handled (they came
        first; the access that exits is not in the guest's count yet), so every phase
        and every later exit sees the counts and virtual time of a run where they all
        exited."""
        direct = self.direct
        assert direct is not None
        guest = direct.guest_counts
        counts = self.counters.slots
        tick = self.session.exit_ticker() or _no_tick
        nbars = len(guest) // 2
        for bar, rslot, wslot in self._direct_slots:
            reads = guest[bar] - counts[rslot]
            writes = guest[nbars + bar] - counts[wslot]
            if reads > 0 or writes > 0:
                reads, writes = max(reads, 0), max(writes, 0)
                counts[self.counters.direct_slot] += reads + writes
                device_count = direct.device_count
                for _ in range(reads):  # each its own exit: its tick, then its price
                    tick()
                    counts[rslot] += 1
                    device_count(bar, 1, 0)
                for _ in range(writes):
                    tick()
                    counts[wslot] += 1
                    device_count(bar, 0, 1)

    def drain(self) -> str | None:
        """Hand every posted store -- those held and those queued in the coalesced ring
        -- to the device, oldest first, exactly as the exit path hands a trapped store:
        the vCPU's exit tick, then the window's write count, then `device.write`.  So
        each one is still a trapped access of the modelled system -- counts and virtual
        time are those of a run without the ring, only the KVM exits are fewer.  A
        device that takes posted stores at once (`write_many`: the vGPU, which lands a
        run of them in one page at once, ticking each; over vfio-user, one message, the
        server ticking each) gets them all, in order.  Called before every exit that is
        not itself a posted store is handled (the stores came first) and on a flush
        kick; returns why the guest must stop, or None."""
        self._take()
        return self._hand_on()

    def _take(self) -> None:
        """Move the ring's entries to the held stores, freeing the ring for KVM."""
        u32 = self._u32
        first_at, last_at = self.ring_first_at, self.ring_last_at
        first, last = u32[first_at], u32[last_at]  # the vCPU is not running: last stays
        n = (last - first) % api.RING_MAX
        if n:
            self._held.append(self._ring[(np.arange(n) + first) % api.RING_MAX])  # copied
            u32[first_at] = last
            self._held_n += n

    def _hold(self, addr: int, size: int, data: int) -> bool:
        """Hold a store that exited because the ring was full, if it is one: a write into
        a zone registered now, with room left.  It then waits with the ring's stores
        for the next exit that is not a posted store, as if the ring were larger --
        one hand-off (one message, from a VMM in its own process) for ~100 rings
        instead of two a ring.  Its exit is ticked and counted at the hand-off, in
        order (it is not one of the coalesced stores)."""
        if not self._holds or self._held_n >= HELD_STORES_MAX or \
                not self.vm.posts_at(addr, size):
            return False
        entry = np.zeros(1, dtype=api.RING_ENTRY_DTYPE)
        entry["phys_addr"], entry["len"], entry["data"] = addr, size, data
        self._held.append(entry)
        self._held_n += 1
        self._held_exits += 1
        return True

    def _hand_on(self) -> str | None:
        n = self._held_n
        if not n:
            return None
        entries = self._held[0] if len(self._held) == 1 else np.concatenate(self._held)
        counts = self.counters.slots
        counts[self.counters.coalesced_slot] += n - self._held_exits
        self._held, self._held_n, self._held_exits = [], 0, 0
        addrs, sizes = entries["phys_addr"], entries["len"]
        window = np.full(n, len(self._write_windows), dtype=np.intp)  # none yet
        for i, (base, end, _) in enumerate(self._write_windows):
            window[(addrs >= base) & (addrs < end)] = i
        failure = None
        outside = np.flatnonzero(window == len(self._write_windows))
        if len(outside):  # those before it are handed on; the guest stops there
            n = int(outside[0])
            failure = (f"coalesced MMIO write of {sizes[n]} bytes at guest-physical "
                       f"{int(addrs[n]):#x}, outside every BAR window")
            entries, addrs, sizes, window = entries[:n], addrs[:n], sizes[:n], window[:n]
        for i, queued in enumerate(np.bincount(window, minlength=len(self._write_windows))
                                   .tolist()[:len(self._write_windows)]):
            counts[self._write_windows[i][2]] += queued
        stores = PostedStores(self._window_bars[window], addrs - self._window_bases[window],
                              sizes, entries["data"] & VALUE_MASKS[sizes])
        ticker = self.session.exit_ticker()
        if self._many is not None:
            if n:
                self._many(stores, ticker)
        else:
            write = self.session.device.write
            for bar, offset, size, value in stores.rows():
                if ticker is not None:
                    ticker()
                write(bar, offset, size, value)
        return failure

    def release(self) -> None:
        """Drop the views on kvm_run so the mapping can be closed."""
        self._ring = np.zeros(0, dtype=api.RING_ENTRY_DTYPE)  # its view of kvm_run goes
        for name in ("_u16", "_u32", "_u64", "_u8"):
            getattr(self, name).release()
        if self.direct is not None:
            self.direct.guest_counts.release()

    def run(self) -> str | None:
        if not self.coalesced:
            return self._loop()
        FLUSHER.add(threading.get_ident(), self)
        try:
            return self._loop()
        finally:
            FLUSHER.remove(threading.get_ident())

    def _loop(self) -> str | None:
        while True:
            try:
                return self._dispatch()
            except InterruptedError:
                # A kick (timeout/stop, or the flusher's: stores wait in the ring) or a
                # stray signal.  Other than a stop it re-enters: a pending MMIO read or
                # `in` completes on the next KVM_RUN.
                reason = self._stop_reason()
                if reason is not None:
                    return reason
                reason = self.drain()
                if reason is not None:
                    return reason
            except OSError as exc:
                return f"KVM_RUN failed: {exc.strerror}"

    def _dispatch(self) -> str | None:
        ioctl = fcntl.ioctl
        fd = self.vm.vcpu_fd
        KVM_RUN = api.KVM_RUN
        EXIT_MMIO = api.KVM_EXIT_MMIO
        EXIT_IO = api.KVM_EXIT_IO
        u8, u16, u32, u64 = self._u8, self._u16, self._u32, self._u64
        # kvm_run fields by name, as indices into the typed views (locals: as cheap as
        # literals on the exit path)
        reason_at = api.RUN_EXIT_REASON // 4
        addr_at, data_at = api.RUN_MMIO_PHYS_ADDR // 8, api.RUN_MMIO_DATA // 8
        len_at, is_write_at = api.RUN_MMIO_LEN // 4, api.RUN_MMIO_IS_WRITE
        dir_at, io_size_at = api.RUN_IO_DIRECTION, api.RUN_IO_SIZE
        port_at, count_at = api.RUN_IO_PORT // 2, api.RUN_IO_COUNT // 4
        data_offset_at = api.RUN_IO_DATA_OFFSET // 8
        masks = MASKS
        counts = self.counters.slots
        # The first window (BAR0: registers, the hot one) is tested inline; the others
        # go through a short scan.  Entries: (base, end, bar, read slot, write slot).
        first = self.windows[0] if self.windows else BarRange(-1, 0, 0)  # matches nothing
        base0, size0, bar0 = first.base, first.size, first.bar
        others = tuple((w.base, w.end, w.bar, 1 + 2 * i, 2 + 2 * i)
                       for i, w in enumerate(self.windows) if i > 0)
        device = self.session.device  # the attached VFIO device: read/write(region, ...)
        mmio_read = device.read
        mmio_write = device.write
        port_out = self.session.port_out
        port_in = self.session.port_in
        tick = self.session.exit_ticker()  # the vCPU's time on a virtual device clock
        coalesced, first_at, last_at = self.coalesced, self.ring_first_at, self.ring_last_at
        take, hold, hand_on = self._take, self._hold, self._hand_on
        held = False  # posted stores wait in self._held (none on entry: see _loop)
        count_direct = self.count_direct if self.direct is not None else None
        while True:
            ioctl(fd, KVM_RUN)
            if coalesced and (held or u32[first_at] != u32[last_at]):
                # posted stores came first: a store that found the ring full waits
                # with them; any other exit has them handed on before it
                take()
                held = u32[reason_at] == EXIT_MMIO and u8[is_write_at] and \
                    hold(u64[addr_at], u32[len_at], u64[data_at])
                if held:
                    continue
                failure = hand_on()
                if failure is not None:
                    return failure
            if count_direct is not None:  # so did accesses to pages mapped as memory
                count_direct()
            if tick is not None:
                tick()
            reason = u32[reason_at]
            if reason == EXIT_MMIO:
                offset = u64[addr_at] - base0
                if 0 <= offset < size0:
                    size = u32[len_at]
                    if u8[is_write_at]:
                        counts[2] += 1
                        mmio_write(bar0, offset, size, u64[data_at] & masks[size])
                    else:
                        counts[1] += 1
                        u64[data_at] = mmio_read(bar0, offset, size) & masks[size]
                    continue
                addr = u64[addr_at]
                for base, end, bar, rslot, wslot in others:
                    if base <= addr < end:
                        break
                else:
                    return self._outside_bars(addr)
                size = u32[len_at]
                if u8[is_write_at]:
                    counts[wslot] += 1
                    mmio_write(bar, addr - base, size, u64[data_at] & masks[size])
                else:
                    counts[rslot] += 1
                    u64[data_at] = mmio_read(bar, addr - base, size) & masks[size]
            elif reason == EXIT_IO:
                counts[0] += 1
                size = u8[io_size_at]
                data = u64[data_offset_at] >> 2  # a page offset: 4-aligned, a u32 index
                if u32[count_at] != 1:
                    return f"string I/O (rep ins/outs) on port {u16[port_at]:#x} is not supported"
                if u8[dir_at]:
                    if port_out(u16[port_at], u32[data] & masks[size]):
                        return None
                else:
                    value = port_in(u16[port_at]) & masks[size]
                    offset = data << 2
                    u8[offset:offset + size] = value.to_bytes(size, "little")
            else:
                return self._unexpected(reason)

    # ---------------------------------------------------------------- failures
    def _outside_bars(self, addr: int) -> str:
        kind = "write" if self._u8[api.RUN_MMIO_IS_WRITE] else "read"
        return (f"MMIO {kind} of {self._u32[api.RUN_MMIO_LEN // 4]} bytes at guest-physical {addr:#x}, "
                f"outside guest RAM and every BAR window")

    def _unexpected(self, reason: int) -> str:
        if reason == api.KVM_EXIT_SHUTDOWN:
            return "guest crashed: triple fault (KVM_EXIT_SHUTDOWN; an exception such " \
                   "as #UD, #GP or #PF with no handler)"
        if reason == api.KVM_EXIT_INTERNAL_ERROR:
            sub = self._u32[api.RUN_UNION // 4]  # internal.suberror
            name = api.INTERNAL_ERROR_NAMES.get(sub, "unknown")
            return f"KVM internal error: {name} (suberror {sub})"
        if reason == api.KVM_EXIT_FAIL_ENTRY:
            return f"KVM entry failed: hardware reason {self._u64[api.RUN_UNION // 8]:#x}"
        if reason == api.KVM_EXIT_HLT:
            return "guest executed hlt (guests end with an `out` to PORT_EXIT)"
        return f"unexpected KVM exit {api.exit_name(reason)}"
