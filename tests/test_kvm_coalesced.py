"""Fewer exits change KVM's exits, not the modelled system: mmul on KVM with the
coalesced ring (and, native, its apertures mapped as memory) and without gives the same
counts and the same priced exits in virtual time -- with far fewer exits to userspace."""

from __future__ import annotations

import pytest

from gpuvm.errors import UserError
from gpuvm.experiment.costs import load_costs, mmio_exits
from gpuvm.mediator.modes import MODES
from gpuvm.run import run_vms
from gpuvm.run.cli import COST_PROFILE
from gpuvm.run.spec import RunOptions, VmSpec
from gpuvm.vmm.kvm import kvm_usable
from gpuvm.vmm.kvm.runner import coalescing_default
from gpuvm.vmm.kvm.vcpu import COALESCED_STORES, DIRECT_ACCESSES

USABLE, WHY = kvm_usable()
pytestmark = [pytest.mark.kvm, pytest.mark.skipif(not USABLE, reason=WHY)]


def run(mode: str, coalesce: str, monkeypatch: pytest.MonkeyPatch, isolated: bool = False
        ) -> tuple[list[tuple[str, dict[str, int]]], list[list]]:
    """Each phase's counters, and the vCPU's priced event stream with how long each wait
    on the GPU lasted left out (see the test)."""
    monkeypatch.setenv("GPUVM_COALESCE", coalesce)
    prices = load_costs(COST_PROFILE).event_prices(MODES[mode].mediated)  # as `gpuvm run`
    (result,) = run_vms([VmSpec("vm0", "mmul", [64], mdev_type="gpuvm-Q6000-8Q")],
                        RunOptions(mode=mode, backend="kvm", clock="virtual", prices=prices,
                                   isolated=isolated))
    assert result.passed, result.outcome.describe_failure()
    stream = [e if e[0] != "w" else ["w"] for e in result.session.clock_party.stream.entries]
    return [(p.name, dict(p.counters)) for p in result.session.phases], stream


@pytest.mark.slow  # ~15 s a mode on 2 busy cores: the runs without the ring are the slow ones
@pytest.mark.parametrize("mode", ["native", "fv"])
def test_fewer_exits_keep_counts_and_priced_exits(mode: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Every phase's counts, and every exit of the modelled system at its price in
    virtual time, in order (so the guest's own modelled time), are those of the run where
    each access exits.  How long a wait on the GPU lasts is left out: where the guest
    reaches it sooner in wall time it can differ (1,105 ns once in native's Init), as it
    does between two runs that both trap every access (HtoD: 5,478 / 6,178 / 10,256 ns):
    the virtual clock's, not the exits'."""
    trapped, trapped_stream = run(mode, "0", monkeypatch)
    fewer, fewer_stream = run(mode, "1", monkeypatch)
    unexited = {key: sum(c.pop(key, 0) for _, c in fewer)
                for key in (COALESCED_STORES, DIRECT_ACCESSES)}
    assert all(key not in c for _, c in trapped for key in unexited)
    assert fewer == trapped  # names and every count, per phase
    assert fewer_stream == trapped_stream
    exits = sum(mmio_exits(c) + c.get("exits.io", 0) for _, c in trapped)
    assert exits > 10_000
    # what KVM still exits to userspace for: BAR0 registers, BAR1 (USERD), ports, and
    # stores that found the ring full; native maps BAR3 and PRAMIN as memory instead
    assert exits - sum(unexited.values()) < (1_000 if mode == "native" else exits / 20)
    assert (unexited[DIRECT_ACCESSES] > 40_000) == (mode == "native")


@pytest.mark.slow
def test_a_remap_mode_queues_pramin_stores_while_no_channel_is_bound(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """fv-opt remaps BAR pages as its trapped accesses tell it, so it says itself when its
    PRAMIN stores may queue (MappingListener.post): while no channel is bound -- the BAR
    VMs' tables of Init, written before the first channel -- and not after.  The counts
    and priced exits are those of the run where each store exits."""
    trapped, trapped_stream = run("fv-opt", "0", monkeypatch)
    fewer, fewer_stream = run("fv-opt", "1", monkeypatch)
    queued = {name: c.pop(COALESCED_STORES, 0) for name, c in fewer}
    assert fewer == trapped
    assert fewer_stream == trapped_stream
    pramin = {name: c.get("trap.bar0.pramin.write", 0) for name, c in trapped}
    assert queued["Init"] > 4_000 and queued["Init"] <= pramin["Init"]
    # once its channel is bound, every store exits again (Close unbinds it last)
    assert all(queued[name] == 0 for name in ("HtoD", "Launch", "DtoH"))


@pytest.mark.slow
def test_an_isolated_vmm_hears_when_pramin_stores_may_queue(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Over vfio-user the same word comes as a GPUVM_MAPPING_EVENT (post / trap) ahead of
    the reply to the access that caused it: the VMM in its own process queues the same
    PRAMIN stores, and counts and priced exits are those of the VM run as a thread."""
    threaded, threaded_stream = run("fv-opt", "1", monkeypatch)
    isolated, isolated_stream = run("fv-opt", "1", monkeypatch, isolated=True)
    queued = {name: c.pop(COALESCED_STORES, 0) for name, c in isolated}
    for _, c in threaded:
        c.pop(COALESCED_STORES, None)
    assert isolated == threaded
    assert isolated_stream == threaded_stream
    assert queued["Init"] > 4_000
    assert all(queued[name] == 0 for name in ("HtoD", "Launch", "DtoH"))


def test_the_switch_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUVM_COALESCE", raising=False)
    assert coalescing_default()
    monkeypatch.setenv("GPUVM_COALESCE", "0")
    assert not coalescing_default()
    monkeypatch.setenv("GPUVM_COALESCE", "off")
    with pytest.raises(UserError, match="GPUVM_COALESCE='off'"):
        coalescing_default()
