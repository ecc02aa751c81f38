"""A hung VM next to three well-behaved ones, on KVM: the watchdog kills the hung VM's
channel (its kernel would run for 18 minutes of device time), charges it, and hands the
GPU on; the three finish with correct results, the hung one is reported with its reason,
and nothing is left running on the GPU."""

from __future__ import annotations

import pytest

from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.run.mediated import MediatedMachine
from gpuvm.vmm.kvm import kvm_usable

KVM_OK, KVM_WHY = kvm_usable()
HUNG = 1 << 40  # loop iterations: 1.1e12 ns of device time


class Watched(MediatedMachine):
    """Remembers, as the run ends, whether anything still held the GPU."""

    last: "Watched"

    def __init__(self, options, specs):
        super().__init__(options, specs)
        Watched.last = self

    def close(self):
        now = self.gpu.device_time_ns()
        self.running_at_end = self.med.submissions.dispatcher.running
        self.engines_busy_at_end = [e.name for e in (self.gpu.engines.graph,
                                                     self.gpu.engines.copy0,
                                                     self.gpu.engines.copy1) if e.busy(now)]
        self.kills = list(self.med.submissions.kills)
        self.med_counts = dict(self.med.counts)
        super().close()


@pytest.mark.kvm
@pytest.mark.skipif(not KVM_OK, reason=KVM_WHY)
@pytest.mark.parametrize("mode,clock", [("fv-opt", "wall"), ("pv", "wall"),
                                        ("fv-opt", "virtual")])
def test_hung_vm_is_killed_and_the_others_finish(mode, clock):
    specs = [VmSpec("hung", "loop", [HUNG, 1]),
             VmSpec("vecadd", "vecadd", [1000]),
             VmSpec("mmul", "mmul", [32]),
             VmSpec("memcpy", "memcpy", [4096])]
    results = run_vms(specs, RunOptions(mode=mode, backend="kvm", watchdog_s=1.0, timeout=120,
                                        confined=True, clock=clock), machine=Watched)
    by_name = {r.spec.name: r for r in results}
    for name in ("vecadd", "mmul", "memcpy"):
        r = by_name[name]
        assert r.passed, r.error()
        assert r.record["check"] == "PASS"
    hung = by_name["hung"]
    assert not hung.passed
    assert "watchdog" in (hung.error() or ""), hung.error()
    m = Watched.last
    assert [(pchid, reason.split(":")[0]) for _, pchid, reason in m.kills] == \
        [(m.kills[0][1], "watchdog")]
    assert m.med_counts["watchdog.kills"] == 1
    assert m.running_at_end is None  # the GPU is free afterwards
    assert m.engines_busy_at_end == []
