"""The port protocol's wait: fences, timeouts, and faults reported exactly once."""

from __future__ import annotations

import numpy as np

from vfio_doubles import BarRegisterDevice, attached

from gpuvm.device import regs
from gpuvm.device.faults import ChannelFault
from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.guest_session import GuestSession

FENCE, REC = 0x1000, 0x2000


class FaultyTarget(BarRegisterDevice):
    def __init__(self) -> None:
        super().__init__({0: regs.BAR0_SIZE})
        self.fault_list: list[ChannelFault] = []

    def faults(self):
        return list(self.fault_list)


def wait(session: GuestSession, ram: GuestRam, value: int) -> int:
    rec = ram.struct_at(REC, abi.WaitRecord)
    rec.addr, rec.value, rec.timeout_ns = FENCE, value, 1_000_000
    del rec
    session.port_out(abi.PORT_WAIT, REC)
    return ram.struct_at(REC, abi.WaitRecord).status


def test_fault_before_the_wait_is_reported_once():
    ram = GuestRam(1 << 20)
    target = FaultyTarget()
    session = GuestSession("t", ram, attached(target, ram))
    target.fault_list.append(ChannelFault(0, "vm-fault: page not present"))  # before the wait
    assert wait(session, ram, 1) == abi.WAIT_FAULT
    assert wait(session, ram, 1) == abi.WAIT_TIMEOUT  # the same fault is not reported twice
    ram.write(FENCE, np.array([1], dtype=np.uint32))
    assert wait(session, ram, 1) == abi.WAIT_OK
    target.fault_list.append(ChannelFault(1, "bad method header"))
    assert wait(session, ram, 1) == abi.WAIT_OK  # the fence already passed: that wins
