"""A guest store reaches a shadow instance block exactly when it lands in a bound channel's
RAMIN page, however the channel's binding changed before.

Channels.reflect answers the common store (no channel's RAMIN) from a set of the bound
channels' RAMIN pages rather than a scan of every channel; this holds that set exact
through binding, unbinding, rebinding and a second channel: a set missing a bound page
misses a reflection (the shadow keeps the guest's old directory).
"""

from __future__ import annotations

import pytest

from gpuvm.device import layout, regs
from gpuvm.device.gpu import Gpu
from gpuvm.mediator.mediator import Mediator

from test_device_end_to_end import VA_GPFIFO
from test_mediator_isolation import Vm


@pytest.fixture
def med():
    gpu = Gpu(time_scale=1000, vram_size=3 * 1024 * regs.MiB).start()
    m = Mediator(gpu)
    yield m
    m.close()
    gpu.release_memory()


def test_a_store_is_reflected_exactly_when_it_lands_in_a_bound_ramin_page(med):
    vm = Vm(med, "guest")
    drv, ch0 = vm.drv, vm.rig.ch
    table0 = regs.PFIFO_CHAN_TABLE + ch0.chid * regs.PFIFO_CHAN_STRIDE
    word0 = drv.rd(table0)

    def reflects_after(addr: int) -> int:
        """Rewrite the word at `addr` with its own value: how many reflections it made."""
        before = vm.vgpu.counts.get("shadow.ramin_reflects", 0)
        drv.vram_wr32(addr, drv.vram_rd32(addr))
        return vm.vgpu.counts.get("shadow.ramin_reflects", 0) - before

    pd_lo = regs.RAMIN_PD_LO
    assert reflects_after(ch0.inst + pd_lo) == 1
    assert reflects_after(ch0.inst + 0xFFC) == 1  # anywhere in the page
    assert reflects_after(ch0.inst + 0x1000) == 0  # the next page is not RAMIN
    assert reflects_after(vm.rig.a) == 0

    drv.wr(table0, 0)  # unbound: its old RAMIN is plain memory again
    assert reflects_after(ch0.inst + pd_lo) == 0

    ch1 = drv.create_channel(1, drv.new_space(), VA_GPFIFO)
    assert reflects_after(ch1.inst + pd_lo) == 1
    assert reflects_after(ch0.inst + pd_lo) == 0

    drv.wr(table0, word0)  # bound again at its old RAMIN
    assert reflects_after(ch0.inst + pd_lo) == 1
    assert reflects_after(ch1.inst + pd_lo) == 1

    drv.wr(table0, layout.chan_word(ch1.inst))  # both on one RAMIN page
    assert reflects_after(ch1.inst + pd_lo) == 2
    assert reflects_after(ch0.inst + pd_lo) == 0
