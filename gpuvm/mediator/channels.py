"""A vGPU's channels: the virtual channel table, shadow channels, runlist and doorbells.

Guest channel ids are virtual (0..channels-1) and map onto the partition's physical
range.  Binding a channel builds a shadow instance block in hypervisor VRAM; the
guest's RAMIN page becomes sensitive (writes to it are reflected).  Doorbells never
reach the device directly: they go to the scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuvm.device import layout, regs
from gpuvm.device.vram import Vram
from gpuvm.mediator.host_port import HostPort
from shadow.channel import ChannelRefused, read_guest_ramin, write_shadow_ramin
from shadow.vram_pool import PoolExhausted

if TYPE_CHECKING:
    from gpuvm.mediator.vgpu import VGpu


@dataclass
class VChannel:
    vchid: int
    pchid: int
    shadow_inst: int
    shadow_userd: int
    table: int = 0  # the guest's channel-table word
    state: int = 0
    guest_inst: int | None = None  # bound: the guest RAMIN address
    guest_pd: int | None = None
    put: int = 0  # the guest's last GP_PUT
    killed: str | None = None  # why the watchdog killed it (until the guest rebinds it)

    @property
    def bound(self) -> bool:
        return self.guest_inst is not None


class Channels:
    def __init__(self, vgpu: "VGpu", host: HostPort, vram: Vram) -> None:
        self.vgpu = vgpu
        self.host = host
        self.vram = vram
        self.by_vchid: dict[int, VChannel] = {}
        self.runlist: list[int] = []
        self.userd_poll = 0  # the guest's PFIFO_USERD_POLL
        self.kick = 0
        # Every channel's shadow instance block and USERD page are taken now, so a guest
        # that fills its shadow reserve with page tables can still program its channels.
        for vchid in range(vgpu.part.channels):
            self._channel(vchid)

    def _channel(self, vchid: int) -> VChannel | None:
        ch = self.by_vchid.get(vchid)
        if ch is None:
            pchid = self.vgpu.part.pchid(vchid)
            if pchid is None:
                return None
            pool = self.vgpu.part.shadow_pool
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
        v = self.vgpu
        try:
            ch = self._channel(vchid)
        except PoolExhausted:
            v.count("trap.refused.nomem", 1)
            return
        if ch is None:
            v.count("trap.refused.channel_id", 1)
            return
        ch.table = value
        ch.killed = None
        self._unbind(ch)
        if not layout.chan_valid(value):
            v.shadowing.refresh_remap()
            return
        inst = layout.chan_inst(value)
        target = layout.chan_target(value)
        try:
            if target != regs.TARGET_VRAM:
                raise ChannelRefused("instance block not in VRAM")
            ch.guest_inst = inst
            try:
                self._build_shadow(ch)
            except PoolExhausted:
                raise ChannelRefused("the shadow reserve is full") from None
        except ChannelRefused:
            ch.guest_inst = None
            v.count("trap.refused.channel_instance", 1)
            return
        self._resume_userd(ch)
        self.host.wr(regs.PFIFO_CHAN_TABLE + ch.pchid * regs.PFIFO_CHAN_STRIDE,
                 layout.chan_word(ch.shadow_inst))
        self.host.channel_reset(ch.pchid)
        v.shadowing.refresh_remap()

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

    def _build_shadow(self, ch: VChannel) -> None:
        v = self.vgpu
        vram = self.vram
        guest = read_guest_ramin(vram, v.policy, ch.guest_inst)
        shadow_pd = v.shadowing.space_pd(guest.pd)  # may find the reserve full: then
        ch.guest_pd = guest.pd  # nothing changed (the old directory stays in use)
        v.shadowing.ensure_fresh(guest.pd)  # channel programming is a first use
        write_shadow_ramin(vram, guest, ch.shadow_inst, shadow_pd, ch.shadow_userd, v.policy)
        v.count("shadow.channel_builds", 1)

    def _unbind(self, ch: VChannel) -> None:
        """Take the channel off the device first (the table write preempts it and drops
        its context), then free what only it used."""
        if not ch.bound:
            return
        v = self.vgpu
        self.host.wr(regs.PFIFO_CHAN_TABLE + ch.pchid * regs.PFIFO_CHAN_STRIDE, 0)
        # the device saved the channel's progress in the shadow RAMFC: the guest's RAMFC
        # gets it, as the device would have written it there (a rebind resumes from it)
        if v.policy.guest_vram_ok(ch.guest_inst, regs.RAMIN_SIZE):
            guest = v.policy.host_vram(ch.guest_inst)
            for off in regs.RAMFC_PROGRESS_WORDS:
                self.vram.u32[(guest + off) >> 2] = self.vram.u32[(ch.shadow_inst + off) >> 2]
        self.host.set_poll_page(ch.pchid, None)
        ch.guest_inst = ch.guest_pd = None
        ch.put = 0
        self.vram.u8[ch.shadow_userd:ch.shadow_userd + regs.USERD_STRIDE] = 0
        v.shadowing.release_unused({c.guest_pd for c in self.by_vchid.values() if c.bound})

    def kill(self, pchid: int, reason: str, counter: str = "watchdog.kills") -> None:
        """The watchdog ends this channel: off the device (its engine work abandoned), its
        error word says so, and its owner sees a fault with the reason.  (The mediator ends
        channels the same way for other reasons, counted under `counter`.)"""
        v = self.vgpu
        ch = next((c for c in self.by_vchid.values() if c.pchid == pchid), None)
        if ch is None:
            self.host.wr(regs.PFIFO_CHAN_TABLE + pchid * regs.PFIFO_CHAN_STRIDE, 0)
            return
        self._unbind(ch)
        ch.killed = reason
        v.count(counter, 1)
        v.watchdog_fault(ch.vchid, reason)
        v.shadowing.refresh_remap()

    def rebuild(self, ch: VChannel) -> None:
        """Rebuild a bound channel's shadow instance block and make the device use the new
        one: a kick drops the context it cached from the old (its directory may be about
        to be freed and its memory reused)."""
        try:
            self._build_shadow(ch)
        except PoolExhausted:  # no room for the new directory's shadow: off the device
            self.vgpu.count("trap.refused.nomem", 1)
            self._unbind(ch)
            return
        self.host.kick(ch.pchid)

    def state_write(self, vchid: int, value: int) -> None:
        ch = self._channel(vchid)
        if ch is None:
            self.vgpu.count("trap.refused.channel_id", 1)
            return
        ch.state = value
        if ch.bound:
            self.vgpu.shadowing.ensure_fresh(ch.guest_pd)
            self.host.set_poll_page(ch.pchid, ch.shadow_userd)
            self.host.wr(regs.PFIFO_CHAN_STATE + ch.pchid * regs.PFIFO_CHAN_STRIDE, value)

    def kick_write(self, vchid: int) -> None:
        self.kick = vchid
        ch = self.by_vchid.get(vchid)
        if ch is not None and ch.bound:
            self.host.wr(regs.PFIFO_KICK, ch.pchid)

    # ------------------------------------------------------------------ RAMIN reflection
    def ramin_pages(self) -> list[int]:
        return [c.guest_inst for c in self.by_vchid.values() if c.bound]

    def reflect(self, guest_addr: int) -> None:
        """A guest write landed at guest_addr: rebuild shadows of RAMIN it touched."""
        page = guest_addr & ~0xFFF
        for ch in self.by_vchid.values():
            if ch.guest_inst == page:
                self.rebuild(ch)
                self.vgpu.count("shadow.ramin_reflects", 1)

    # ------------------------------------------------------------------ runlist
    def runlist_submit(self, addr_reg: int, length: int) -> None:
        v = self.vgpu
        addr = layout.runlist_addr(addr_reg)
        target = layout.runlist_target(addr_reg)
        nbytes = length * regs.RUNLIST_ENTRY_SIZE
        if target != regs.TARGET_VRAM or not v.policy.guest_vram_ok(addr, nbytes):
            v.count("trap.refused.runlist", 1)
            self.runlist = []
        else:
            host = v.policy.host_vram(addr)
            words = self.vram.u32[host >> 2:(host + nbytes) >> 2]
            vchids = layout.runlist_chids(words)
            self.runlist = [c for c in dict.fromkeys(vchids) if c < v.part.channels]
            if len(self.runlist) != len(vchids):
                v.count("trap.refused.runlist_entries", len(vchids) - len(self.runlist))
        self.host.rebuild_runlist()

    def runlist_pchids(self) -> list[int]:
        return [self.by_vchid[c].pchid for c in self.runlist
                if c in self.by_vchid and self.by_vchid[c].bound]

    # ------------------------------------------------------------------ USERD / doorbells
    def poll_base(self) -> int | None:
        return layout.userd_poll_base(self.userd_poll)

    def poll_offsets(self) -> set[int]:
        base = self.poll_base()
        if base is None:
            return set()
        return {base + c * regs.USERD_STRIDE for c in range(self.vgpu.part.channels)}

    def userd_slot(self, bar1_offset: int) -> tuple[VChannel | None, int] | None:
        slot = layout.userd_poll_slot(self.userd_poll, bar1_offset, self.vgpu.part.channels)
        if slot is None:
            return None
        return self.by_vchid.get(slot[0]), slot[1]

    def userd_read(self, ch: VChannel | None, reg: int, size: int) -> int:
        if reg + size > regs.USERD_STRIDE or size not in (1, 2, 4, 8):
            self.vgpu.count("trap.refused.userd", 1)  # past the end of this channel's page
            return (1 << (8 * size)) - 1
        if ch is None or not ch.bound:
            return 0
        if reg == regs.USERD_GP_PUT:
            return ch.put
        return self.vram.read_bytes(ch.shadow_userd + reg, size)

    def userd_write(self, ch: VChannel | None, reg: int, size: int, value: int) -> None:
        v = self.vgpu
        if reg != regs.USERD_GP_PUT:
            return  # only GP_PUT means anything to the device; the rest is guest scratch
        if ch is None or not ch.bound:
            v.count("trap.refused.doorbell", 1)
            return
        ch.put = value & 0xFFFFFFFF
        v.shadowing.ensure_fresh(ch.guest_pd)  # a doorbell is the first use after a flush
        v.count("doorbells", 1)
        self.host.submit(v, ch.pchid, ch.put)

    def teardown(self) -> None:
        for ch in self.by_vchid.values():
            self._unbind(ch)
            self.vgpu.part.shadow_pool.free(ch.shadow_inst)
            self.vgpu.part.shadow_pool.free(ch.shadow_userd)
        self.by_vchid.clear()
        self.runlist = []

