"""The mediator shadows guest page tables that live in the guest's RAM (a PDE with a
sysram target, as nouveau gf100_vmm_pgd_pde writes it), validates their entries like any
other, and refuses a table that is not wholly inside the VM's own RAM."""

from __future__ import annotations

import numpy as np
import pytest

from gpuvm.device import layout, regs
from gpuvm.device.layout import pte

from test_mediator_isolation import BAR1_SIZE, PATTERN, Vm, world  # noqa: F401  (fixture)

VA = 0x48000000  # PDE 9: a table of its own
PT_GPA = 16 * regs.MiB  # guest-physical address of the sysram page table
PT_INDEX = (VA >> 12) & (regs.SMALL_PTES_PER_PT - 1)


def sysram_pde(pt: int, target: int = regs.PDE_TARGET_SYSRAM) -> int:
    """A PDE as nouveau gf100_vmm_pgd_pde writes it for a small PT in host memory: its
    target, and VOL for coherent memory."""
    return layout.pde_small(pt, target, volatile=target == regs.PDE_TARGET_SYSRAM)


def point(vm: Vm, pde: int, entry: int, pt: int = PT_GPA) -> None:
    """The guest writes the entry into its RAM, the PDE into its directory, and flushes."""
    if 0 <= pt and pt + (PT_INDEX + 1) * 8 <= vm.ram.size:
        vm.ram.write(pt + 8 * PT_INDEX, np.array([entry & (2**64 - 1)], dtype=np.uint64))
    vm.drv.vram_wr64(vm.rig.space.pd + 8 * (VA >> regs.PDE_SPAN_SHIFT), pde)
    vm.drv.flush(vm.rig.space)


def counts(vm: Vm) -> dict[str, int]:
    return vm.vgpu.counters()


@pytest.mark.parametrize("target", [regs.PDE_TARGET_SYSRAM, regs.PDE_TARGET_SYSRAM_NOSNOOP])
def test_sysram_page_table_is_shadowed(world, target):  # noqa: F811
    """A guest table in its RAM maps its own VRAM: the copy through it works, the shadow
    says it synced a sysram table, and nothing was refused."""
    gpu, med, victim, attacker, targets = world
    vm = victim
    gpu.vram.u32[vm.vgpu.policy.host_vram(vm.rig.b) >> 2] = 0xABCD1234
    refused = counts(vm).get("shadow.ptes_refused", 0)
    point(vm, sysram_pde(PT_GPA, target), pte(vm.rig.b))
    assert vm.copy(VA, vm.rig.sys_va(1), 4)
    assert vm.ram.read_u32(vm.rig.sys_base + vm.rig.pages * 4096) == 0xABCD1234
    assert counts(vm)["shadow.sysram_tables"] >= 1
    assert counts(vm).get("shadow.ptes_refused", 0) == refused


@pytest.mark.parametrize("which", ["other VM's VRAM", "hypervisor VRAM"])
def test_sysram_page_table_entries_are_validated(world, which):  # noqa: F811
    """An entry in a sysram table that names another VM's VRAM (or the hypervisor's) is
    refused like any other (the copy faults), and the victim's data stays as it was."""
    gpu, med, victim, attacker, targets = world
    refused = counts(attacker).get("shadow.ptes_refused", 0)
    point(attacker, sysram_pde(PT_GPA), pte(targets[which] & ~0xFFF))
    assert not attacker.copy(VA, attacker.rig.sys_va(0), 4)
    assert counts(attacker)["shadow.ptes_refused"] > refused
    assert attacker.ram.read_u32(attacker.rig.sys_base) != PATTERN
    assert gpu.vram.u32[victim.vgpu.policy.host_vram(victim.rig.a) >> 2] == PATTERN


@pytest.mark.parametrize("pt", [32 * regs.MiB, 32 * regs.MiB - 4096, 1 << 32],
                         ids=["past-ram", "straddles-end", "far-away"])
def test_sysram_page_table_outside_the_vms_ram_is_refused(world, pt):  # noqa: F811
    """A PDE naming a sysram table that is not wholly inside the VM's RAM (its RAM is 32
    MiB) is refused: the PDE half is absent in the shadow, the access faults as 'PDE not
    present', and the refusal is counted."""
    gpu, med, victim, attacker, targets = world
    refused = counts(attacker).get("shadow.ptes_refused", 0)
    point(attacker, sysram_pde(pt & ~0xFFF), pte(attacker.rig.b), pt=pt & ~0xFFF)
    assert not attacker.copy(VA, attacker.rig.sys_va(0), 4)
    assert counts(attacker)["shadow.ptes_refused"] > refused
    fault = attacker.vgpu.faults()[-1]
    assert fault.vm_reason == regs.FAULT_PDE_NOT_PRESENT


def test_unflushed_sysram_table_change_does_not_reach_the_gpu(world):  # noqa: F811
    """The guest rewrites its sysram table behind the mediator's back (no flush): the GPU
    keeps walking the validated shadow, so the new entry -- another VM's VRAM -- is never
    used; after the flush it is refused."""
    gpu, med, victim, attacker, targets = world
    gpu.vram.u32[attacker.vgpu.policy.host_vram(attacker.rig.b) >> 2] = 0x1111
    point(attacker, sysram_pde(PT_GPA), pte(attacker.rig.b))
    assert attacker.copy(VA, attacker.rig.sys_va(0), 4)
    attacker.ram.write(PT_GPA + 8 * PT_INDEX, np.array(
        [pte(targets["other VM's VRAM"] & ~0xFFF) & (2**64 - 1)], dtype=np.uint64))
    assert attacker.copy(VA, attacker.rig.sys_va(0), 4)
    assert attacker.ram.read_u32(attacker.rig.sys_base) == 0x1111
    attacker.drv.flush(attacker.rig.space)
    assert not attacker.copy(VA, attacker.rig.sys_va(0), 4)
    assert gpu.vram.u32[victim.vgpu.policy.host_vram(victim.rig.a) >> 2] == PATTERN


def test_bar1_mode_clear_is_a_plain_window_onto_the_slice(world):  # noqa: F811
    """nouveau gf100_bar_bar1_fini clears PBUS_BAR1_VM bit 31: BAR1 offset x is then the
    guest's VRAM address x -- inside its slice, never beyond."""
    gpu, med, victim, attacker, targets = world
    vm = victim
    reg = vm.drv.rd(regs.PBUS_BAR1_VM)
    vm.drv.wr(regs.PBUS_BAR1_VM, reg & ~0x80000000)
    assert vm.vgpu.read(regs.BAR1, vm.rig.a, 4) == PATTERN
    vm.vgpu.write(regs.BAR1, vm.rig.b, 4, 0x5151)
    assert gpu.vram.u32[vm.vgpu.policy.host_vram(vm.rig.b) >> 2] == 0x5151
    vm.drv.wr(regs.PBUS_BAR1_VM, reg)  # MODE back on: the driver's BAR1 VM again
    assert vm.vgpu.read(regs.BAR1, vm.rig.a, 4) == 0xFFFFFFFF  # not mapped there
    assert vm.copy(vm.rig.va(0), vm.rig.sys_va(0), 4)


@pytest.mark.parametrize("where,ok", [(20 * regs.MiB, True), (32 * regs.MiB - 0x4000, False)],
                         ids=["inside-ram", "past-ram-end"])
def test_bar1_vm_page_table_in_sysram(world, where, ok):  # noqa: F811
    """The guest's BAR1 VM may name a small PT in its RAM too (same PDE format): the
    window is shadowed from there, or refused if the table runs past the VM's RAM."""
    gpu, med, victim, attacker, targets = world
    vm = victim
    space = vm.drv.bar1_space
    vm.drv.map(space, 0x200000, vm.rig.a)  # a BAR1 page onto the victim's secret buffer
    vm.drv.flush(space, bar_vm=True)
    assert vm.vgpu.read(regs.BAR1, 0x200000, 4) == PATTERN
    entries = BAR1_SIZE >> 12  # the window's entries, as the BAR VM's limit says
    table = gpu.vram.u8[vm.vgpu.policy.host_vram(space.pts[0]):][:8 * entries].copy()
    if where + 8 * entries <= vm.ram.size:
        vm.ram.write(where, table)
    vm.drv.vram_wr64(space.pd, sysram_pde(where, regs.PDE_TARGET_SYSRAM_NOSNOOP))
    vm.drv.flush(space, bar_vm=True)
    value = vm.vgpu.read(regs.BAR1, 0x200000, 4)
    assert (value == PATTERN) == ok
    if not ok:
        assert value == 0xFFFFFFFF
        assert vm.drv.rd(regs.PFIFO_FAULT_UNIT_MASK) & (1 << regs.FAULT_UNIT_BAR1)
