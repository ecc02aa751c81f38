"""Engine occupancy: GPU work is non-preemptive, so each engine is simply busy until the
end of the work it accepted, and later work queues behind it."""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.device import regs


@dataclass
class Engine:
    """One engine's occupancy: GPU work is not preempted, so the engine is busy until the end
    of the work it accepted, and what it ran and for how long is counted for the scheduler."""

    name: str
    fault_unit: int
    enable_bit: int
    busy_until: int = 0
    busy_ns: int = 0  # total device time this engine has worked
    current_inst: int | None = None

    def busy(self, now: int) -> bool:
        return now < self.busy_until

    def occupy(self, now: int, duration: int, inst: int) -> int:
        """Accept work of `duration` ns; returns the device time it completes."""
        start = max(now, self.busy_until)
        self.busy_until = start + duration
        self.busy_ns += duration
        self.current_inst = inst
        return self.busy_until


@dataclass
class Engines:
    """The GPU's three engines (graph and two copy engines), each with its fault unit and PMC
    enable bit."""

    graph: Engine
    copy0: Engine
    copy1: Engine

    @classmethod
    def create(cls) -> "Engines":
        return cls(Engine("PGRAPH", regs.FAULT_UNIT_PGRAPH, regs.PMC_ENABLE_PGRAPH),
                   Engine("PCOPY0", regs.FAULT_UNIT_PCOPY0, regs.PMC_ENABLE_PCOPY0),
                   Engine("PCOPY1", regs.FAULT_UNIT_PCOPY1, regs.PMC_ENABLE_PCOPY1))

    def by_id(self, engine_id: int) -> Engine | None:
        return {regs.ENGINE_PGRAPH: self.graph, regs.ENGINE_PCOPY0: self.copy0,
                regs.ENGINE_PCOPY1: self.copy1}.get(engine_id)
