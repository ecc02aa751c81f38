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
}


@dataclass(frozen=True)
class ChannelFault:
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
