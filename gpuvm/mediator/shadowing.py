"""A vGPU's shadow page tables: which guest directory backs what, when to resync, and
which BAR pages may be remapped as a consequence.

- fv: a guest TLB flush rescans at once (full scan), then the real flush is issued.
- lazy: a flush only marks shadows stale; the resync happens at first use.  A channel
  address space is first used by a doorbell, channel programming or a RAMIN write; a
  BAR-VM window by the guest's next trapped access through that BAR, or by the next
  change of what is remapped (which reads the window).  A window whose write history
  shows no change since its last sync is not resynced at all.  Remapped BAR pages are
  used without any trap, so a flush whose changed window entries include a remapped
  page resyncs that window at once: the guest must not keep reaching the old page.
- incremental: a resync looks only at the entries the trapped stores (and the device's
  engine write log) say changed (shadow.dirty); tables in the guest's RAM are compared.

Guest page tables may live in the guest's VRAM slice or in its RAM (the PDE target says
which); sysram tables are read through this VM's own RAM only and validated like every
other entry.  Page directories are shadowed from the VRAM slice only.
"""

from __future__ import annotations

from gpuvm.device import layout, regs
from gpuvm.device.dma import DmaMappings
from gpuvm.device.vram import Vram
from gpuvm.mediator.channel_table import ChannelTable
from gpuvm.mediator.host_port import HostPort
from gpuvm.mediator.meter import VmMeter
from gpuvm.mediator.modes import Mode
from gpuvm.mediator.partition import Partition
from gpuvm.mediator.planted import planted
from shadow.bar_window import NOT_VRAM, BarWindow
from shadow.entries import EntryPolicy
from shadow.page_table import ShadowSpace
from shadow.pv_space import PvSpace
from gpuvm.vfio.device import MappingListener
from shadow.remap import RemapPlan, RemapState


_BAR_VM = {regs.BAR1: "bar1_vm", regs.BAR3: "bar3_vm"}  # their virtual registers


class Shadowing:
    """A vGPU's shadows -- of its channels' address spaces, its BAR1/BAR3 windows and
    its PV spaces -- and what is remapped because of them.

    Built with exactly what it uses: the VRAM view, the physical GPU's port (flushes,
    the physical BAR tables, the engines' write log), the partition, the VM's entry
    policies (`space_policy` translates its channel shadows), its RAM as DMA-mapped,
    its meter, its mode, its channel table (which RAMIN pages and poll offsets must
    keep trapping) and its virtual registers (the BAR VMs and the flush directory the
    guest wrote); never the vGPU or the mediator."""

    def __init__(self, vram: Vram, host: HostPort, part: Partition, policy: EntryPolicy,
                 space_policy: EntryPolicy, guest_ram: DmaMappings, meter: VmMeter,
                 mode: Mode, channels: ChannelTable, vregs: dict[str, int]) -> None:
        self.host = host
        self.vram = vram
        self.part = part
        self.policy = policy
        self.space_policy = space_policy
        self.meter = meter
        self.mode = mode
        self.channels = channels
        self.spaces: dict[int, ShadowSpace] = {}  # guest PD -> shadow
        self.pv_spaces: dict[int, PvSpace] = {}  # PV key -> hypervisor-owned tables
        self.guest_ram = guest_ram  # the VM's RAM as its VMM DMA-mapped it (iova = gpa)
        self.engine_writes = host.engine_writes
        self.bar1 = BarWindow(vram, policy, meter.count, host.bar1_pt,
                              part.bar1_base >> 12, part.spec.bar1_size >> 12, self.guest_ram,
                              self.engine_writes)
        self.bar3 = BarWindow(vram, policy, meter.count, host.bar3_pt,
                              part.bar3_base >> 12, part.spec.bar3_size >> 12, self.guest_ram,
                              self.engine_writes)
        self.vregs = vregs
        self.empty_pd = part.shadow_pool.alloc(regs.PD_BYTES)  # for refused directories
        vram.u8[self.empty_pd:self.empty_pd + regs.PD_BYTES] = 0
        self.remapper: MappingListener | None = None  # the VMM's (BAR remap)
        self._pramin_posted = True  # see pramin_posting
        self._remapped = {regs.BAR1: RemapState.empty(self.bar1.pages),
                          regs.BAR3: RemapState.empty(self.bar3.pages)}

    # ------------------------------------------------------------------ address spaces
    def space_pd(self, guest_pd: int | None) -> int:
        """The host directory a channel with this guest directory should use."""
        if guest_pd is None:
            return self.empty_pd
        pv = self.pv_spaces.get(guest_pd)
        if pv is not None:
            return pv.pd
        space = self.spaces.get(guest_pd)
        if space is None:
            space = self.spaces[guest_pd] = ShadowSpace(self.vram, self.space_policy,
                                                        self.part.shadow_pool, guest_pd,
                                                        self.meter.count, self.guest_ram,
                                                        self.engine_writes)
        return space.shadow_pd

    def note_write(self, guest_addr: int, size: int) -> None:
        """A trapped guest store landed in its VRAM: the shadows that read that memory
        learn which of their entries it touched."""
        for space in self.spaces.values():
            space.note_write(guest_addr, size)
        self.bar1.note_write(guest_addr, size)
        self.bar3.note_write(guest_addr, size)

    def ensure_fresh(self, guest_pd: int | None) -> None:
        """First use of a channel's address space: resync it if a flush left it stale."""
        space = self.spaces.get(guest_pd) if guest_pd is not None else None
        if space is not None and space.stale:
            self._sync_space(space)

    def _sync_space(self, space: ShadowSpace) -> None:
        before = space.layout()
        space.sync(incremental=self.mode.incremental)
        self.host.flush(space.shadow_pd)
        if space.layout() != before:
            # new, moved or dropped guest tables change what is sensitive (and a table's
            # pages must trap before its write history can be trusted)
            self.refresh_remap()

    def _retire(self, pd: int) -> None:
        """A shadow directory is about to be freed: the device's TLB forgets it first, so
        no cached walk survives into whatever the memory becomes next."""
        self.host.flush(pd)

    def release_unused(self, in_use: set[int]) -> None:
        """Free the shadows of directories no bound channel uses.  Channels' device
        contexts follow their shadow RAMIN (rebuilt with a kick on every change), so a
        space no bound channel names is one the device can no longer reach."""
        for pd in [pd for pd in self.spaces if pd not in in_use]:
            space = self.spaces.pop(pd)
            self._retire(space.shadow_pd)
            space.release()

    def free_pv(self, space: PvSpace) -> None:
        """HC_FREE_PGD, once the channels using `space` (taken out of pv_spaces) are off
        it: the BAR windows still using it are rebound, the TLB forgets it, then its
        tables are freed."""
        for window, bar in ((self.bar1, regs.BAR1), (self.bar3, regs.BAR3)):
            if window.pv is space and not planted("free-bound-pgd"):
                self.bind_window(bar, self.vregs[_BAR_VM[bar]])
        self._retire(space.pd)
        space.release()

    # ------------------------------------------------------------------ TLB flushes
    def guest_flush(self, trigger: int) -> None:
        """The guest wrote PFFB_FLUSH_TRIGGER (of the directory it wrote to FLUSH_PD)."""
        if not trigger & regs.PFFB_TRIGGER_GO:
            return
        flush_pd = self.vregs["flush_pd"]
        count, mode = self.meter.count, self.mode
        count("tlb.guest_flushes", 1)
        if layout.flush_pd_sysram(flush_pd):
            return  # no sysram directories are shadowed: nothing can be using it
        # (tables in sysram are named from VRAM directories: a flush of those syncs them)
        pd = layout.flush_pd_addr(flush_pd)
        all_pds = bool(trigger & regs.PFFB_TRIGGER_ALL_PDS)
        for window, bar in ((self.bar1, regs.BAR1), (self.bar3, regs.BAR3)):
            if window.pv is None and (all_pds or window.guest_pd == pd):
                if not mode.lazy:
                    self.sync_window(window, bar)
                elif not window.pending():
                    count("shadow.bar_flushes_unchanged", 1)  # nothing to resync
                elif self._remapped_changed(window, bar):
                    self.sync_window(window, bar)
                else:
                    window.stale = True
                    count("shadow.bar_marked_stale", 1)
        for key, space in self.spaces.items():
            if all_pds or key == pd:
                if mode.lazy:
                    space.stale = True
                    count("shadow.marked_stale", 1)
                else:
                    self._sync_space(space)

    def _remapped_changed(self, window: BarWindow, bar: int) -> bool:
        """Whether a changed entry of the window is one the VMM has mapped straight in."""
        offsets = window.changed_offsets()
        if not offsets.size or self.remapper is None:
            return False
        return bool((self._remapped[bar].pages[offsets] != NOT_VRAM).any())

    def window_in_use(self, bar: int) -> BarWindow:
        """The guest is about to access BAR1/BAR3 through the mediator: resync the window
        first if a flush left it stale (lazy)."""
        window = self.bar1 if bar == regs.BAR1 else self.bar3
        if window.stale:
            self.sync_window(window, bar)
        return window

    def sync_window(self, window: BarWindow, bar: int, full: bool = False) -> None:
        self._sync_window(window, bar, full)
        self.refresh_remap()

    def _sync_window(self, window: BarWindow, bar: int, full: bool = False) -> None:
        window.sync(incremental=self.mode.incremental and not full)
        self.host.flush(self.host.bar1_pd if bar == regs.BAR1 else self.host.bar3_pd,
                        bar_vm=True)

    def set_bar_vm(self, bar: int, reg: int) -> None:
        """The guest wrote PBUS_BAR1_VM / PBUS_BAR3_VM."""
        self.vregs[_BAR_VM[bar]] = reg
        self.bind_window(bar, reg)

    def bind_window(self, bar: int, reg: int) -> None:
        """Bind a BAR window to the BAR VM that register value names."""
        window = self.bar1 if bar == regs.BAR1 else self.bar3
        inst = None
        pv = None
        if not layout.barvm_enabled(reg):
            window.bind(None, plain=True)  # MODE clear: a plain window onto its VRAM
            self.sync_window(window, bar)
            return
        if layout.barvm_target(reg) == regs.TARGET_VRAM:
            inst = layout.barvm_inst(reg)
            if self.policy.guest_vram_ok(inst, regs.RAMIN_SIZE):
                lo = self.vram.read_u32(self.policy.host_vram(inst + regs.RAMIN_PD_LO))
                hi = self.vram.read_u32(self.policy.host_vram(inst + regs.RAMIN_PD_HI))
                pv = self.pv_spaces.get(layout.ramin_ptr(lo, hi))
        window.bind(inst, pv)
        self.sync_window(window, bar)

    # ------------------------------------------------------------------ remap
    def sensitive_pages(self) -> set[int]:
        """Host VRAM pages the mediator must keep trapping: tables, RAMIN, BAR VM blocks."""
        guest_pages: set[int] = set(self.channels.ramin_pages())
        for space in self.spaces.values():
            guest_pages.update(space.guest_table_pages())
        guest_pages.update(self.bar1.guest_table_pages())
        guest_pages.update(self.bar3.guest_table_pages())
        return {self.policy.host_vram(p) for p in guest_pages}

    def set_remapper(self, listener: MappingListener | None) -> None:
        """The VMM's listener for BAR remap (None: it is going): what is remapped now, and
        whether PRAMIN stores may queue, are said to the new one."""
        if listener is None and self.remapper is not None:
            self.unmap_all()
        self.remapper = listener
        self.pramin_posting(self._pramin_posted)
        self.refresh_remap()

    def pramin_posting(self, allowed: bool) -> None:
        """Whether the guest's PRAMIN stores may wait in the VMM's queue for its next exit,
        in a remap mode (elsewhere the VMM queues them anyway): only while no channel is
        bound.  A PRAMIN store changes VRAM and the shadows' write history, which the
        next trapped access reads -- except a store into a bound channel's RAMIN, which
        rebuilds its shadow and can change what is remapped: the guest's next access
        must already see that.  Channels says when the bound set empties or fills."""
        self._pramin_posted = allowed
        if self.mode.remap and self.remapper is not None:
            self.remapper.post(regs.BAR0, regs.PRAMIN_WINDOW, regs.PRAMIN_WINDOW_SIZE, allowed)

    def refresh_remap(self) -> None:
        if not self.mode.remap or self.remapper is None:
            return
        for bar, window in ((regs.BAR1, self.bar1), (regs.BAR3, self.bar3)):
            if window.stale:  # what to remap is read from the window: a use of it
                self._sync_window(window, bar)
        sensitive = self.sensitive_pages()
        base = self.vram.host_address
        for bar, window in ((regs.BAR1, self.bar1), (regs.BAR3, self.bar3)):
            trapped = self.channels.poll_offsets() if bar == regs.BAR1 else set()
            plan = RemapPlan.build(window.host_pages, sensitive, trapped)
            unmaps, maps = self._remapped[bar].diff(plan)
            for first, n in unmaps:
                self.remapper.unmap(bar, first << 12, n << 12)
                self.meter.count("remap.unmaps", 1)
            for first, n, host in maps:
                self.remapper.map(bar, first << 12, base + host, n << 12)
                self.meter.count("remap.maps", 1)

    def dma_changed(self) -> None:
        """The VMM mapped or unmapped DMA: sysram entries are judged anew (the device's
        DMA table refuses unmapped memory at access time anyway; this keeps the shadows
        and their refusal counts honest)."""
        for space in self.spaces.values():
            space.sync(incremental=False)
            self.host.flush(space.shadow_pd)
        for window, bar in ((self.bar1, regs.BAR1), (self.bar3, regs.BAR3)):
            if window.guest_pd is not None or window.pv is not None:
                # unchanged entries may be judged differently now: no write history helps
                self.sync_window(window, bar, full=True)

    def unmap_all(self) -> None:
        """Take every remapped BAR page back from the VMM."""
        if self.remapper is not None:
            for bar, state in self._remapped.items():
                if (state.pages != NOT_VRAM).any():
                    self.remapper.unmap(bar, 0, state.pages.size << 12)
                self._remapped[bar] = RemapState.empty(state.pages.size)

    def remapped_pages(self) -> int:
        return sum(s.mapped for s in self._remapped.values())

    def teardown(self) -> None:
        """After the channels are off the device: empty the BAR windows (and make the
        BARs forget them), retire and free every shadow."""
        self.unmap_all()
        self.bar1.clear()
        self.bar3.clear()
        self.host.flush(self.host.bar1_pd, bar_vm=True)
        self.host.flush(self.host.bar3_pd, bar_vm=True)
        for space in self.spaces.values():
            self._retire(space.shadow_pd)
            space.release()
        for pv in self.pv_spaces.values():
            self._retire(pv.pd)
            pv.release()
        self.spaces.clear()
        self.pv_spaces.clear()
        self.part.shadow_pool.free(self.empty_pd)
