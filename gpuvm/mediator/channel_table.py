"""A vGPU's channels as data: each virtual channel's binding and shadow, its runlist
and USERD poll register (the behaviour that changes them is gpuvm/mediator/channels.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuvm.device import layout, regs
from gpuvm.mediator.planted import planted


@dataclass
class VChannel:
    """One virtual channel: its physical channel, the shadow instance block and USERD
    page the hypervisor keeps for it, and what the guest last programmed."""

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


@dataclass
class ChannelTable:
    """A vGPU's channels as data: what each virtual channel is bound to, the guest's
    runlist and its USERD poll register.  It outlives a device reset (emptied, not
    replaced), so the physical runlist, the shadows and the fault records may each be
    handed this one table and read it, without holding the behaviour (Channels) that
    changes it."""

    size: int  # how many channels the partition has
    by_vchid: dict[int, VChannel] = field(default_factory=dict)
    runlist: list[int] = field(default_factory=list)
    userd_poll: int = 0  # the guest's PFIFO_USERD_POLL
    kick: int = 0  # the guest's last PFIFO_KICK

    def runlist_pchids(self) -> list[int]:
        """The physical ids of the guest's runlist, bound or not, as hardware keeps an
        unbound channel on its runlist and skips it: one left out while briefly unbound,
        when any VM's submit or removal rebuilt the runlist, was not runnable again after
        its rebind (the device ignores a channel whose table word is clear)."""
        drop = planted("runlist-drop")
        return [self.by_vchid[c].pchid for c in self.runlist
                if c in self.by_vchid and (self.by_vchid[c].bound or not drop)]

    def ramin_pages(self) -> list[int]:
        return [c.guest_inst for c in self.by_vchid.values() if c.bound]

    def bound_pchids(self) -> dict[int, int]:
        """This VM's bound channels: physical id -> its own id."""
        return {c.pchid: c.vchid for c in self.by_vchid.values() if c.bound}

    def poll_base(self) -> int | None:
        return layout.userd_poll_base(self.userd_poll)

    def poll_offsets(self) -> set[int]:
        base = self.poll_base()
        if base is None:
            return set()
        return {base + c * regs.USERD_STRIDE for c in range(self.size)}

    def userd_slot(self, bar1_offset: int) -> tuple[VChannel | None, int] | None:
        slot = layout.userd_poll_slot(self.userd_poll, bar1_offset, self.size)
        if slot is None:
            return None
        return self.by_vchid.get(slot[0]), slot[1]
