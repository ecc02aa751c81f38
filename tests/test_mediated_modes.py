"""Every mediated mode with the real C guests: four VMs share one emulated GPU, each on its
own VRAM slice, each passes its checksum; counts repeat exactly (and KVM counts what the
in-process backend counts); the modes order the way GPUvm's optimizations say they should;
native and fv cause the same exits (the unmodified-driver rule); a faulting guest fails
alone, with a one-line reason."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import pytest

from gpuvm.device import regs
from gpuvm.mediator.partition import PartitionSpec
from gpuvm.mediator.mediator import HYP_GLOBAL
from gpuvm.run import RunOptions, VmResult, VmSpec, run_vms
from gpuvm.run.mediated import MediatedMachine
from gpuvm.vmm.backends import kvm_usable
from gpuvm.mediator.host_port import work_counters

MEDIATED = ["fv", "fv+remap", "fv+lazy", "fv-opt", "pv-naive", "pv"]
REMAP_MODES = {"fv+remap", "fv-opt", "pv"}
KVM_OK, KVM_WHY = kvm_usable()
ON_KVM = [pytest.mark.kvm, pytest.mark.skipif(not KVM_OK, reason=KVM_WHY)]
BACKENDS = ["inproc", pytest.param("kvm", marks=ON_KVM)]

# four default partitions (512 MiB slice + 32 MiB shadow reserve each) + hypervisor VRAM
VRAM = 3 * 1024 * regs.MiB
# four different benchmarks at small sizes, each with its own in-guest check
WORKLOAD = [("vm0", "mmul", [32]), ("vm1", "madd", [16]), ("vm2", "fmadd", [1000]),
            ("vm3", "memcpy", [4096])]
# gauges (a level at phase end, not a count of events in the phase)
GAUGES = {"remap.pages", "remap.memslots"}


def options(mode: str, backend: str, **kw) -> RunOptions:
    # a long wait slice: no driver re-wait (an extra exit) however slow the host is
    return RunOptions(mode=mode, backend=backend, vram_size=VRAM, time_scale=1000.0,
                      wait_slice=10.0, timeout=120, **kw)


@dataclass(frozen=True)
class Slice:
    vm: str
    vram_base: int
    vram_size: int
    shadow_base: int
    shadow_size: int
    chid_base: int
    channels: int


class Recording(MediatedMachine):
    """The mode's own machine; remembers each VM's partition as it is created."""

    last: "Recording"
    slices: list[Slice]

    def __init__(self, options: RunOptions, specs: list[VmSpec]) -> None:
        super().__init__(options, specs)
        self.slices = []
        Recording.last = self

    def attach(self, spec):
        att = super().attach(spec)
        p = self.vgpus[spec.name].part
        self.slices.append(Slice(spec.name, p.vram_base, p.vram_size, p.shadow_pool.base,
                                 p.shadow_pool.size, p.chid_base, p.channels))
        return att


def phase_counts(r: VmResult) -> list[tuple[str, dict[str, int]]]:
    # kvm.*: how KVM delivered the accesses (its coalesced ring), not what was counted
    return [(p.name, {k: v for k, v in work_counters(p.counters).items()
                      if k not in GAUGES and not k.startswith("kvm.")})
            for p in r.session.phases]


def totals(r: VmResult) -> dict[str, int]:
    out: dict[str, int] = {}
    for _, counts in phase_counts(r):
        for k, v in counts.items():
            out[k] = out.get(k, 0) + v
    return out


def traps(c: dict[str, int]) -> int:
    return sum(v for k, v in c.items() if k.startswith("trap.bar"))


_runs: dict[tuple[str, str], tuple[list[VmResult], list[Slice]]] = {}


def run_workload(mode: str, backend: str, fresh: bool = False):
    """The four-VM workload in `mode` on `backend`: (results, partitions as created).
    Cached per module, so the tests below share one run per mode and backend."""
    key = (mode, backend)
    if fresh or key not in _runs:
        specs = [VmSpec(name, bench, params, partition=asdict(PartitionSpec()))
                 for name, bench, params in WORKLOAD]
        results = run_vms(specs, options(mode, backend), machine=Recording)
        slices = Recording.last.slices
        if fresh:
            return results, slices
        _runs[key] = results, slices
    return _runs[key]


# ------------------------------------------------------------------------------ sharing
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", MEDIATED)
def test_four_vms_pass_on_disjoint_slices(mode, backend):
    """Four different benchmarks at once: each passes its checksum with no channel fault,
    and the four partitions (VRAM slice, shadow reserve, channels) overlap nothing --
    not each other and not the hypervisor's VRAM at the top."""
    results, slices = run_workload(mode, backend)
    for r, (name, bench, _) in zip(results, WORKLOAD):
        assert r.passed, (r.error(), r.session.console)
        assert r.outcome.backend == backend
        assert r.record["bench"] == bench and r.record["check"] == "PASS"
        assert r.faults == []
        if mode.startswith("pv"):
            assert int(r.record["hypercalls"]) > 0  # the PV build ran
        else:
            assert r.record["hypercalls"] == "0"

    assert [s.vm for s in slices] == [name for name, _, _ in WORKLOAD]
    ranges = [(s.vram_base, s.vram_base + s.vram_size) for s in slices] + \
        [(s.shadow_base, s.shadow_base + s.shadow_size) for s in slices] + \
        [(VRAM - HYP_GLOBAL, VRAM)]
    ranges.sort()
    for (_, end), (start, _) in zip(ranges, ranges[1:]):
        assert end <= start, f"VRAM ranges overlap: {ranges}"
    assert all(s.vram_size == 512 * regs.MiB for s in slices)
    chans = sorted((s.chid_base, s.chid_base + s.channels) for s in slices)
    for (_, end), (start, _) in zip(chans, chans[1:]):
        assert end <= start, f"channel ranges overlap: {chans}"


# ------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("mode", MEDIATED)
def test_counts_repeat_in_process(mode):
    """The same benchmarks, sizes and mode, run twice: identical counters, phase by phase
    and VM by VM (gauges aside), and identical guest result records."""
    first, _ = run_workload(mode, "inproc")
    again, _ = run_workload(mode, "inproc", fresh=True)
    assert all(r.passed for r in first + again)
    for a, b in zip(first, again):
        assert phase_counts(a) == phase_counts(b), a.spec.name
        assert a.record == b.record


@pytest.mark.parametrize("mode", MEDIATED)
@pytest.mark.kvm
@pytest.mark.skipif(not KVM_OK, reason=KVM_WHY)
def test_kvm_counts_like_in_process(mode):
    """The same guests on real vCPUs: every exit, trap, shadow sync, hypercall and device
    count is what the in-process backend counts."""
    inproc, _ = run_workload(mode, "inproc")
    kvm, _ = run_workload(mode, "kvm")
    assert all(r.passed for r in inproc + kvm)
    for a, b in zip(inproc, kvm):
        assert phase_counts(a) == phase_counts(b), a.spec.name
        assert a.record == b.record


# ------------------------------------------------------------------------------ ordering
def test_modes_order_as_gpuvm_says():
    """mmul (in-process), mode by mode: BAR remap and lazy shadowing cut fv's traps at
    least 3x; lazy shadowing syncs less; PV scans no guest page table and batches its
    entries into far fewer hypercalls than pv-naive (the same entries); only remap
    modes remap."""
    c = {mode: totals(run_workload(mode, "inproc")[0][0]) for mode in MEDIATED}
    for mode in MEDIATED:
        assert run_workload(mode, "inproc")[0][0].spec.benchmark == "mmul"

    assert traps(c["fv"]) >= 3 * traps(c["fv-opt"]), (traps(c["fv"]), traps(c["fv-opt"]))
    assert traps(c["fv+remap"]) < traps(c["fv"])
    assert 0 < c["fv+lazy"]["shadow.syncs"] < c["fv"]["shadow.syncs"]
    assert c["fv+lazy"]["shadow.ptes_scanned"] < c["fv"]["shadow.ptes_scanned"]
    for mode in ("pv", "pv-naive"):
        assert c[mode].get("shadow.ptes_scanned", 0) == 0
        assert c[mode].get("shadow.syncs", 0) == 0
    assert c["pv"]["hcall.entries"] == c["pv-naive"]["hcall.entries"] > 0
    assert 10 * c["pv"]["hcall.calls"] <= c["pv-naive"]["hcall.calls"]
    for mode in MEDIATED:
        if mode in REMAP_MODES:
            assert c[mode]["remap.maps"] > 0, mode
        else:
            assert c[mode].get("remap.maps", 0) == 0, mode
        if not mode.startswith("pv"):
            assert c[mode].get("hcall.calls", 0) == 0, mode


# ------------------------------------------------------------------------------ native vs fv
def exits(r: VmResult) -> list[tuple[str, dict[str, int]]]:
    return [(p.name, {k: v for k, v in p.counters.items() if k.startswith("exits.")})
            for p in r.session.phases]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bench,params", [("mmul", [32]), ("memcpy", [4096, 1])],
                         ids=["mmul", "memcpy-pinned"])
def test_native_and_fv_exit_the_same(bench, params, backend):
    """The unmodified-driver rule: the same binary does the same work natively (shown the
    GPU a partition shows) and under fv, so every phase has the same exits, by BAR and
    direction, and the driver reports the same counts."""
    spec = VmSpec("vm0", bench, params, partition=asdict(PartitionSpec()))
    (native,) = run_vms([spec], RunOptions(mode="native", backend=backend, time_scale=1000.0,
                                           wait_slice=10.0, timeout=120))
    (fv,) = run_vms([spec], options("fv", backend))
    assert native.passed and fv.passed, (native.error(), fv.error())
    assert exits(native) == exits(fv)
    assert native.record == fv.record
    assert sum(c.get("exits.mmio.bar3.write", 0) for _, c in exits(fv)) > 0  # not vacuous


# ------------------------------------------------------------------------------ faults
@pytest.mark.parametrize("mode", ["fv-opt", "pv"])
def test_faulting_guest_fails_alone(mode):
    """One of four VMs programs a bad method: it fails with a one-line reason naming its
    own (virtual) channel; the fault is not reported to anyone else, and the other three
    pass."""
    specs = [VmSpec(name, bench, params, inject="bad-method" if name == "vm1" else None,
                    partition=asdict(PartitionSpec()))
             for name, bench, params in WORKLOAD]
    results = run_vms(specs, options(mode, "inproc"))
    bad = results[1]
    assert not bad.passed
    assert bad.record["check"] == "FAIL" and bad.record["reason"] == "channel_fault"
    assert bad.record["chan_err"] == "bad_method_header"
    assert len(bad.faults) == 1 and bad.faults[0].chid == 0
    line = bad.error()
    assert line.startswith("vm1: channel 0 (") and "\n" not in line
    for r in results[:1] + results[2:]:
        assert r.passed, r.error()
        assert r.faults == [] and r.error() is None
