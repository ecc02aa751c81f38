"""Every benchmark passes its in-guest check natively in-process at two sizes, its counts
repeat exactly, and each fault injection fails that guest with the channel's reason."""

from __future__ import annotations

import pytest

from gpuvm.device import regs
from gpuvm.run import RunError, RunOptions, VmSpec, run_vms

OPTIONS = RunOptions(backend="inproc", vram_size=384 * regs.MiB, wait_slice=2.0, timeout=120)

# benchmark -> two small parameter sets (params[1] = 1: pinned host memory)
CASES = {
    "vecadd": ([1000], [70000, 1]),
    "madd": ([16], [48, 1]),
    "mmul": ([32], [80, 1]),
    "fmadd": ([1000], [70000, 1]),
    "memcpy": ([4096], [5 * regs.MiB + 12]),  # the second spans two 4 MiB bounce chunks
    "loop": ([1000], [250000]),
    "idle": ([], [0]),
}


def run_one(bench: str, params: list[int], **spec) -> object:
    (result,) = run_vms([VmSpec("vm0", bench, params, **spec)], OPTIONS)
    return result


@pytest.mark.parametrize("bench,params", [(b, p) for b, ps in CASES.items() for p in ps],
                         ids=lambda v: str(v))
def test_benchmark_passes(bench, params):
    r = run_one(bench, params)
    assert r.passed, (r.error(), r.session.console)
    rec = r.record
    assert rec["bench"] == bench and rec["check"] == "PASS"
    assert r.session.exit_code == 0 and r.faults == []
    names = [p.name for p in r.session.phases]
    assert names[0] == "Init" and names[-1] == "Close"
    if bench != "idle":
        assert names == ["Init", "HtoD", "Launch", "DtoH", "Close"] or \
            (bench == "memcpy" and names == ["Init", "HtoD", "DtoH", "Close"])
    # the driver's own teardown check passed (nothing left in VRAM or guest RAM)
    assert "reason" not in rec


def test_results_match_the_requested_sizes():
    r = run_one("mmul", [48])
    assert r.record["n"] == "48"
    assert float(r.record["maxerr"]) <= float(r.record["tol"])
    r = run_one("memcpy", [8192, 1])
    assert r.record["bytes"] == "8192" and r.record["pinned"] == "1"


def test_counts_repeat_exactly():
    def counts():
        r = run_one("mmul", [40])
        assert r.passed
        phases = [(p.name, {k: v for k, v in p.counters.items()}) for p in r.session.phases]
        return phases, {k: v for k, v in r.record.items()}

    assert counts() == counts()


def test_phases_carry_the_expected_work():
    r = run_one("madd", [32])
    by = {p.name: p.counters for p in r.session.phases}
    assert by["Launch"].get("compute.kernels") == 1
    assert by["HtoD"].get("copy.bytes") == 2 * 32 * 32 * 4
    assert by["DtoH"].get("copy.bytes") == 32 * 32 * 4
    # submission is a doorbell through BAR1 plus a wait; no register traffic
    for phase in ("HtoD", "Launch", "DtoH"):
        assert by[phase].get("exits.mmio.bar0.write", 0) == 0
        assert by[phase]["exits.mmio.bar1.write"] == by[phase]["pfifo.doorbells"]
    # page tables are set up in Init and torn down in Close
    assert by["Init"]["exits.mmio.bar3.write"] > 8192
    assert by["Close"]["exits.mmio.bar0.write"] > 0
    assert int(r.record["pte_writes"]) > 0 and int(r.record["tlb_flushes"]) > 0


def test_pageable_copies_are_staged_in_4mib_chunks():
    pageable = run_one("memcpy", [9 * regs.MiB])
    pinned = run_one("memcpy", [9 * regs.MiB, 1])
    assert pageable.passed and pinned.passed
    assert int(pageable.record["copies"]) == 2 * 3  # 4 + 4 + 1 MiB each way
    assert int(pinned.record["copies"]) == 2


@pytest.mark.parametrize("inject,reason", [
    ("bad-method", "bad_method_header"),
    ("unmapped-copy", "vm_fault"),
    ("bad-kernel", "bad_kernel_object"),
    ("unknown-class", "unknown_class"),
])
def test_fault_injection_fails_the_guest(inject, reason):
    r = run_one("madd", [16], inject=inject)
    assert not r.passed
    assert r.outcome.failure is None  # the guest itself noticed and reported it
    assert r.session.exit_code == 1
    rec = r.record
    assert rec["check"] == "FAIL" and rec["reason"] == "channel_fault"
    assert rec["chan_err"] == reason
    assert len(r.faults) == 1 and r.faults[0].chid == 0
    line = r.error()
    assert line.startswith("vm0: channel 0 (") and "\n" not in line


def test_unmapped_copy_reports_the_faulting_address():
    r = run_one("vecadd", [1000], inject="unmapped-copy")
    assert r.record["fault_addr"] == "0x1000"
    assert r.faults[0].address == 0x1000 and r.faults[0].engine == "PCOPY0"


def test_bad_specs_are_one_line_errors():
    with pytest.raises(RunError, match="no benchmark 'nope'"):
        run_vms([VmSpec("vm0", "nope")], OPTIONS)
    with pytest.raises(RunError, match="unknown fault injection"):
        run_vms([VmSpec("vm0", "idle", inject="melt")], OPTIONS)
    with pytest.raises(RunError, match="VM names must be unique"):
        run_vms([VmSpec("a", "idle"), VmSpec("a", "idle")], OPTIONS)
    with pytest.raises(RunError, match="needs a paravirtual mode"):
        run_vms([VmSpec("vm0", "idle", paravirtual=True)], OPTIONS)
    with pytest.raises(RunError, match="no mode"):
        run_vms([VmSpec("vm0", "idle")], RunOptions(mode="warp", backend="inproc"))


def test_native_vms_each_own_a_gpu():
    """Native mode with several VMs: each gets a GPU of its own, all pass, counts match
    what each does alone."""
    alone = run_one("madd", [16])
    results = run_vms([VmSpec("a", "madd", [16]), VmSpec("b", "mmul", [32])], OPTIONS)
    assert all(r.passed for r in results), [r.error() for r in results]
    assert [p.counters for p in results[0].session.phases] == \
        [p.counters for p in alone.session.phases]

