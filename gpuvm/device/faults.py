"""Why a channel stopped, in the terms a driver would see."""

from __future__ import annotations

from dataclasses import dataclass

from gpuvm.device import regs

CHAN_ERROR_NAMES = {
    regs.CHAN_ERR_VM_FAULT_EXT: "vm-fault",
    regs.CHAN_ERR_BAD_METHOD_HEADER_EXT: "bad method header",
    regs.CHAN_ERR_UNKNOWN_CLASS_EXT: "unknown class",
    regs.CHAN_ERR_UNKNOWN_METHOD_EXT: "unknown method",
    regs.CHAN_ERR_BAD_GPFIFO_ENTRY_EXT: "bad GPFIFO entry",
    regs.CHAN_ERR_BAD_KERNEL_OBJECT_EXT: "bad kernel object",
    regs.CHAN_ERR_SIZE_LIMIT_EXT: "size past limits",
    regs.CHAN_ERR_NO_OBJECT_EXT: "no object bound",
    regs.CHAN_ERR_DMA_TARGET_EXT: "DMA target outside reachable memory",
    regs.CHAN_ERR_BAD_INSTANCE_EXT: "bad instance block",
    regs.CHAN_ERR_IB_EMPTY_EXT: "IB_EMPTY (zero-length GPFIFO entry)",
    regs.CHAN_ERR_UNSUPPORTED_EXT: "not modelled",
    regs.CHAN_ERR_TIMEOUT_EXT: "killed by the watchdog",
}


def hub_client(client: int) -> int:
    """Fault-record flag bits naming a hub client (SOURCE bit 6 set)."""
    return regs.PFIFO_FAULT_FLAGS_HUB | (client << regs.PFIFO_FAULT_FLAGS_CLIENT_SHIFT)


def gpc_client(client: int, gpc: int = 0) -> int:
    """Fault-record flag bits naming a client inside GPC `gpc` (SOURCE bit 6 clear)."""
    return (client << regs.PFIFO_FAULT_FLAGS_CLIENT_SHIFT) | \
        (gpc << regs.PFIFO_FAULT_FLAGS_GPC_SHIFT)


def bar_client(write: bool) -> int:
    """BAR accesses fault as hub client BAR_READ or BAR_WRITE (nouveau's names)."""
    return hub_client(regs.FAULT_HUBCLIENT_BAR_WRITE if write else regs.FAULT_HUBCLIENT_BAR_READ)


# Which client an engine's accesses fault as: PFIFO fetches and the copy engines are hub
# clients; compute loads and stores come from the GPCs (TPC0's L1 in this one-TPC model).
_UNIT_CLIENT = {
    regs.FAULT_UNIT_PFIFO: hub_client(regs.FAULT_HUBCLIENT_PFIFO),
    regs.FAULT_UNIT_PCOPY0: hub_client(regs.FAULT_HUBCLIENT_PCOPY0),
    regs.FAULT_UNIT_PCOPY1: hub_client(regs.FAULT_HUBCLIENT_PCOPY1),
    regs.FAULT_UNIT_PGRAPH: gpc_client(regs.FAULT_GPCCLIENT_TPC0_L1),
}


def fault_flags(unit: int, reason: int, write: bool) -> int:
    """The FLAGS word of a fault record: reason, SOURCE, WRITE and client, as
    nouveau's gf100_fifo_intr_fault decodes it."""
    if unit in (regs.FAULT_UNIT_BAR1, regs.FAULT_UNIT_BAR3):
        client = bar_client(write)
    else:
        client = _UNIT_CLIENT.get(unit, hub_client(regs.FAULT_HUBCLIENT_PFIFO))
    return (reason & regs.PFIFO_FAULT_FLAGS_REASON_MASK) | client | \
        (regs.PFIFO_FAULT_FLAGS_WRITE if write else 0)


@dataclass(frozen=True)
class ChannelFault:
    """A fault that stopped a channel (a VM fault, a bad method, an engine error), with what
    the hardware reports of it: how a failed run says why."""

    chid: int  # the channel id as whoever reads this knows it (physical on the device)
    reason: str  # e.g. "vm-fault: page not present", "bad method header"
    address: int = 0  # faulting GPU VA (VM faults) or the offending value
    engine: str = ""
    code: int = 0  # CHAN_ERR_*_EXT
    unit: int = -1  # fault unit of a VM fault (FAULT_UNIT_*), else -1
    vm_reason: int = -1  # FAULT_* reason of a VM fault, else -1
    write: bool = False

    def __str__(self) -> str:
        where = f" at {self.address:#x}" if self.address else ""
        engine = f" ({self.engine})" if self.engine else ""
        return f"channel {self.chid}{engine}: {self.reason}{where}"


class ChannelError(Exception):
    """Raised inside channel execution; stops that channel only."""

    def __init__(self, code: int, detail: str = "", address: int = 0) -> None:
        super().__init__(f"{CHAN_ERROR_NAMES.get(code, code)}: {detail}" if detail
                         else CHAN_ERROR_NAMES.get(code, str(code)))
        self.code = code
        self.detail = detail
        self.address = address
