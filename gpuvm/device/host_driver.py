"""A small driver in Python that programs the GPU only through BAR accesses and memory.

It is what the device tests and `gpuvm bench device` use to stand the device up the way
the guest driver does (page tables through PRAMIN, BAR1 USERD, RAMIN, runlist, doorbell),
without needing a guest.  It talks to anything with mmio_read/mmio_write, so it can sit
in front of the bare device or a vGPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpuvm.device import layout, regs


class MmioTarget(Protocol):
    """What the host driver programs: the bare device or a vGPU, through BAR accesses alone."""

    def mmio_read(self, bar: int, offset: int, size: int) -> int: ...

    def mmio_write(self, bar: int, offset: int, size: int, value: int) -> None: ...


@dataclass
class AddressSpace:
    """A GPU address space the host driver built: its page directory and small page tables in
    VRAM."""

    pd: int  # VRAM address of the page directory
    pts: dict[int, int] = field(default_factory=dict)  # PDE index -> small PT address


@dataclass
class HostChannel:
    """A channel the host driver set up, with the VRAM and GPU virtual addresses of its USERD,
    ring and push buffer, so a test can submit to it."""

    chid: int
    space: AddressSpace
    inst: int
    userd: int  # VRAM address of the USERD page
    gpfifo_va: int
    gpfifo_entries: int
    pushbuf_va: int
    pushbuf: int  # VRAM address behind pushbuf_va
    ring: int  # VRAM address behind gpfifo_va
    put: int = 0
    pb_pos: int = 0


def method(subc: int, mthd: int, *values: int, kind: int = regs.MTHD_TYPE_INC) -> list[int]:
    """A method header followed by its data words."""
    return [(kind << regs.MTHD_TYPE_SHIFT) | (len(values) << regs.MTHD_COUNT_SHIFT) |
            (subc << regs.MTHD_SUBC_SHIFT) | (mthd >> 2), *values]


class HostDriver:
    """A driver in Python that stands the device up as the guest driver does (page tables
    through PRAMIN, BAR1 USERD, RAMIN, runlist, doorbell), for the device tests and `gpuvm
    bench device`, without a guest."""

    PUSHBUF_BYTES = 64 * 1024
    GPFIFO_LOG2 = 9

    def __init__(self, gpu: MmioTarget, vram_base: int = 0x100000) -> None:
        self.gpu = gpu
        self._next = vram_base
        self._pramin_base = -1
        self.bar1_space: AddressSpace | None = None
        self.bar1_inst = 0
        self.poll_va = 0

    # ------------------------------------------------------------------ raw access
    def rd(self, offset: int) -> int:
        return self.gpu.mmio_read(regs.BAR0, offset, 4)

    def wr(self, offset: int, value: int) -> None:
        self.gpu.mmio_write(regs.BAR0, offset, 4, value)

    def _window(self, addr: int) -> int:
        base = addr & ~0xFFFF
        if base != self._pramin_base:
            self.wr(regs.PBUS_PRAMIN_BASE, base >> regs.PBUS_PRAMIN_BASE_SHIFT)
            self._pramin_base = base
        return regs.PRAMIN_WINDOW + (addr - base)

    def vram_wr32(self, addr: int, value: int) -> None:
        self.wr(self._window(addr), value & 0xFFFFFFFF)

    def vram_rd32(self, addr: int) -> int:
        return self.rd(self._window(addr))

    def vram_wr64(self, addr: int, value: int) -> None:
        self.vram_wr32(addr, value & 0xFFFFFFFF)
        self.vram_wr32(addr + 4, value >> 32)

    def vram_write(self, addr: int, data: bytes) -> None:
        words = np.frombuffer(data.ljust((len(data) + 3) & ~3, b"\0"), dtype="<u4")
        for i, w in enumerate(words.tolist()):
            self.vram_wr32(addr + 4 * i, w)

    def alloc(self, size: int, align: int = regs.SMALL_PAGE) -> int:
        addr = (self._next + align - 1) & ~(align - 1)
        self._next = addr + size
        return addr

    # ------------------------------------------------------------------ bring-up
    def init(self) -> None:
        assert self.rd(regs.PMC_BOOT_0) == regs.PMC_BOOT_0_QUADRO_6000
        self.wr(regs.PMC_ENABLE, regs.PMC_ENABLE_PFIFO | regs.PMC_ENABLE_PGRAPH |
                regs.PMC_ENABLE_PCOPY0 | regs.PMC_ENABLE_PCOPY1 | regs.PMC_ENABLE_PTIMER)
        self.wr(regs.PFIFO_CTRL, regs.PFIFO_CTRL_ENABLE)
        self.wr(regs.PFIFO_INTR_EN, 0xFFFFFFFF)

    def vram_size(self) -> int:
        parts = self.rd(regs.PFB_PART_COUNT)
        return sum(self.rd(regs.PFBPA_PART_SIZE_MIB + p * regs.PFBPA_PART_STRIDE)
                   for p in range(parts)) * regs.MiB

    # ------------------------------------------------------------------ address spaces
    def new_space(self) -> AddressSpace:
        # fresh VRAM is zero, so a new directory needs no writes to be empty
        return AddressSpace(self.alloc(regs.PD_BYTES))

    def _pt(self, space: AddressSpace, pde: int) -> int:
        pt = space.pts.get(pde)
        if pt is None:
            pt = space.pts[pde] = self.alloc(regs.SMALL_PTES_PER_PT * regs.PTE_SIZE)
            self.vram_wr64(space.pd + pde * regs.PDE_SIZE, layout.pde_small(pt))
        return pt

    def map(self, space: AddressSpace, va: int, phys: int | list[int], npages: int = 1,
            target: int = regs.TARGET_VRAM, read_only: bool = False) -> None:
        """Map npages 4 KiB pages at va; phys is a base address or one address per page."""
        frames = phys if isinstance(phys, list) else [phys + i * regs.SMALL_PAGE
                                                       for i in range(npages)]
        for i, frame in enumerate(frames):
            page_va = va + i * regs.SMALL_PAGE
            pde, idx = page_va >> regs.PDE_SPAN_SHIFT, (page_va >> 12) & (regs.SMALL_PTES_PER_PT - 1)
            self.vram_wr64(self._pt(space, pde) + idx * regs.PTE_SIZE,
                           layout.pte(frame, target, read_only))

    def unmap(self, space: AddressSpace, va: int, npages: int = 1) -> None:
        for i in range(npages):
            page_va = va + i * regs.SMALL_PAGE
            pde, idx = page_va >> regs.PDE_SPAN_SHIFT, (page_va >> 12) & (regs.SMALL_PTES_PER_PT - 1)
            self.vram_wr64(self._pt(space, pde) + idx * regs.PTE_SIZE, 0)

    def flush(self, space: AddressSpace, bar_vm: bool = False) -> None:
        while not (self.rd(regs.PFFB_VM_CFG) >> regs.PFFB_VM_CFG_SLOTS_SHIFT) & \
                regs.PFFB_VM_CFG_SLOTS_MASK:
            pass
        self.wr(regs.PFFB_FLUSH_PD, layout.flush_pd_word(space.pd))
        self.wr(regs.PFFB_FLUSH_TRIGGER, regs.PFFB_TRIGGER_BAR_VM if bar_vm
                else regs.PFFB_TRIGGER_GO | regs.PFFB_TRIGGER_ALL_PAGES)
        while not self.rd(regs.PFFB_VM_CFG) & regs.PFFB_VM_CFG_FLUSH_DONE:
            pass

    def _instance(self, space: AddressSpace, limit: int) -> int:
        inst = self.alloc(regs.RAMIN_SIZE)
        pd_lo, pd_hi = layout.ramin_ptr_words(space.pd)
        limit_lo, limit_hi = layout.ramin_limit_words(limit)
        self.vram_wr32(inst + regs.RAMIN_PD_LO, pd_lo)
        self.vram_wr32(inst + regs.RAMIN_PD_HI, pd_hi)
        self.vram_wr32(inst + regs.RAMIN_LIMIT_LO, limit_lo)
        self.vram_wr32(inst + regs.RAMIN_LIMIT_HI, limit_hi)
        return inst

    def setup_bar1(self, size: int) -> AddressSpace:
        self.bar1_space, self.bar1_inst = self._setup_bar(regs.PBUS_BAR1_VM, size)
        return self.bar1_space

    def setup_bar3(self, size: int) -> AddressSpace:
        """BAR3 through an address space of its own (map pages into it, then flush with
        bar_vm=True), as nouveau sets up its BAR3 page-table window."""
        return self._setup_bar(regs.PBUS_BAR3_VM, size)[0]

    def _setup_bar(self, vm_reg: int, size: int) -> tuple[AddressSpace, int]:
        space = self.new_space()
        inst = self._instance(space, size - 1)
        self.wr(vm_reg, layout.barvm_word(inst))
        return space, inst

    # ------------------------------------------------------------------ channels
    def create_channel(self, chid: int, space: AddressSpace, gpfifo_va: int,
                       poll_va: int = 0x100000) -> HostChannel:
        """RAMIN, USERD (BAR1 poll area), GPFIFO and pushbuffer, as nouveau lays them out."""
        assert self.bar1_space is not None, "set up BAR1 first"
        if not self.poll_va:
            self.poll_va = poll_va
            self.wr(regs.PFIFO_USERD_POLL, layout.userd_poll_word(poll_va))
        userd = self.alloc(regs.USERD_STRIDE)
        self.map(self.bar1_space, self.poll_va + chid * regs.USERD_STRIDE, userd)
        self.flush(self.bar1_space, bar_vm=True)
        entries = 1 << self.GPFIFO_LOG2
        ring = self.alloc(entries * regs.GPFIFO_ENTRY_SIZE)
        pushbuf = self.alloc(self.PUSHBUF_BYTES)
        pushbuf_va = gpfifo_va + regs.SMALL_PAGE
        self.map(space, gpfifo_va, ring)
        self.map(space, pushbuf_va, pushbuf, self.PUSHBUF_BYTES // regs.SMALL_PAGE)
        self.flush(space)
        inst = self._instance(space, regs.VA_LIMIT - 1)
        self.vram_wr32(inst + regs.RAMIN_USERD_LO, layout.ramin_ptr_lo(userd))
        self.vram_wr32(inst + regs.RAMIN_SIGNATURE, regs.RAMIN_SIGNATURE_VALUE)
        gp_lo, gp_hi = layout.ramin_gpfifo_words(gpfifo_va, self.GPFIFO_LOG2)
        self.vram_wr32(inst + regs.RAMIN_GPFIFO_LO, gp_lo)
        self.vram_wr32(inst + regs.RAMIN_GPFIFO_HI, gp_hi)
        self.wr(regs.PFIFO_CHAN_TABLE + chid * regs.PFIFO_CHAN_STRIDE, layout.chan_word(inst))
        self.wr(regs.PFIFO_CHAN_STATE + chid * regs.PFIFO_CHAN_STRIDE,
                regs.PFIFO_CHAN_STATE_CREATE)
        return HostChannel(chid, space, inst, userd, gpfifo_va, entries, pushbuf_va, pushbuf,
                           ring)

    def submit_runlist(self, chids: list[int]) -> None:
        rl = self.alloc(max(1, len(chids)) * regs.RUNLIST_ENTRY_SIZE)
        for i, word in enumerate(layout.runlist_entries(chids).tolist()):
            self.vram_wr32(rl + 4 * i, word)
        self.wr(regs.PFIFO_RUNLIST_ADDR, layout.runlist_word(rl))
        self.wr(regs.PFIFO_RUNLIST_SUBMIT, len(chids))
        self.wait_runlist()

    def wait_runlist(self) -> None:
        """nouveau's gf100_fifo_runlist_commit: sleep until the runlist event interrupt
        (PFIFO_INTR bit 30, status 0x2a00 bit 28) is acked and PENDING reads clear."""
        while not self.rd(regs.PFIFO_INTR) & regs.PFIFO_INTR_RUNLIST:
            pass
        if self.rd(regs.PFIFO_INTR_RUNLIST_STATUS) & regs.PFIFO_RUNLIST_EVENT_DONE:
            self.wr(regs.PFIFO_INTR_RUNLIST_STATUS, regs.PFIFO_RUNLIST_EVENT_DONE)
        while self.rd(regs.PFIFO_RUNLIST_STATUS) & regs.PFIFO_RUNLIST_PENDING:
            pass

    def push(self, ch: HostChannel, words: list[int]) -> None:
        """Write a pushbuffer segment, its GPFIFO entry, and ring the doorbell."""
        nbytes = 4 * len(words)
        if ch.pb_pos + nbytes > self.PUSHBUF_BYTES:
            ch.pb_pos = 0
        self.vram_write(ch.pushbuf + ch.pb_pos, np.array(words, dtype="<u4").tobytes())
        va = ch.pushbuf_va + ch.pb_pos
        ch.pb_pos += nbytes
        entry_addr = ch.ring + ch.put * regs.GPFIFO_ENTRY_SIZE
        word0, word1 = layout.gpfifo_entry(va, len(words))
        self.vram_wr32(entry_addr, word0)
        self.vram_wr32(entry_addr + 4, word1)
        ch.put = (ch.put + 1) % ch.gpfifo_entries
        self.doorbell(ch)

    def doorbell(self, ch: HostChannel) -> None:
        self.gpu.mmio_write(regs.BAR1, self.poll_va + ch.chid * regs.USERD_STRIDE +
                            regs.USERD_GP_PUT, 4, ch.put)

    # ------------------------------------------------------------------ command helpers
    @staticmethod
    def bind(subc: int, cls: int, engine: int) -> list[int]:
        return method(subc, regs.HOST_OBJECT, cls | (engine << regs.HOST_OBJECT_ENGINE_SHIFT))

    @staticmethod
    def release(va: int, seq: int, short: bool = True) -> list[int]:
        return method(0, regs.HOST_SEMAPHORE_ADDR_HI, va >> 32, va & 0xFFFFFFFF, seq,
                      regs.SEM_RELEASE | (regs.SEM_SHORT if short else 0))

    @staticmethod
    def copy(subc: int, src: int, dst: int, nbytes: int) -> list[int]:
        """nouveau's nvc0_bo_move_copy: 4 KiB lines, at most 8191 per launch, EXEC 0x110;
        a tail shorter than a page goes as one line of its own."""
        words: list[int] = []
        page = regs.SMALL_PAGE
        pages, tail = divmod(nbytes, page)
        while pages or tail:
            if pages:
                lines, line = min(pages, regs.COPY_YCNT_MASK), page
                pages -= lines
            else:
                lines, line, tail = 1, tail, 0
            words += (method(subc, regs.COPY_SRC_HI, src >> 32, src & 0xFFFFFFFF, dst >> 32,
                             dst & 0xFFFFFFFF, line, line, line, lines)
                      + method(subc, regs.COPY_LAUNCH, regs.COPY_LAUNCH_NOUVEAU))
            src += line * lines
            dst += line * lines
        return words

    @staticmethod
    def launch(subc: int, code_va: int, cb_va: int, params: list[int]) -> list[int]:
        return (method(subc, regs.COMPUTE_CODE_ADDR_HI, code_va >> 32, code_va & 0xFFFFFFFF)
                + method(subc, regs.COMPUTE_CB_SIZE, 4 * len(params), cb_va >> 32,
                         cb_va & 0xFFFFFFFF, 0)
                + method(subc, regs.COMPUTE_CB_DATA, *params, kind=regs.MTHD_TYPE_NONINC)
                + method(subc, regs.COMPUTE_GRID_XY, 1, 1)
                + method(subc, regs.COMPUTE_LAUNCH, 0))
