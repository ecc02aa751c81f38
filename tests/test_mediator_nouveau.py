"""What a guest driver written from nouveau sees through a vGPU: its own runlist event
(gf100_fifo_runlist_commit / gf100_fifo_intr_runlist) and fault records decoded the way
gf100_fifo_intr_fault decodes them."""

from __future__ import annotations

from gpuvm.device import regs

from test_mediator_isolation import Vm, world  # noqa: F401  (fixture)


def test_each_vm_sees_its_own_runlist_event(world):  # noqa: F811
    """gf100_fifo_runlist_commit: write 0x2270, 0x2274 = 0x01f00000 | n, then wait for
    the runlist interrupt (0x2100 bit 30, PMC PFIFO) whose status 0x2a00 bit 28 the
    handler acks.  Acking one VM's event leaves the other VM's alone."""
    gpu, med, victim, attacker, targets = world
    for vm in (victim, attacker):  # both acked their events while setting up
        assert vm.drv.rd(0x2A00) == 0 and not vm.drv.rd(regs.PFIFO_INTR) & 0x40000000
    victim.drv.wr(regs.PFIFO_RUNLIST_SUBMIT, 0x01F00000 | 1)
    assert victim.drv.rd(regs.PFIFO_INTR) & 0x40000000
    assert victim.drv.rd(regs.PMC_INTR) & regs.PMC_INTR_PFIFO
    assert victim.drv.rd(0x2A00) == 0x10000000
    assert attacker.drv.rd(0x2A00) == 0  # not the other VM's
    victim.drv.wr(0x2A00, 0x10000000)
    assert not victim.drv.rd(regs.PFIFO_INTR) & 0x40000000
    assert not victim.drv.rd(0x227C) & 0x100000
    assert victim.copy(victim.rig.va(0), victim.rig.sys_va(0), 4)  # channel still served


def test_virtual_fault_records_name_source_and_client(world):  # noqa: F811
    """gf100_fifo_intr_fault through the vGPU: a BAR1 read of an unmapped page is a hub
    fault of client BAR_READ (7), a write BAR_WRITE (8); a copy fault is hub client
    PCOPY0 (1) in unit 0x15."""
    gpu, med, victim, attacker, targets = world
    vm = attacker
    rec = regs.PFIFO_FAULT_RECORD + 0x10 * regs.FAULT_UNIT_BAR1 + regs.PFIFO_FAULT_FLAGS
    vm.vgpu.read(regs.BAR1, 0x7F0000, 4)
    flags = vm.drv.rd(rec)
    assert ((flags >> 6) & 1, (flags >> 7) & 1, (flags >> 8) & 0x1F) == (1, 0, 7)
    vm.vgpu.write(regs.BAR1, 0x7F0000, 4, 0)
    flags = vm.drv.rd(rec)
    assert ((flags >> 6) & 1, (flags >> 7) & 1, (flags >> 8) & 0x1F) == (1, 1, 8)
    assert not vm.copy(0x7000000, vm.rig.sys_va(0), 4)
    flags = vm.drv.rd(regs.PFIFO_FAULT_RECORD + 0x10 * regs.FAULT_UNIT_PCOPY0 +
                      regs.PFIFO_FAULT_FLAGS)
    assert (flags & 0xF, (flags >> 6) & 1, (flags >> 8) & 0x1F) == \
        (regs.FAULT_PDE_NOT_PRESENT, 1, regs.FAULT_HUBCLIENT_PCOPY0)
