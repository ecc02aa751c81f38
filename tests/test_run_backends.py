"""The same driver binary on both backends: KVM (flat image on a real vCPU) and
in-process (shared library) report identical counts, phase by phase."""

from __future__ import annotations

import pytest

from gpuvm.device import regs
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.vmm.backends import kvm_usable

KVM_OK, KVM_WHY = kvm_usable()
pytestmark = [pytest.mark.kvm, pytest.mark.skipif(not KVM_OK, reason=KVM_WHY)]


def counts(backend: str, spec: VmSpec):
    options = RunOptions(backend=backend, vram_size=384 * regs.MiB, wait_slice=2.0)
    (r,) = run_vms([spec], options)
    assert r.outcome.backend == backend
    # kvm.*: how KVM delivered the accesses (through its coalesced ring, to pages mapped
    # as memory), not what was counted
    return r, [(p.name, {k: v for k, v in p.counters.items() if not k.startswith("kvm.")})
               for p in r.session.phases]


@pytest.mark.parametrize("bench,params", [
    ("vecadd", [1000]), ("madd", [16]), ("mmul", [48]), ("fmadd", [1000]),
    ("memcpy", [4096]), ("memcpy", [4096, 1]), ("loop", [1000, 3]), ("idle", []),
], ids=lambda v: str(v))
def test_kvm_and_inproc_count_the_same(bench, params):
    """Every benchmark passes on a real vCPU with the same binary's counts as in-process."""
    spec = VmSpec("vm0", bench, params)
    kvm, kvm_counts = counts("kvm", spec)
    inproc, inproc_counts = counts("inproc", spec)
    assert kvm.passed and inproc.passed
    assert kvm_counts == inproc_counts
    assert kvm.record == inproc.record


def test_fault_injection_on_kvm():
    r, _ = counts("kvm", VmSpec("vm0", "vecadd", [1000], inject="unmapped-copy"))
    assert not r.passed and r.record["chan_err"] == "vm_fault"
    assert r.error().startswith("vm0: channel 0 (PCOPY0): vm-fault")
