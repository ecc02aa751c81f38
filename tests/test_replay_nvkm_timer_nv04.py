"""nvkm/subdev/timer/nv04.c replayed: nv04_timer_time sets the time, nv04_timer_read reads
it, nv04_timer_alarm_init arms the alarm whose interrupt nv04_timer_intr acknowledges,
nv04_timer_alarm_fini disarms it.  Under the mediator each VM has its own."""

from __future__ import annotations

import time

from gpuvm.device import regs

from replay_rigs import target  # noqa: F401  (fixture)

NV04_PTIMER_INTR_0, NV04_PTIMER_INTR_EN_0 = 0x009100, 0x009140
NV04_PTIMER_TIME_0, NV04_PTIMER_TIME_1, NV04_PTIMER_ALARM_0 = 0x009400, 0x009410, 0x009420
MS = 1_000_000  # device ns


def nv04_timer_time(drv, t: int) -> None:
    drv.wr(NV04_PTIMER_TIME_1, t >> 32)
    drv.wr(NV04_PTIMER_TIME_0, t & 0xFFFFFFFF)


def nv04_timer_read(drv) -> int:
    while True:
        hi = drv.rd(NV04_PTIMER_TIME_1)
        lo = drv.rd(NV04_PTIMER_TIME_0)
        if hi == drv.rd(NV04_PTIMER_TIME_1):
            return hi << 32 | lo


def nv04_timer_alarm_init(drv, t: int) -> None:
    drv.wr(NV04_PTIMER_ALARM_0, t)
    drv.wr(NV04_PTIMER_INTR_EN_0, 0x00000001)


def nv04_timer_alarm_fini(drv) -> None:
    drv.wr(NV04_PTIMER_INTR_EN_0, 0x00000000)


def nv04_timer_intr(drv) -> bool:
    """True if the alarm had fired (nvkm_timer_alarm_trigger would run)."""
    stat = drv.rd(NV04_PTIMER_INTR_0)
    fired = bool(stat & 1)
    if fired:
        drv.wr(NV04_PTIMER_INTR_0, 0x00000001)
        stat &= ~1
    if stat:
        drv.wr(NV04_PTIMER_INTR_0, stat)
    return fired


def test_time_like_nv04_timer_time_and_read(target):  # noqa: F811
    """The time set is the time read (moving on from there); a VM's setting is its own."""
    drv = target.drv
    other_before = nv04_timer_read(target.other.drv) if target.other else 0
    t0 = 0x0000_1234_5678_9A00
    before = target.gpu.clock.now_ns()
    nv04_timer_time(drv, t0)
    t = nv04_timer_read(drv)
    assert t0 <= t <= t0 + (target.gpu.clock.now_ns() - before) and t & 0x1F == 0
    assert nv04_timer_read(drv) >= t
    if target.other is not None:
        assert nv04_timer_read(target.other.drv) < t0  # still the GPU's own time
        assert nv04_timer_read(target.other.drv) >= other_before


def test_alarm_like_nv04_timer_alarm_init_and_intr(target):  # noqa: F811
    """An alarm 5 ms of device time ahead fires: INTR_0 bit 0 and PMC_INTR bit 20 (and
    the VM's MSI); nv04_timer_intr's ack clears them; alarm_fini disarms."""
    drv = target.drv
    if target.irq_fd is not None:
        target.interrupts()
    now = nv04_timer_read(drv)
    nv04_timer_alarm_init(drv, (now + 5 * MS) & 0xFFFFFFFF)
    deadline = time.monotonic() + 10
    while not drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PTIMER:
        assert time.monotonic() < deadline, "the alarm never fired"
        time.sleep(0.001)
    assert nv04_timer_read(drv) >= now + 5 * MS - 32
    if target.irq_fd is not None:
        assert target.interrupts() > 0
        assert target.other.drv.rd(NV04_PTIMER_INTR_0) == 0
    assert nv04_timer_intr(drv)
    assert not drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PTIMER
    nv04_timer_alarm_fini(drv)
    assert drv.rd(NV04_PTIMER_INTR_EN_0) == 0


def test_alarm_after_a_time_write_follows_the_new_time(target):  # noqa: F811
    """nvkm arms alarms in its own time base: after nv04_timer_time, ALARM_0 is compared
    with the counter as set, not the device clock."""
    drv = target.drv
    nv04_timer_time(drv, 0x7_0000_0000)
    nv04_timer_alarm_init(drv, 0x0000_0000 + 2 * MS)
    deadline = time.monotonic() + 10
    while not drv.rd(NV04_PTIMER_INTR_0) & 1:
        assert time.monotonic() < deadline, "the alarm never fired"
        time.sleep(0.001)
    assert nv04_timer_read(drv) >= 0x7_0000_0000 + 2 * MS - 32
    assert nv04_timer_intr(drv)
    nv04_timer_alarm_fini(drv)
