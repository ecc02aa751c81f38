"""Fewer exits change KVM's exits, not the modelled system: mmul on KVM with the
coalesced ring (and, native, its apertures mapped as memory) and without gives the same
counts, the same virtual device time per phase, and so the same modelled time -- with far
fewer exits to userspace."""

from __future__ import annotations

import pytest

from gpuvm.errors import UserError
from gpuvm.experiment.costs import mmio_exits
from gpuvm.run import run_vms
from gpuvm.run.spec import RunOptions, VmSpec
from gpuvm.vmm.kvm import kvm_usable
from gpuvm.vmm.kvm.runner import coalescing_default
from gpuvm.vmm.kvm.vcpu import COALESCED_STORES, DIRECT_ACCESSES

USABLE, WHY = kvm_usable()
pytestmark = [pytest.mark.kvm, pytest.mark.skipif(not USABLE, reason=WHY)]


def phases(mode: str, coalesce: str, monkeypatch: pytest.MonkeyPatch
           ) -> list[tuple[str, int, dict[str, int]]]:
    monkeypatch.setenv("GPUVM_COALESCE", coalesce)
    (result,) = run_vms([VmSpec("vm0", "mmul", [64], mdev_type="gpuvm-Q6000-8Q")],
                        RunOptions(mode=mode, backend="kvm", clock="virtual"))
    assert result.passed, result.outcome.describe_failure()
    return [(p.name, p.device_ns, dict(p.counters)) for p in result.session.phases]


@pytest.mark.slow  # ~15 s a mode on 2 busy cores: the runs without the ring are the slow ones
@pytest.mark.parametrize("mode", ["native", "fv"])
def test_coalescing_keeps_counts_and_virtual_time(mode: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    trapped = phases(mode, "0", monkeypatch)
    fewer = phases(mode, "1", monkeypatch)
    unexited = {key: sum(c.pop(key, 0) for _, _, c in fewer)
                for key in (COALESCED_STORES, DIRECT_ACCESSES)}
    assert all(key not in c for _, _, c in trapped for key in unexited)
    assert fewer == trapped  # names, virtual device time and every count, per phase
    exits = sum(mmio_exits(c) + c.get("exits.io", 0) for _, _, c in trapped)
    assert exits > 10_000
    # what KVM still exits to userspace for: BAR0 registers, BAR1 (USERD), ports, and
    # stores that found the ring full; native maps BAR3 and PRAMIN as memory instead
    assert exits - sum(unexited.values()) < (1_000 if mode == "native" else exits / 20)
    assert (unexited[DIRECT_ACCESSES] > 40_000) == (mode == "native")


def test_the_switch_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUVM_COALESCE", raising=False)
    assert coalescing_default()
    monkeypatch.setenv("GPUVM_COALESCE", "0")
    assert not coalescing_default()
    monkeypatch.setenv("GPUVM_COALESCE", "off")
    with pytest.raises(UserError, match="GPUVM_COALESCE='off'"):
        coalescing_default()
