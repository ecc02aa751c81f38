"""One VM in its own VMM process, its GPU attached over vfio-user.

The parent (an isolated run, gpuvm/run/isolated.py) or a user (`gpuvm vm start`) gives
this process a connected vfio-user socket and what the guest runs; it creates the guest's
RAM (a memfd it shares with the server through DMA_MAP), attaches the device exactly as
an in-process VM does (gpuvm/vmm/vfio_attach.attach on a VfioUserDevice), runs the guest
and writes everything the guest session recorded as one JSON document.  `recorded_outcome`
turns that document back into the GuestOutcome the run tables read, so a VM run in a
process reports the same things as one run in a thread.

Usage (internal): python -m gpuvm.vmm.vm_process < job.json > outcome.json, where the job
names the inherited socket fd ("fd") or a socket path ("socket"); an isolated run forks
each VMM from a fork server instead (gpuvm/vmm/vmm_forks.py), which hands `main` the
job.  A job that says "clock": "virtual" runs its vCPU on the server's virtual clock
(gpuvm/vfio/user/vcpu_clock.py): the server must offer the "clock" extension.  A job
that says "hold" (an isolated run's) is one line; the VM is then built, "ready" is
written as a line of its own, and the guest starts when the parent writes "go" -- so
VMs whose processes took different times to start still start their guests when the run
says (their start_delay, all at once for a scaling run).

$GPUVM_POSTED_WRITES=0 (set by `posting(False)`, inherited from the parent) makes this
VMM send each store drained from KVM's coalesced ring as a REGION_WRITE of its own, not
each drain as one REGION_WRITE_MULTI -- the before/after comparison of `gpuvm bench vms
--posted both`.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any, ContextManager, TextIO

from gpuvm.device.faults import ChannelFault
from gpuvm.errors import UserError
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vfio.user.vcpu_clock import RemoteVcpu
from gpuvm.vmm.abi import BAR_BASES
from gpuvm.vmm.backends import make_runner
from gpuvm.vmm.env_switch import env_switch
from gpuvm.vmm.guest_ram import GuestRam, prealloc_for
from gpuvm.vmm.guest_session import GuestOutcome, GuestSession, PhaseRecord, boot_params_for
from gpuvm.vmm.vfio_attach import attach

READY, GO = "ready\n", "go\n"  # a held job's lines (see the module docstring)
POSTED_ENV = "GPUVM_POSTED_WRITES"  # 0: one REGION_WRITE a posted store (see above)


def posts_writes() -> bool:
    """Whether this VMM sends a drain of posted stores in one message, where the server
    takes REGION_WRITE_MULTI: yes unless $GPUVM_POSTED_WRITES is 0."""
    value = os.environ.get(POSTED_ENV, "1").strip()
    if value not in ("0", "1", ""):
        raise UserError(f"{POSTED_ENV}={value!r}: must be 0 (off) or 1 (on)")
    return value != "0"


def posting(on: bool) -> ContextManager[None]:
    """VMM processes started inside post their drained stores in one message or not:
    $GPUVM_POSTED_WRITES, restored after (benchmarks' before/after comparisons)."""
    return env_switch(POSTED_ENV, on)


def _wait_for_go(go: TextIO) -> bool:
    """Say the VM is built, then wait for the parent's word (False: it closed instead)."""
    sys.stdout.write(READY)
    sys.stdout.flush()
    return go.readline() == GO


def run_vm(device: VfioUserDevice, job: dict[str, Any], go: TextIO = sys.stdin
           ) -> dict[str, Any]:
    """Attach `device` to a fresh guest and run the job's benchmark to the end (a held
    job's guest starts at the word "go" on `go`)."""
    name = job["name"]
    # ram_alloc absent (a job written by hand): the default's
    ram = GuestRam(job["ram_size"], backing=job.get("ram_backing", "anon"),
                   prealloc=prealloc_for(job.get("ram_alloc")))
    device.share(ram.host_address, ram.size, ram.share_fd())
    attached = attach(device, device, ram, name)
    try:
        session = GuestSession(name, ram, attached, wait_timeout=job["wait_timeout"])
        if job.get("clock") == "virtual":  # the vCPU is on the server's clock
            if "clock" not in device.extensions:
                return failed_outcome(name, "a virtual-clock job, and the server offers "
                                            "no virtual clock")
            session.use_clock(RemoteVcpu(device.clock_op))
        boot_params_for(ram, job["benchmark"], job["params"], job["flags"], BAR_BASES,
                        attached.bar_sizes)
        runner = make_runner(job["backend"], name, Path(job["flat"] or "."),
                             Path(job["shared"] or "."), ram, session, attached.bar_sizes)
        attached.connect_mappings(runner.memslots)
        if job.get("hold") and not _wait_for_go(go):
            return failed_outcome(name, "the run ended before this VM started")
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
                        "port_counts": s.port_counts,
                        "hostmem": {"summary": s.hostmem.summary(),
                                    "history": s.hostmem.history()}},
            "faults": [asdict(f) for f in faults]}


class RecordedHostMem:
    """What a VM process's host-memory tracker reported (gpuvm.vmm.hostmem), read the
    way an experiment row reads a tracker."""

    def __init__(self, record: dict[str, Any] | None) -> None:  # noqa: D107
        record = record or {"summary": {}, "history": {"events": []}}
        self._summary = dict(record["summary"])
        self._history = dict(record["history"])
        self.events = list(self._history.get("events", []))
        self.pinned_peak_bytes = int(self._summary.get("pinned_peak_bytes", 0))

    def summary(self) -> dict[str, Any]:
        return dict(self._summary)

    def history(self) -> dict[str, Any]:
        return dict(self._history)


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
        self.hostmem = RecordedHostMem(record.get("hostmem"))
        self.clock_party = None  # the server's GuestParty, where it had one (isolated.py)


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


def read_job(stream: TextIO) -> dict[str, Any]:
    """The job: a held one is the first line (what follows is the word to start), a
    user's may span lines (a file); ValueError where it is not JSON."""
    text = ""
    for line in stream:
        text += line
        try:
            return json.loads(text)
        except ValueError:
            continue
    return json.loads(text)


def main(job: dict[str, Any] | None = None) -> int:
    """Run a job (read from stdin where none is given: a fork server passes its own)."""
    job = read_job(sys.stdin) if job is None else job
    try:
        multi = posts_writes()
    except UserError as exc:
        sys.stderr.write(f"gpuvm: error: {exc}\n")
        return 2
    if "fd" in job:
        sock = socket.socket(fileno=job["fd"])
        device = VfioUserDevice(sock, job["name"], write_multiple=multi)
    else:
        device = VfioUserDevice.connect(job["socket"], job["name"], write_multiple=multi)
    record = run_vm(device, job)
    json.dump(record, sys.stdout)
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
