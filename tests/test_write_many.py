"""Posted stores handed to a vGPU at once (`VGpu.write_many`, what a drain of KVM's
coalesced ring and a REGION_WRITE_MULTI become) leave exactly what the same stores leave
one `write` at a time: every counter (the vGPU's and the device's), VRAM, faults, and the
shadows' write history -- through runs that land at once (BAR3 page-table entries, PRAMIN
words) and every case that must fall back to one at a time (a bound channel's RAMIN, a
page that faults, misaligned stores, a run cut by a register store)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import regs
from gpuvm.device.gpu import Gpu
from gpuvm.mediator.mediator import Mediator
from gpuvm.vfio.device import PostedStores

from test_mediator_isolation import Vm

BAR3_SIZE = 1 * regs.MiB


class World:
    """A GPU, its mediator and one fv VM with a bound channel and BAR3 set up: page 0
    of BAR3 is a data page, page 1 the channel's RAMIN, page 2 BAR3's own page table
    (as a driver writes its PTEs), page 3 unmapped."""

    def __init__(self) -> None:
        self.gpu = Gpu(time_scale=1000, vram_size=1024 * regs.MiB).start()
        self.med = Mediator(self.gpu)
        self.vm = Vm(self.med, "guest")
        drv = self.vm.drv
        space = drv.setup_bar3(BAR3_SIZE)
        self.data = drv.alloc(regs.SMALL_PAGE)
        self.ramin = self.vm.rig.ch.inst
        drv.map(space, 0, self.data)
        drv.map(space, regs.SMALL_PAGE, self.ramin)
        (table,) = space.pts.values()
        drv.map(space, 2 * regs.SMALL_PAGE, table)
        drv.flush(space, bar_vm=True)
        drv.vram_wr32(self.data, 0)  # the PRAMIN window now covers the data pages
        self.window = regs.PRAMIN_WINDOW + (self.data & 0xFFFF)

    def state(self) -> tuple[dict, dict, bytes, list, list]:
        vgpu = self.vm.vgpu
        part = vgpu.policy
        vram = self.gpu.vram.u8[part.vram_base:part.vram_base + vgpu.part.vram_size]
        return (dict(vgpu.counts), self.gpu.counters(), vram.tobytes(),
                [f.__dict__ for f in vgpu.faults()],
                vgpu.shadowing.bar3.changed_offsets().tolist())

    def close(self) -> None:
        self.med.close()
        self.gpu.release_memory()


def stores(world: World) -> list[tuple[int, int, int, int]]:
    """A drain's worth of stores, every case in it."""
    page, rng = regs.SMALL_PAGE, np.random.default_rng(7)
    out = [(regs.BAR3, 0x100 + 8 * i, 8, int(v))  # page-table entries in a row
           for i, v in enumerate(rng.integers(0, 2**63, 64, dtype=np.uint64))]
    out += [(regs.BAR3, 0x400 + 4 * i, 4, 0x1000 + i) for i in range(16)]
    out += [(regs.BAR3, 0x600 + 8 * i, 8, i) for i in range(4)]
    out.append((0, regs.PMC_INTR_EN, 4, 1))  # a register store cuts the run
    out += [(regs.BAR3, 0x620 + 8 * i, 8, i) for i in range(4)]
    out += [(regs.BAR3, 0x804 + 8 * i, 8, 0xABCD0000 + i) for i in range(4)]  # misaligned
    ramin_words = world.gpu.vram.u32[(world.vm.vgpu.policy.host_vram(world.ramin) >> 2):][:8]
    out += [(regs.BAR3, page + 4 * i, 4, int(w))  # the channel's RAMIN, as it is
            for i, w in enumerate(ramin_words)]
    out += [(regs.BAR3, 2 * page + 0x100 + 8 * i, 8, 0) for i in range(16)]  # BAR3's PTEs
    out += [(regs.BAR3, 3 * page - 16 + 8 * i, 8, 0) for i in range(4)]  # into page 3
    out += [(0, world.window + 0x200 + 4 * i, 4, 0xFEED0000 + i) for i in range(32)]
    out += [(0, world.window + 0x2 + 4 * i, 4, i) for i in range(3)]  # misaligned PRAMIN
    return out


@pytest.fixture
def worlds():
    made = [World(), World()]
    yield made
    for w in made:
        w.close()


def test_write_many_leaves_what_one_write_each_leaves(worlds):
    one, many = worlds
    assert one.state() == many.state()
    for region, offset, size, value in stores(one):
        one.vm.vgpu.write(region, offset, size, value)
    many.vm.vgpu.write_many(PostedStores.of(stores(many)))
    after_one, after_many = one.state(), many.state()
    for name, a, b in zip(("vGPU counts", "device counts", "VRAM", "faults",
                           "BAR3 write history"), after_one, after_many):
        assert a == b, name
    counts = after_many[0]
    assert counts["trap.bar3.forward.write"] == 64 + 16 + 4 + 4 + 4 + 8 + 16 + 4
    assert after_many[4], "the BAR3 table's write history names the stores into it"
    assert counts["shadow.ramin_reflects"] == 8  # one per store, as one at a time
    assert counts["vm.faults.bar3"] == 2  # the two stores into the unmapped page
    assert counts["trap.refused.pramin"] == 3


def test_a_run_lands_at_once(worlds):
    """The point of it: a run of page-table entries is one translation, not one each."""
    _, world = worlds
    aperture = world.gpu.bar3
    taken = []
    real = aperture.write_run

    def write_run(offset: int, size: int, values) -> bool:
        taken.append((len(values), real(offset, size, values)))
        return taken[-1][1]
    aperture.write_run = write_run
    world.vm.vgpu.write_many(PostedStores.of([(regs.BAR3, 8 * i, 8, i) for i in range(100)]))
    assert taken == [(100, True)]  # all at once
    assert world.gpu.vram.u64[(world.vm.vgpu.policy.host_vram(world.data) >> 3) + 99] == 99
