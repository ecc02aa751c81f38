"""What waking a sleeping thread costs the thread that wakes it.

CPython 3.11 lets its interpreter lock go by freeing it and waking ONE waiting thread
(`drop_gil` signals a condition variable: a futex wake), and the thread that lets it go
pays for that wake-up on its own core before it goes on -- while the lock is already
free, so a thread that runs meanwhile takes it (`take_gil` does not reserve it for the
woken one).  On a virtual machine whose idle vCPUs halt, waking a thread whose vCPU
halted goes through the hypervisor, and the waker pays several microseconds: this 2-core
host (`guest_halt_poll_ns` 0: its idle vCPUs halt at once) 5.3-8.7 us, two lent 16-core
machines 1.3-1.8 us (2026-11-29, `signal_ns`).  A model of the lock as CPython writes
it needs this cost per drop that wakes a waiter: fitted to `gpuvm calibrate
--lock-probe` on this host it came out at 6.9 us, and read into the validation bundles
it put the most points within 10% at 6 us here and at 1.5-6 lent
(docs/model-validation.md, "CPython's lock as it is written").  So each sitting
measures it beside the lock's other costs.

The measurement: a thread sleeps on a lock (threading.Lock.acquire blocks in the kernel
with the interpreter lock let go); this thread waits SETTLE_US, so the sleeper is asleep
and its core idle, then times its own release of that lock -- the wake-up -- and waits
for the sleeper to answer on a second lock.  Beside each, the release of a lock nobody
waits for.  The medians of SAMPLES (a second or so).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from gpuvm.calibrate.wake import spin_us

SAMPLES = 2000
SETTLE_US = 100.0  # how long the sleeper sleeps before each wake-up
ABOUT_KEY = "wake_cost"  # where a validation bundle's "about" keeps it


@dataclass(frozen=True)
class WakeCost:
    """A release that wakes a sleeping thread, and one nobody waits for (wall, ns)."""
    waking_ns: float  # median
    waking_p10_ns: float
    waking_p90_ns: float
    plain_ns: float  # median
    samples: int
    settle_us: float

    @property
    def signal_ns(self) -> float:
        """What the wake-up itself costs the waker: waking less plain."""
        return max(0.0, self.waking_ns - self.plain_ns)

    def text(self) -> str:
        return (f"{self.signal_ns / 1e3:.2f} us (a release waking a thread asleep "
                f"{self.settle_us:g} us: median {self.waking_ns / 1e3:.2f}, p10-p90 "
                f"{self.waking_p10_ns / 1e3:.2f}-{self.waking_p90_ns / 1e3:.2f}; "
                f"nobody waiting {self.plain_ns / 1e3:.2f}; {self.samples} each)")

    def to_about(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_about(cls, about: Mapping[str, Any]) -> "WakeCost | None":
        """From a bundle's "about"; None where it was not measured (bundles from
        before); ValueError naming the key where it is malformed."""
        kept = about.get(ABOUT_KEY)
        if kept is None:
            return None
        try:
            return cls(float(kept["waking_ns"]), float(kept["waking_p10_ns"]),
                       float(kept["waking_p90_ns"]), float(kept["plain_ns"]),
                       int(kept["samples"]), float(kept["settle_us"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"a bundle's {ABOUT_KEY!r} is malformed: {e!r}") from None


def measure(samples: int = SAMPLES, settle_us: float = SETTLE_US) -> WakeCost:
    """Time `samples` releases that wake a thread asleep `settle_us`, and as many that
    wake nobody (see the module)."""
    if samples < 1 or settle_us < 0:
        raise ValueError(f"measure needs a sample and a settle of >= 0 us, got "
                         f"{samples}, {settle_us:g}")
    wake, answer, alone = threading.Lock(), threading.Lock(), threading.Lock()
    wake.acquire()
    answer.acquire()
    finished = False

    def sleeper() -> None:
        while True:
            wake.acquire()  # asleep here until released
            if finished:
                return
            answer.release()

    thread = threading.Thread(target=sleeper, name="wake-cost-sleeper", daemon=True)
    thread.start()
    waking: list[int] = []
    plain: list[int] = []
    try:
        for _ in range(samples):
            spin_us(settle_us)
            t0 = time.perf_counter_ns()
            wake.release()
            waking.append(time.perf_counter_ns() - t0)
            answer.acquire()
            alone.acquire()
            t0 = time.perf_counter_ns()
            alone.release()
            plain.append(time.perf_counter_ns() - t0)
    finally:
        finished = True
        if wake.locked():  # else the sleeper is awake already and sees `finished`
            wake.release()
        thread.join(timeout=1.0)
    deciles = statistics.quantiles(waking, n=10) if len(waking) > 1 else waking * 9
    return WakeCost(float(statistics.median(waking)), float(deciles[0]),
                    float(deciles[-1]), float(statistics.median(plain)), samples,
                    settle_us)
