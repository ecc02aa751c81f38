"""The C isolation probe as an attacker VM next to a victim VM, under mediation.

Through every vector that applies (channel page table, BAR1 VM, BAR3 VM, PRAMIN window,
RAMIN USERD pointer, sysram PTE; the PV build also sends the PTE by map hypercall) the
attacker aims at the victim's VRAM, at hypervisor VRAM, and (sysram) past its own RAM or
at the victim's RAM.  The victim's slice sits right above the attacker's (the attacker is
created first), so each target is what a naive translation (slice base + guest address,
bus window + guest-physical address) would reach.  Every target page holds a known
pattern: the probe must never read it back nor change it, the refusal must show in the
attacker's counters (and for PV in its `refused=`), and the victim's benchmark passes.
A control run aims the same vectors at the attacker's own memory and must get there --
so the probe would notice a hole.
"""

from __future__ import annotations

from dataclasses import asdict


import numpy as np
import pytest

from gpuvm.device import regs
from gpuvm.run.mediated import MediatedMachine
from gpuvm.mediator.mediator import HYP_GLOBAL
from gpuvm.mediator.partition import BUS_WINDOW, PartitionSpec
from gpuvm.run import RunOptions, VmResult, VmSpec, run_vms
from gpuvm.vmm import abi
from gpuvm.vmm.backends import kvm_usable
from gpuvm.vmm.guest_programs import PROBE_VECTORS

KVM_OK, KVM_WHY = kvm_usable()
VRAM = 2048 * regs.MiB
PART = PartitionSpec()  # both VMs get the default partition
PAGE = 0x1000
OFFSET = 0x4000000  # 64 MiB into a slice or RAM: far above what the guests allocate there
VICTIM_GUEST = PART.vram_size + PART.shadow_size + OFFSET  # attacker's view of the victim page
HYP_HOST = VRAM - HYP_GLOBAL // 16  # hypervisor VRAM, above what the mediator allocates
RAM_SECRET = OFFSET  # guest-physical, in the victim's RAM (and the attacker's own)
TARGETS = {  # target -> the address the attacker probes (attacker's slice is at VRAM 0)
    "victim_vram": VICTIM_GUEST,
    "hypervisor_vram": HYP_HOST,
    "beyond_ram": abi.GUEST_RAM_DEFAULT + OFFSET,  # sysram: past the end of its own RAM
    "victim_ram": BUS_WINDOW + RAM_SECRET,  # sysram: the next VM's bus window, naively
}
VRAM_TARGETS = ["victim_vram", "hypervisor_vram"]
SYSRAM_TARGETS = ["beyond_ram", "victim_ram"]
VRAM_VECTORS = {"fv": ["channel_pt", "bar1", "bar3", "pramin", "ramin"],
                "pv": ["pv_map", "channel_pt", "bar1", "bar3", "pramin", "ramin"]}
MARKER = bytes.fromhex("5052424b") * (PAGE // 4)  # what the probe writes ("PRBK")


def pattern(seed: int) -> bytes:
    return (np.arange(PAGE // 4, dtype=np.uint32) * 0x9E3779B1 ^ seed).astype("<u4").tobytes()


SEEDS = {"victim_vram": pattern(0x51C7), "hypervisor_vram": pattern(0x4A9E),
         "victim_ram": pattern(0x4A11), "own_vram": pattern(0x0C0C), "own_ram": pattern(0x0C0D)}


class Arena(MediatedMachine):
    """The mode's machine with a pattern on every page a probe aims at.  The victim's
    partition is kept until the attacker is gone (so every probe hits a live victim);
    when the attacker stops, the pages and the attacker's counters are snapshot."""

    last: "Arena"

    def __init__(self, options, specs):
        super().__init__(options, specs)
        Arena.last = self
        self.parts = {}
        self.rams = {}
        self.deferred = None
        self.after: dict[str, bytes] = {}
        self.attacker_counts: dict[str, int] = {}
        self.attacker_started_at_victim_attach: dict[str, int] | None = None
        self.victim_partition_live = False
        # hypervisor VRAM is seeded before any VM exists; a slice is scrubbed when its
        # VM is created, so each VM's page is seeded as its vGPU is made (the victim's
        # before the attacker has rung any doorbell: layout_as_assumed checks that)
        self._seed("hypervisor_vram", HYP_HOST)

    def _seed(self, name: str, host: int) -> None:
        self.gpu.vram.u8[host:host + PAGE] = np.frombuffer(SEEDS[name], np.uint8)

    def _vram_page(self, host: int) -> bytes:
        return bytes(self.gpu.vram.u8[host:host + PAGE])

    def pages(self) -> dict[str, bytes]:
        att, vic = self.parts["attacker"], self.parts["victim"]
        return {"victim_vram": self._vram_page(vic.vram_base + OFFSET),
                "hypervisor_vram": self._vram_page(HYP_HOST),
                "own_vram": self._vram_page(att.vram_base + OFFSET),
                "victim_ram": bytes(self.rams["victim"][:PAGE]),
                "own_ram": bytes(self.rams["attacker"][:PAGE])}

    def attach(self, spec):
        vgpu = super().attach(spec)
        self._seed("victim_vram" if spec.name == "victim" else "own_vram",
                   vgpu.part.vram_base + OFFSET)
        map_dma = vgpu.dma_map

        def seeded_dma_map(iova, memory, flags):  # the guest's RAM, seeded as it is mapped
            map_dma(iova, memory, flags)
            seed = SEEDS["victim_ram" if spec.name == "victim" else "own_ram"]
            memory[RAM_SECRET - iova:RAM_SECRET - iova + PAGE] = np.frombuffer(seed, np.uint8)
            self.rams[spec.name] = memory[RAM_SECRET - iova:]

        vgpu.dma_map = seeded_dma_map
        self.parts[spec.name] = vgpu.part
        if spec.name == "victim":  # how far the attacker got before the victim's RAM existed
            self.attacker_started_at_victim_attach = dict(self.vgpus["attacker"].counts)
        return vgpu

    def detach(self, spec):
        if spec.name == "victim" and "attacker" in self.vgpus:
            self.deferred = spec
            return
        if spec.name == "attacker":
            self.after = self.pages()
            self.attacker_counts = self.vgpus["attacker"].counters()
            self.victim_partition_live = "victim" in self.vgpus
        super().detach(spec)
        if self.deferred is not None and spec.name == "attacker":
            super().detach(self.deferred)
            self.deferred = None


def attack(mode: str, vector: str, address: int,
           backend: str = "inproc") -> tuple[VmResult, VmResult, Arena]:
    """The probe (attacker, created first) next to a victim running mmul, in `mode`."""
    specs = [VmSpec("attacker", "probe", [PROBE_VECTORS[vector], address, 16],
                    partition=asdict(PART)),
             VmSpec("victim", "mmul", [32], partition=asdict(PART))]
    attacker, victim = run_vms(specs, RunOptions(mode=mode, backend=backend, vram_size=VRAM,
                                                 wait_slice=2.0, timeout=60), machine=Arena)
    return attacker, victim, Arena.last


def refusals(counts: dict[str, int]) -> int:
    return counts.get("shadow.ptes_refused", 0) + \
        sum(v for k, v in counts.items() if k.startswith("trap.refused."))


FOREIGN = ("victim_vram", "hypervisor_vram", "victim_ram")  # pages no attacker may touch
ATTACKS = [pytest.param(mode, vector, target, "inproc", id=f"{mode}-{vector}-{target}")
           for mode in ("fv", "fv-opt", "pv")
           for vector in VRAM_VECTORS[mode[:2]] + ["sysram"]
           for target in (SYSRAM_TARGETS if vector == "sysram" else VRAM_TARGETS)]
# on real vCPUs too, where remapped BAR pages are KVM memslots: a sample of each path
ATTACKS += [pytest.param(mode, vector, target, "kvm", id=f"{mode}-{vector}-{target}-kvm",
                         marks=[pytest.mark.kvm, pytest.mark.skipif(not KVM_OK, reason=KVM_WHY)])
            for mode, vector, target in [("fv", "channel_pt", "victim_vram"),
                                         ("fv-opt", "bar1", "victim_vram"),
                                         ("fv-opt", "bar3", "hypervisor_vram"),
                                         ("pv", "pv_map", "victim_vram"),
                                         ("pv", "bar1", "hypervisor_vram"),
                                         ("pv", "sysram", "victim_ram")]]


def layout_as_assumed(machine: Arena) -> None:
    """The victim's slice and bus window are the ones right above the attacker's."""
    att, vic = machine.parts["attacker"], machine.parts["victim"]
    assert att.vram_base == 0 and att.vram_size == PART.vram_size
    assert vic.vram_base == VICTIM_GUEST - OFFSET
    assert vic.sys_base == att.sys_base + BUS_WINDOW
    assert vic.vram_base + vic.vram_size <= HYP_HOST < VRAM
    assert machine.victim_partition_live
    # the victim's RAM was seeded before the attacker rang its first doorbell (in Init)
    assert machine.attacker_started_at_victim_attach.get("doorbells", 0) == 0


def victim_unharmed(victim: VmResult, machine: Arena) -> None:
    assert victim.passed, victim.error()
    assert victim.record["bench"] == "mmul" and victim.record["check"] == "PASS"
    assert victim.faults == []
    for page in FOREIGN:
        assert machine.after[page] == SEEDS[page], f"{page} changed"


@pytest.mark.parametrize("mode,vector,target,backend", ATTACKS)
def test_probe_never_reaches_foreign_memory(mode, vector, target, backend):
    """An attacker aiming a vector at the victim's VRAM/RAM or hypervisor VRAM reads none
    of it and changes none of it; the mediator counts the refusal (PV: the hypercall
    reports it too); the victim's own benchmark passes."""
    attacker, victim, machine = attack(mode, vector, TARGETS[target], backend)
    layout_as_assumed(machine)
    assert attacker.outcome.backend == victim.outcome.backend == backend
    rec = attacker.record
    assert rec["bench"] == "probe" and rec["vector"] == vector, attacker.session.console
    pv = mode.startswith("pv")
    if not attacker.passed:  # PV: the driver may give up when its hypercall is refused
        assert pv and rec.get("reason") == "hypercall_refused", attacker.error()

    leaked = {SEEDS[p][:16].hex() for p in FOREIGN}
    assert rec["data"] not in leaked, f"{target} read back through {vector}"
    victim_unharmed(victim, machine)

    assert refusals(machine.attacker_counts) > 0, machine.attacker_counts
    if pv and vector != "pramin":  # PRAMIN is a trapped window, not a mapping
        assert int(rec["refused"]) > 0 or rec.get("reason") == "hypercall_refused", rec
    if vector in ("channel_pt", "pv_map", "sysram", "bar1", "bar3"):
        # the entry was never made present: the access faults, nothing is written
        assert rec["faulted"] == "1" and rec["wrote"] == "0", rec
    if vector in ("channel_pt", "pv_map", "sysram"):
        assert rec["chan_err"] == "vm_fault"  # a not-present page, not a stray bus address
    if vector == "pramin":
        assert rec["data"] == "ff" * 16


CONTROLS = [(mode, vector) for mode in ("fv", "pv")
            for vector in ["channel_pt", "bar1", "bar3", "pramin", "sysram"] +
            (["pv_map"] if mode == "pv" else [])]


@pytest.mark.parametrize("mode,vector", CONTROLS, ids=["-".join(c) for c in CONTROLS])
def test_probe_reaches_its_own_memory(mode, vector):
    """The control: the same vector aimed at the attacker's own VRAM (or RAM) reads the
    pattern there and leaves its marker -- so a hole would show in the test above --
    with nothing refused and the victim untouched."""
    own = "own_ram" if vector == "sysram" else "own_vram"
    attacker, victim, machine = attack(mode, vector, RAM_SECRET if own == "own_ram" else OFFSET)
    layout_as_assumed(machine)
    assert attacker.passed, (attacker.error(), attacker.record)
    rec = attacker.record
    assert rec["faulted"] == "0" and rec["refused"] == "0" and rec["wrote"] == "1"
    assert rec["data"] == SEEDS[own][:16].hex()
    assert machine.after[own] == MARKER[:16] + SEEDS[own][16:]
    assert refusals(machine.attacker_counts) == 0
    victim_unharmed(victim, machine)
