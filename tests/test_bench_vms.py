"""`gpuvm bench vms` end to end on KVM with small sizes: what it counts, not timing."""

from __future__ import annotations

import pytest

from gpuvm.bench import vms
from gpuvm.errors import UserError
from gpuvm.vmm import vm_process
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
    assert p["served_s"] is None  # threads of this process: no server
    vms.print_vms_bench(r)


@pytest.mark.slow  # four isolated VM runs
def test_isolated_vms_with_a_drain_in_one_message_and_one_a_store(capsys) -> None:
    """--posted both: the ring's pass twice, each drained store a message of its own
    and each drain one message; same exits, both pass, and the speed-up is printed."""
    r = vms.run_vms_bench(("vecadd", "vecadd"), backend="kvm", mode="fv", size=16,
                          isolated=True, ring="on", posted="both")
    assert list(r["passes"]) == ["unposted", "on"]
    for p in r["passes"].values():
        assert all(vm["passed"] for vm in p["vms"]) and p["alone"]["vecadd"]["passed"]
        assert 0 < p["served_s"] < p["together_s"]  # the server's thread, as a share
    vms.print_vms_bench(r)
    out = capsys.readouterr().out
    assert "one vfio-user message a drained store" in out and "one a drain" in out
    assert "the server's one thread answered their accesses for" in " ".join(out.split())


def test_the_posted_switch_is_read_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(vm_process.POSTED_ENV, raising=False)
    assert vm_process.posts_writes()
    with vm_process.posting(False):
        assert not vm_process.posts_writes()
    assert vm_process.posts_writes()
    monkeypatch.setenv(vm_process.POSTED_ENV, "no")
    with pytest.raises(UserError, match="GPUVM_POSTED_WRITES='no'"):
        vm_process.posts_writes()


def test_repeats_give_each_pass_the_ratio_of_every_repeat(monkeypatch, capsys) -> None:
    """Each repeat's ratio is its own all-at-once time over its own slowest alone run
    (elapsed, and the guests' phases); the table shows the last repeat."""
    passes = iter([
        {"alone": {"a": {"elapsed_s": 2.0, "s": 1.0, "passed": True, "exits": 1},
                   "b": {"elapsed_s": 4.0, "s": 0.5, "passed": True, "exits": 1}},
         "together_s": 6.0, "served_s": None,
         "vms": [{"name": "vm0", "benchmark": "a", "s": 2.0, "passed": True, "exits": 1},
                 {"name": "vm1", "benchmark": "b", "s": 1.5, "passed": True, "exits": 1}]},
        {"alone": {"a": {"elapsed_s": 1.0, "s": 1.0, "passed": True, "exits": 1},
                   "b": {"elapsed_s": 5.0, "s": 2.0, "passed": True, "exits": 1}},
         "together_s": 5.0, "served_s": None,
         "vms": [{"name": "vm0", "benchmark": "a", "s": 3.0, "passed": True, "exits": 1},
                 {"name": "vm1", "benchmark": "b", "s": 1.0, "passed": True, "exits": 1}]}])
    monkeypatch.setattr(vms, "_one_pass", lambda specs, options: next(passes))
    r = vms.run_vms_bench(("a", "b"), backend="inproc", repeats=2)
    (p,) = r["passes"].values()
    assert p["elapsed_ratios"] == [1.5, 1.0] and p["guest_ratios"] == [2.0, 1.5]
    assert p["together_s"] == 5.0  # the last repeat's rows
    vms.print_vms_bench(r)
    out = " ".join(capsys.readouterr().out.split())
    assert "elapsed 1.00-1.50x (median 1.25x)" in out
    assert "the guests' phases 1.50-2.00x (median 1.75x)" in out
    with pytest.raises(ValueError, match="repeats"):
        vms.run_vms_bench(("a",), backend="inproc", repeats=0)
