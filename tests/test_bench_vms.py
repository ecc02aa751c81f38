"""`gpuvm bench vms` end to end on KVM with small sizes: what it counts, not timing."""

from __future__ import annotations

import pytest

from gpuvm.bench import vms
from gpuvm.vmm.kvm import kvm_usable

USABLE, WHY = kvm_usable()
pytestmark = [pytest.mark.kvm, pytest.mark.skipif(not USABLE, reason=WHY)]


@pytest.mark.slow  # three VM runs, ~20 s on two busy cores
def test_vms_bench_runs_each_benchmark_alone_once_then_all_at_once() -> None:
    r = vms.run_vms_bench(("vecadd", "vecadd"), backend="kvm", size=16, ring="on")
    (p,) = r["passes"].values()
    assert list(p["alone"]) == ["vecadd"]  # one alone run per distinct benchmark
    assert [vm["name"] for vm in p["vms"]] == ["vm0", "vm1"]
    assert all(vm["passed"] for vm in p["vms"]) and p["alone"]["vecadd"]["passed"]
    # the ring takes the page-table stores: what exits is a few hundred, not ~50,000
    assert all(0 < vm["exits"] < 2_000 for vm in p["vms"])
    vms.print_vms_bench(r)
