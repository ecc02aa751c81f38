"""A vGPU's channels: the virtual channel table, shadow channels, runlist and doorbells.

Guest channel ids are virtual (0..channels-1) and map onto the partition's physical
range.  Binding a channel builds a shadow instance block in hypervisor VRAM; the
guest's RAMIN page becomes sensitive (writes to it are reflected).  Doorbells never
reach the device directly: they go to the scheduler.
"""

from __future__ import annotations

from typing import Callable, Protocol

from gpuvm.device import layout, regs
from gpuvm.device.vram import Vram
from gpuvm.mediator.channel_table import ChannelTable, VChannel
from gpuvm.mediator.host_port import HostPort
from gpuvm.mediator.meter import VmMeter
from gpuvm.mediator.partition import Partition
from gpuvm.mediator.planted import planted
from gpuvm.mediator.vm_faults import VmFaults
from shadow.channel import ChannelRefused, read_guest_ramin, write_shadow_ramin
from shadow.entries import EntryPolicy
from shadow.vram_pool import PoolExhausted


class AddressSpaces(Protocol):
    """What channels need of their sibling the shadowing (gpuvm.mediator.shadowing)."""

    def space_pd(self, guest_pd: int | None) -> int:
        """The host directory a channel with this guest directory uses."""
        ...

    def ensure_fresh(self, guest_pd: int | None) -> None:
        """First use of an address space: resync it if a flush left it stale."""
        ...

    def refresh_remap(self) -> None:
        """What may be remapped changed (a channel bound, unbound, its poll area moved)."""
        ...

    def release_unused(self, in_use: set[int]) -> None:
        """Free the shadows of directories no bound channel uses."""
        ...

    def pramin_posting(self, allowed: bool) -> None:
        """No channel is bound any more (allowed), or one is now: PRAMIN stores may queue."""
        ...


# The scheduler's port for one VM (Submissions.submit with the VM's key bound):
# doorbell(pchid, put, ledger), and channel_reset(pchid) -- a (re)bound channel starts at
# GP_GET 0 (Submissions.channel_reset)
Doorbell = Callable[[int, int, "list | None"], None]


class Channels:
    """The trap handlers of a vGPU's channel registers and doorbells: each binding,
    rebuild and kill of a shadow channel, and each doorbell handed to the scheduler.

    Built with exactly what it uses -- its table, the partition, the VM's entry policy
    and VRAM view, the physical GPU's port, the scheduler's port for this VM
    (`doorbell`, `channel_reset`), the VM's meter and fault records, and its sibling the
    shadowing (for a channel's address space) -- so it never calls back up through the
    vGPU or the mediator."""

    def __init__(self, table: ChannelTable, part: Partition, policy: EntryPolicy,
                 vram: Vram, host: HostPort, doorbell: Doorbell,
                 channel_reset: Callable[[int], None], meter: VmMeter, faults: VmFaults,
                 shadowing: AddressSpaces) -> None:
        self.table = table
        self.part = part
        self.policy = policy
        self.vram = vram
        self.host = host
        self.doorbell = doorbell
        self.channel_reset = channel_reset
        self.meter = meter
        self.faults = faults
        self.shadowing = shadowing
        self.by_vchid = table.by_vchid
        table.userd_poll = table.kick = 0
        # the bound channels' RAMIN addresses, kept exact wherever a binding changes
        # (_set_inst): reflect tests each trapped store against it in one lookup
        self._ramin: frozenset[int] = frozenset(table.ramin_pages())
        shadowing.pramin_posting(not self._ramin)
        # Every channel's shadow instance block and USERD page are taken now, so a guest
        # that fills its shadow reserve with page tables can still program its channels.
        for vchid in range(part.channels):
            self._channel(vchid)

    def _channel(self, vchid: int) -> VChannel | None:
        ch = self.by_vchid.get(vchid)
        if ch is None:
            pchid = self.part.pchid(vchid)
            if pchid is None:
                return None
            pool = self.part.shadow_pool
            inst = pool.alloc(regs.RAMIN_SIZE)
            try:
                userd = pool.alloc(regs.USERD_STRIDE)
            except PoolExhausted:
                pool.free(inst)
                raise
            ch = self.by_vchid[vchid] = VChannel(vchid, pchid, inst, userd)
        return ch

    # ------------------------------------------------------------------ channel table
    def table_read(self, vchid: int) -> int:
        ch = self.by_vchid.get(vchid)
        return ch.table if ch else 0

    def state_read(self, vchid: int) -> int:
        ch = self.by_vchid.get(vchid)
        return ch.state if ch else 0

    def error_read(self, vchid: int) -> int:
        ch = self.by_vchid.get(vchid)
        if ch is not None and ch.killed is not None:
            return regs.PFIFO_CHAN_ERROR_FAULTED_EXT | regs.CHAN_ERR_TIMEOUT_EXT
        if ch is None or not ch.bound:
            return 0
        return self.host.rd(regs.PFIFO_CHAN_ERROR_EXT +
                            ch.pchid * regs.PFIFO_CHAN_ERROR_STRIDE_EXT)

    def table_write(self, vchid: int, value: int) -> None:
        count = self.meter.count
        try:
            ch = self._channel(vchid)
        except PoolExhausted:
            count("trap.refused.nomem", 1)
            return
        if ch is None:
            count("trap.refused.channel_id", 1)
            return
        ch.table = value
        ch.killed = None
        self._unbind(ch)
        if not layout.chan_valid(value):
            self.shadowing.refresh_remap()
            return
        inst = layout.chan_inst(value)
        target = layout.chan_target(value)
        try:
            if target != regs.TARGET_VRAM:
                raise ChannelRefused("instance block not in VRAM")
            self._set_inst(ch, inst)
            try:
                self._build_shadow(ch)
            except PoolExhausted:
                raise ChannelRefused("the shadow reserve is full") from None
        except ChannelRefused:
            self._set_inst(ch, None)
            count("trap.refused.channel_instance", 1)
            return
        self._resume_userd(ch)
        self.host.wr(regs.PFIFO_CHAN_TABLE + ch.pchid * regs.PFIFO_CHAN_STRIDE,
                     layout.chan_word(ch.shadow_inst))
        self.channel_reset(ch.pchid)
        self.shadowing.refresh_remap()

    def _resume_userd(self, ch: VChannel) -> None:
        """A channel bound again with progress in its RAMFC (saved at its unbind, see
        _unbind) finds its control area as it left it: the GP_PUT it had submitted and the
        GP_GET the device had reached.  A fresh block (RAMFC zero) starts at zero."""
        put = self.vram.read_bytes(ch.shadow_inst + regs.RAMFC_GP_PUT, 4)
        get = self.vram.read_bytes(ch.shadow_inst + regs.RAMFC_GP_GET, 4)
        if put or get:
            self.vram.u32[(ch.shadow_userd + regs.USERD_GP_PUT) >> 2] = put
            self.vram.u32[(ch.shadow_userd + regs.USERD_GP_GET) >> 2] = get
            ch.put = put

    def _set_inst(self, ch: VChannel, inst: int | None) -> None:
        """Bind (or, given None, unbind) a channel's guest RAMIN: the one place a
        binding changes, so the set reflect consults stays exact."""
        ch.guest_inst = inst
        before, self._ramin = self._ramin, frozenset(self.table.ramin_pages())
        if bool(before) != bool(self._ramin):
            self.shadowing.pramin_posting(not self._ramin)

    def _build_shadow(self, ch: VChannel) -> None:
        vram, policy = self.vram, self.policy
        guest = read_guest_ramin(vram, policy, ch.guest_inst)
        shadow_pd = self.shadowing.space_pd(guest.pd)  # may find the reserve full: then
        ch.guest_pd = guest.pd  # nothing changed (the old directory stays in use)
        self.shadowing.ensure_fresh(guest.pd)  # channel programming is a first use
        write_shadow_ramin(vram, guest, ch.shadow_inst, shadow_pd, ch.shadow_userd, policy)
        self.meter.count("shadow.channel_builds", 1)

    def _unbind(self, ch: VChannel) -> None:
        """Take the channel off the device first (the table write preempts it and drops
        its context), then free what only it used."""
        if not ch.bound:
            return
        self.host.wr(regs.PFIFO_CHAN_TABLE + ch.pchid * regs.PFIFO_CHAN_STRIDE, 0)
        # the device saved the channel's progress in the shadow RAMFC: the guest's RAMFC
        # gets it, as the device would have written it there (a rebind resumes from it)
        if self.policy.guest_vram_ok(ch.guest_inst, regs.RAMIN_SIZE):
            guest = self.policy.host_vram(ch.guest_inst)
            for off in regs.RAMFC_PROGRESS_WORDS:
                self.vram.u32[(guest + off) >> 2] = self.vram.u32[(ch.shadow_inst + off) >> 2]
        self.host.set_poll_page(ch.pchid, None)
        self._set_inst(ch, None)
        ch.guest_pd = None
        ch.put = 0
        self.vram.u8[ch.shadow_userd:ch.shadow_userd + regs.USERD_STRIDE] = 0
        self.shadowing.release_unused({c.guest_pd for c in self.by_vchid.values() if c.bound})

    def kill(self, pchid: int, reason: str, counter: str = "watchdog.kills") -> None:
        """The watchdog ends this channel: off the device (its engine work abandoned), its
        error word says so, and its owner sees a fault with the reason.  (The mediator ends
        channels the same way for other reasons, counted under `counter`.)"""
        ch = next((c for c in self.by_vchid.values() if c.pchid == pchid), None)
        if ch is None:
            self.host.wr(regs.PFIFO_CHAN_TABLE + pchid * regs.PFIFO_CHAN_STRIDE, 0)
            return
        self._unbind(ch)
        ch.killed = reason
        self.meter.count(counter, 1)
        self.faults.killed(ch.vchid, reason)
        self.host.signal(ch.pchid)  # the device looks again: its owner sees the fault
        self.shadowing.refresh_remap()

    def rebuild(self, ch: VChannel) -> None:
        """Rebuild a bound channel's shadow instance block and make the device use the new
        one: a kick drops the context it cached from the old (its directory may be about
        to be freed and its memory reused)."""
        try:
            self._build_shadow(ch)
        except PoolExhausted:  # no room for the new directory's shadow: off the device
            self.meter.count("trap.refused.nomem", 1)
            self._unbind(ch)
            return
        if not planted("cached-context"):
            self.host.kick(ch.pchid)

    def state_write(self, vchid: int, value: int) -> None:
        ch = self._channel(vchid)
        if ch is None:
            self.meter.count("trap.refused.channel_id", 1)
            return
        ch.state = value
        if ch.bound:
            self.shadowing.ensure_fresh(ch.guest_pd)
            self.host.set_poll_page(ch.pchid, ch.shadow_userd)
            self.host.wr(regs.PFIFO_CHAN_STATE + ch.pchid * regs.PFIFO_CHAN_STRIDE, value)

    def kick_write(self, vchid: int) -> None:
        self.table.kick = vchid
        ch = self.by_vchid.get(vchid)
        if ch is not None and ch.bound:
            self.host.wr(regs.PFIFO_KICK, ch.pchid)

    # ------------------------------------------------------------------ RAMIN reflection
    def reflects(self, guest_addr: int) -> bool:
        """Whether a store at guest_addr lands in a bound channel's RAMIN (`reflect`
        rebuilds that channel's shadow)."""
        return guest_addr & ~0xFFF in self._ramin

    def reflect(self, guest_addr: int) -> None:
        """A guest write landed at guest_addr: rebuild shadows of RAMIN it touched."""
        page = guest_addr & ~0xFFF
        if page not in self._ramin:  # almost every store: no channel's RAMIN
            return
        for ch in self.by_vchid.values():
            if ch.guest_inst == page:
                self.rebuild(ch)
                self.meter.count("shadow.ramin_reflects", 1)

    # ------------------------------------------------------------------ runlist
    def runlist_submit(self, addr_reg: int, length: int) -> None:
        table, count = self.table, self.meter.count
        addr = layout.runlist_addr(addr_reg)
        target = layout.runlist_target(addr_reg)
        nbytes = length * regs.RUNLIST_ENTRY_SIZE
        if target != regs.TARGET_VRAM or not self.policy.guest_vram_ok(addr, nbytes):
            count("trap.refused.runlist", 1)
            table.runlist = []
        else:
            host = self.policy.host_vram(addr)
            words = self.vram.u32[host >> 2:(host + nbytes) >> 2]
            vchids = layout.runlist_chids(words)
            table.runlist = [c for c in dict.fromkeys(vchids) if c < self.part.channels]
            if len(table.runlist) != len(vchids):
                count("trap.refused.runlist_entries", len(vchids) - len(table.runlist))
        self.host.rebuild_runlist()

    def set_userd_poll(self, value: int) -> None:
        self.table.userd_poll = value
        self.shadowing.refresh_remap()  # changes what is remapped

    # ------------------------------------------------------------------ USERD / doorbells
    def userd_read(self, ch: VChannel | None, reg: int, size: int) -> int:
        if reg + size > regs.USERD_STRIDE or size not in (1, 2, 4, 8):
            self.meter.count("trap.refused.userd", 1)  # past the end of this channel's page
            return (1 << (8 * size)) - 1
        if ch is None or not ch.bound:
            return 0
        if reg == regs.USERD_GP_PUT:
            return ch.put
        return self.vram.read_bytes(ch.shadow_userd + reg, size)

    def userd_write(self, ch: VChannel | None, reg: int, size: int, value: int) -> None:
        """A guest doorbell (GP_PUT): to the scheduler, never to the device directly."""
        meter = self.meter
        if reg != regs.USERD_GP_PUT:
            return  # only GP_PUT means anything to the device; the rest is guest scratch
        if ch is None or not ch.bound:
            meter.count("trap.refused.doorbell", 1)
            return
        ch.put = value & 0xFFFFFFFF
        self.shadowing.ensure_fresh(ch.guest_pd)  # a doorbell is the first use after a flush
        meter.count("doorbells", 1)
        self.doorbell(ch.pchid, ch.put, meter.doorbell_ledger())

    def teardown(self) -> None:
        pool = self.part.shadow_pool
        for ch in self.by_vchid.values():
            self._unbind(ch)
            pool.free(ch.shadow_inst)
            pool.free(ch.shadow_userd)
        self.by_vchid.clear()
        self.table.runlist = []

