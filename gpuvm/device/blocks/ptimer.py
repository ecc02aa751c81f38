"""PTIMER: nanoseconds from the device clock, settable, with an alarm and its interrupt.

nvkm programs it as nv04_timer does: TIME_1 then TIME_0 to set the time, ALARM_0 with
INTR_EN_0 = 1 to arm the alarm, INTR_0 bit 0 (PMC_INTR bit 20) when it fires, written
back to acknowledge.  A set time is an offset on the device clock (which only moves
forward, for everyone); the alarm fires at the device time the counter's low 32 bits
reach ALARM_0.  Others -- a mediator's virtual timers -- may ask for a call at a device
time through `call_at`; the engine loop fires both (see Gpu._engine_loop).
"""

from __future__ import annotations

from typing import Callable

from gpuvm.device import regs
from gpuvm.device.clock import DeviceClock
from gpuvm.device.counters import Counters
from gpuvm.device.events import DeviceEvents
from gpuvm.device.mmio_bus import RegisterBlock

WRAP = 1 << 32


def alarm_time(now_counter: int, alarm: int) -> int:
    """How far ahead of `now_counter` its low 32 bits next equal `alarm` (0: now)."""
    return (alarm - now_counter) % WRAP


class Ptimer(RegisterBlock):
    """The timer a driver sets and arms; an offset on the device clock, so setting it
    never moves device time (the engines' and every other VM's).  Given the device
    clock, the counters and the device's events (an alarm signals; arming wakes the
    engine thread, which fires alarms), not the Gpu."""

    name, start, size = "ptimer", regs.BLOCK_PTIMER, 0x1000

    def __init__(self, clock: DeviceClock, counts: Counters, events: DeviceEvents) -> None:
        super().__init__()
        self.clock = clock
        self.counts = counts
        self.events = events
        self.offset = 0  # counter = device clock + offset (a TIME write moves it)
        self.time_1 = 0  # TIME_1 as last written: the high half a TIME_0 write commits
        self.alarm = 0
        self.intr = 0
        self.intr_en = 0
        self.ratio = [0, 0]  # NUMERATOR, DENOMINATOR
        self.alarm_at: int | None = None  # device time the armed alarm fires
        self.calls: dict[object, tuple[int, Callable[[], None]]] = {}
        self.reg(regs.PTIMER_TIME_0, read=lambda: self.counter() & regs.PTIMER_TIME_0_MASK,
                 write=self._set_time_0)
        self.reg(regs.PTIMER_TIME_1, read=lambda: (self.counter() >> 32) & 0xFFFFFFFF,
                 write=self._set_time_1, plain=True)
        self.reg(regs.PTIMER_ALARM_0, read=lambda: self.alarm, write=self._set_alarm)
        self.reg(regs.PTIMER_INTR_0, read=lambda: self.intr, write=self._ack)
        self.reg(regs.PTIMER_INTR_EN_0, read=lambda: self.intr_en, write=self._set_intr_en)
        for i, off in enumerate((regs.PTIMER_NUMERATOR, regs.PTIMER_DENOMINATOR)):
            self.reg(off, read=lambda i=i: self.ratio[i],
                     write=lambda v, i=i: self.ratio.__setitem__(i, v), plain=True)

    def counter(self) -> int:
        return (self.clock.now_ns() + self.offset) % (1 << 64)

    def _set_time_1(self, value: int) -> None:
        self.time_1 = value

    def _set_time_0(self, value: int) -> None:
        self.offset = ((self.time_1 << 32) | value) - self.clock.now_ns()
        self._arm()

    def _set_alarm(self, value: int) -> None:
        self.alarm = value
        self._arm()

    def _set_intr_en(self, value: int) -> None:
        self.intr_en = value
        self._arm()

    def _ack(self, value: int) -> None:
        self.intr &= ~value

    def _arm(self) -> None:
        if self.intr_en & regs.PTIMER_INTR_ALARM:
            now = self.clock.now_ns()
            self.alarm_at = now + alarm_time(now + self.offset, self.alarm)
        else:
            self.alarm_at = None
        self.events.kick_engines()

    def call_at(self, key: object, device_ns: int | None,
                fn: Callable[[], None] | None = None) -> None:
        """Call fn (device lock held) once the device time reaches device_ns; None
        cancels key's call."""
        if device_ns is None or fn is None:
            self.calls.pop(key, None)
        else:
            self.calls[key] = (device_ns, fn)
        self.events.kick_engines()

    def fire(self, now: int) -> int | None:
        """Raise what is due at device time `now`; returns when the next thing is due."""
        if self.alarm_at is not None and now >= self.alarm_at:
            self.intr |= regs.PTIMER_INTR_ALARM
            self.counts.inc("ptimer.alarms")
            self.alarm_at += WRAP  # the low word comes round again in 2^32 ns
            self.events.signal()
        for key, (t, fn) in list(self.calls.items()):
            if now >= t:
                del self.calls[key]
                fn()
        times = [t for t, _ in self.calls.values()]
        if self.alarm_at is not None:
            times.append(self.alarm_at)
        return min(times, default=None)

    def pending(self) -> bool:
        return bool(self.intr & self.intr_en)
