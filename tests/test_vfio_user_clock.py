"""A VM's vCPU on the server's virtual clock over vfio-user (gpuvm/vfio/user/vcpu_clock.py):
each access that reaches the device is one exit, priced where it is served; the VMM's
GPUVM_CLOCK ops carry the rest; a VMM that breaks the order or hangs up costs only its
own vCPU."""

from __future__ import annotations

import os
import select
import socket

import pytest

from gpuvm.device import regs
from gpuvm.device.clock import VirtualClock
from gpuvm.vfio import abi
from gpuvm.vfio.device import VfioError
from gpuvm.vfio.register_file import RegisterFileDevice
from gpuvm.vfio.user import protocol as p
from gpuvm.vfio.user.client import VfioUserDevice
from gpuvm.vfio.user.server import DeviceServer

PRICE = 100  # virtual ns each register write costs


class PricedRegisters(RegisterFileDevice):
    """Registers whose every write charges the vCPU, as a vGPU charges a trap."""

    party = None

    def bar_write(self, region: int, offset: int, size: int, value: int) -> None:
        super().bar_write(region, offset, size, value)
        self.party.charge(PRICE)


@pytest.fixture
def served():
    """A device served on a thread of its own, its vCPU a party of a virtual clock."""
    clock = VirtualClock()
    party = clock.guest("vm", scope="gpu")
    device = PricedRegisters({regs.BAR0: regs.BAR0_SIZE})
    device.party = party
    ours, theirs = socket.socketpair()
    server = DeviceServer(ours, device, name="vm")
    server.use_clock(party)
    server.start()
    client = VfioUserDevice(theirs, "vm")
    yield clock, party, server, client
    client.close()
    server.closed.wait(5)


def test_each_access_is_one_exit_priced_where_it_is_served(served):
    clock, party, server, client = served
    assert client.clock_op(p.CLOCK_START).v == 0
    for i in range(3):
        client.write(regs.BAR0, regs.PMC_INTR_EN, 4, i)
    assert party.exits == 3
    # the last write's price is added as the next exit starts (or the exit is closed)
    assert client.clock_op(p.CLOCK_NOW).v == 2 * PRICE
    assert client.clock_op(p.CLOCK_EXIT).v == 3 * PRICE and party.exits == 4
    assert client.clock_op(p.CLOCK_SETTLE).v == 3 * PRICE
    assert party.stream.entries == [["x", 3, PRICE, -1], ["x", 1, 0, -1]]


def test_a_wait_sleeps_in_virtual_time_and_the_server_wakes_the_vmm(served):
    clock, party, server, client = served
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    client.set_irqs(abi.VFIO_PCI_MSI_IRQ_INDEX, 0, [efd])
    client.clock_op(p.CLOCK_START)
    wait = client.clock_op(p.CLOCK_WAIT)
    stale = client.clock_op(p.CLOCK_BLOCK, wait.generation + 1)  # the GPU signalled since
    assert not party.blocked and stale.generation == wait.generation
    client.clock_op(p.CLOCK_BLOCK, wait.generation)
    assert party.blocked and not select.select([efd], [], [], 0)[0]
    timer = clock.timer("gpu work")
    timer.set_alarm(5000)
    assert clock.now_ns() == 5000  # a sleeping guest holds no time back
    clock.signal("gpu")  # its GPU completes at 5000: the VMM is told to look again
    assert select.select([efd], [], [], 5)[0] and not party.blocked
    timer.leave()
    assert client.clock_op(p.CLOCK_AWAKE).v == 5000
    assert party.stream.entries[-1] == ["w", 5000]
    os.close(efd)


def test_ops_out_of_order_are_refused_and_the_connection_goes_on(served):
    clock, party, server, client = served
    refused = "GPUVM_CLOCK refused by the server .EINVAL."
    with pytest.raises(VfioError, match=refused):
        client.clock_op(p.CLOCK_NOW)  # before START
    client.clock_op(p.CLOCK_START)
    for op in (p.CLOCK_START, p.CLOCK_BLOCK, p.CLOCK_AWAKE, 99):  # twice, outside a wait
        with pytest.raises(VfioError, match=refused):
            client.clock_op(op)
    client.clock_op(p.CLOCK_END)
    assert party not in clock._guests and server.vcpu.leaving is not None
    with pytest.raises(VfioError, match="EINVAL"):
        client.clock_op(p.CLOCK_NOW)
    with pytest.raises(VfioError, match="REGION_WRITE refused"):
        client.write(regs.BAR0, regs.PMC_INTR_EN, 4, 1)  # no exits after the end
    assert client.counters()["regs.writes"] == 0  # the connection goes on


def test_a_device_on_no_clock_refuses_its_ops_and_a_client_must_have_asked():
    ours, theirs = socket.socketpair()
    server = DeviceServer(ours, RegisterFileDevice({regs.BAR0: regs.BAR0_SIZE}),
                          name="wall").start()
    client = VfioUserDevice(theirs, "wall")
    with pytest.raises(VfioError, match="EINVAL"):
        client.clock_op(p.CLOCK_START)
    client.close()
    server.closed.wait(5)
    ours, theirs = socket.socketpair()
    server = DeviceServer(ours, RegisterFileDevice({regs.BAR0: regs.BAR0_SIZE}),
                          name="old").start()
    client = VfioUserDevice(theirs, "old", extensions=("mapping", "stats"))
    with pytest.raises(VfioError, match="offers no virtual clock"):
        client.clock_op(p.CLOCK_START)
    client.close()
    server.closed.wait(5)


def test_a_vmm_that_hangs_up_mid_run_retires_only_its_own_vcpu(served):
    clock, party, server, client = served
    other = clock.guest("other", at=1000)
    client.clock_op(p.CLOCK_START)
    client.write(regs.BAR0, regs.PMC_INTR_EN, 4, 1)
    assert clock.now_ns() == 0  # the running vCPU holds device time at its own
    client.close()  # the VMM dies between two exits
    assert server.closed.wait(5)
    assert party not in clock._guests  # retired: the timer it left holds its last time
    assert clock.now_ns() == PRICE
    server.vcpu.leaving.leave()  # its vGPU removed there
    assert clock.now_ns() == other.v == 1000
