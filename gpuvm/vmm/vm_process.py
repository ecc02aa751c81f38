"""One VM in its own VMM process, its GPU attached over vfio-user.

The parent (an isolated run, gpuvm/run/isolated.py) or a user (`gpuvm vm start`) gives
this process a connected vfio-user socket and what the guest runs; it creates the guest's
RAM (a memfd it shares with the server through DMA_MAP), attaches the device exactly as
an in-process VM does (gpuvm/vmm/vfio_attach.attach on a VfioUserDevice), runs the guest
and writes everything the guest session recorded as one JSON document.  `recorded_outcome`
turns that document back into the GuestOutcome the run tables read, so a VM run in a
process reports the same things as one run in a thread.

Usage (internal): python -m gpuvm.vmm.vm_process < job.json > outcome.json, where the job
names the inherited socket fd ("fd") or a socket path ("socket").
"""

from __future__ import annotations

import json
import socket
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuvm.device.faults import ChannelFault
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vmm.backends import make_runner
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestOutcome, GuestSession, PhaseRecord, boot_params_for
from gpuvm.vmm.vfio_attach import BAR_BASES, attach


def run_vm(device: VfioUserDevice, job: dict[str, Any]) -> dict[str, Any]:
    """Attach `device` to a fresh guest and run the job's benchmark to the end."""
    name = job["name"]
    ram = GuestRam(job["ram_size"])
    device.share(ram.host_address, ram.size, ram.fd)
    attached = attach(device, device, ram, name)
    try:
        session = GuestSession(name, ram, attached, wait_timeout=job["wait_timeout"])
        boot_params_for(ram, job["benchmark"], job["params"], job["flags"], BAR_BASES,
                        attached.bar_sizes)
        runner = make_runner(job["backend"], name, Path(job["flat"] or "."),
                             Path(job["shared"] or "."), ram, session, attached.bar_sizes)
        attached.connect_mappings(runner.memslots)
        runner.start()
        outcome = runner.join(job["timeout"])
        faults = attached.stats.faults()
        if runner.alive():
            runner.stop("the VM ran past its timeout")
            runner.join(5)
        return outcome_record(outcome, faults)
    finally:
        attached.detach()
        device.close()


def outcome_record(outcome: GuestOutcome, faults: list[ChannelFault]) -> dict[str, Any]:
    s = outcome.session
    return {"name": outcome.name, "backend": outcome.backend, "failure": outcome.failure,
            "rip": outcome.rip, "wall_ns": outcome.wall_ns,
            "session": {"console": s.console, "results": s.results,
                        "phases": [asdict(ph) for ph in s.phases],
                        "exit_code": s.exit_code, "failure": s.failure,
                        "port_counts": s.port_counts},
            "faults": [asdict(f) for f in faults]}


class RecordedSession(GuestSession):
    """A guest session as another process recorded it (no RAM, no device)."""

    def __init__(self, name: str, record: dict[str, Any]) -> None:  # noqa: D107
        self.name = name
        self.console = list(record["console"])
        self.results = [dict(r) for r in record["results"]]
        self.phases = [PhaseRecord(**ph) for ph in record["phases"]]
        self.exit_code = record["exit_code"]
        self.failure = record["failure"]
        self.port_counts = dict(record["port_counts"])


def recorded_outcome(record: dict[str, Any]) -> tuple[GuestOutcome, list[ChannelFault]]:
    session = RecordedSession(record["name"], record["session"])
    outcome = GuestOutcome(record["name"], record["backend"], session, record["failure"],
                           record["rip"], record["wall_ns"])
    return outcome, [ChannelFault(**f) for f in record["faults"]]


def failed_outcome(name: str, why: str) -> dict[str, Any]:
    """The record of a VM process that died before it could report."""
    return {"name": name, "backend": "process", "failure": why, "rip": None, "wall_ns": 0,
            "session": {"console": [], "results": [], "phases": [], "exit_code": None,
                        "failure": why, "port_counts": {}}, "faults": []}


def main() -> int:
    job = json.load(sys.stdin)
    if "fd" in job:
        sock = socket.socket(fileno=job["fd"])
        device = VfioUserDevice(sock, job["name"])
    else:
        device = VfioUserDevice.connect(job["socket"], job["name"])
    record = run_vm(device, job)
    json.dump(record, sys.stdout)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
