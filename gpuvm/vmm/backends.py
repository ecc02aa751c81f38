"""Choosing how a guest runs: real vCPUs on /dev/kvm, or in-process threads."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestOutcome, GuestSession
from gpuvm.vmm.inproc.runner import InprocRunner
from gpuvm.vmm.kvm import kvm_usable
from gpuvm.vmm.kvm.runner import KvmRunner

BACKENDS = ("kvm", "inproc", "auto")


class GuestRunner(Protocol):
    """One running guest. Constructed with (name, program, ram, session, bar_sizes)."""

    backend: str

    def start(self) -> None: ...

    def started(self) -> bool: ...

    def stop(self, reason: str) -> None: ...

    def alive(self) -> bool: ...

    def join(self, timeout: float | None = None) -> GuestOutcome: ...


def resolve_backend(requested: str) -> str:
    """'auto' -> 'kvm' when /dev/kvm is usable, else 'inproc'; 'kvm' without KVM -> error."""
    if requested not in BACKENDS:
        raise ValueError(f"backend {requested!r} is not one of {', '.join(BACKENDS)}")
    if requested == "inproc":
        return "inproc"
    ok, why = kvm_usable()
    if ok:
        return "kvm"
    if requested == "kvm":
        raise RuntimeError(f"--backend kvm: {why}")
    return "inproc"


def make_runner(backend: str, name: str, flat_image: Path, shared_lib: Path, ram: GuestRam,
                session: GuestSession, bar_sizes: dict[int, int]) -> GuestRunner:
    """A runner for an already resolved backend ('kvm' or 'inproc')."""
    if backend == "kvm":
        return KvmRunner(name, flat_image, ram, session, bar_sizes)
    if backend == "inproc":
        return InprocRunner(name, shared_lib, ram, session, bar_sizes)
    raise ValueError(f"backend {backend!r} must be resolved first (kvm or inproc)")
