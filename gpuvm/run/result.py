"""What one VM's run came to: `VmResult`, made by the run loop (gpuvm/run/execute.py)
and by the loop for VMs in processes of their own (gpuvm/run/isolated.py), read by the
tables, the CLI and the experiment runner.  A module of its own so both loops can make
it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.device.faults import ChannelFault
from gpuvm.run.spec import ServedTime, VmSpec
from gpuvm.vmm.guest_session import GuestOutcome, GuestSession
from scheduler.metrics import VmMetrics


@dataclass
class VmResult:
    """One VM's run: its spec, what its guest reported, the faults its channels took and
    what the scheduler and (isolated) the server saw of it."""

    spec: VmSpec
    outcome: GuestOutcome
    faults: list[ChannelFault]
    scheduler: VmMetrics | None = None  # what the GPU scheduler saw (mediated modes)
    served: ServedTime | None = None  # a VM in its own process: the server's time on it

    @property
    def session(self) -> GuestSession:
        return self.outcome.session

    @property
    def passed(self) -> bool:
        return self.outcome.passed

    @property
    def wall_ns(self) -> int:
        """The guest's phases' wall time, summed: the VM's own run, without its set-up
        (a run's makespan is the most of its VMs')."""
        return sum(p.wall_ns for p in self.session.phases)

    @property
    def record(self) -> dict[str, str]:
        """The guest's last result record ({} when it reported none)."""
        return self.session.results[-1] if self.session.results else {}

    def error(self) -> str | None:
        """One line saying why this VM failed (its first channel fault if it had one)."""
        if self.passed:
            return None
        if self.faults:
            return f"{self.spec.name}: {self.faults[0]}"
        return self.outcome.describe_failure()
