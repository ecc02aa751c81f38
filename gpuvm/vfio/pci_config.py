"""PCI configuration space of a gpuvm device: the region a VMM reads first.

QEMU's vfio-pci reads the vendor and device ids, sizes each BAR by writing all ones and
reading back, and sets the command register's memory/I/O/bus-master bits before it uses
the device.  This class answers exactly that: a type-0 header with the Quadro 6000's
identity, BAR size masks and a writable command register; every other byte reads as
written once and is otherwise read-only.
"""

from __future__ import annotations

from gpuvm.device import regs

_WRITABLE_COMMAND = regs.PCI_COMMAND_IO | regs.PCI_COMMAND_MEMORY | regs.PCI_COMMAND_MASTER


class PciConfig:
    """A device's PCI configuration space (IDs, BARs and their sizing, command register), so a
    VMM attaches the emulated GPU as it would a real card."""

    def __init__(self, device_id: int, bars: dict[int, tuple[int, bool]],
                 revision: int = regs.PCI_REVISION_QUADRO_6000) -> None:
        """`bars`: BAR index -> (size, is_io_port)."""
        self.space = bytearray(regs.PCI_CONFIG_SIZE)
        self.bars = dict(bars)
        self._put(regs.PCI_VENDOR_ID, 2, regs.PCI_VENDOR_NVIDIA)
        self._put(regs.PCI_DEVICE_ID, 2, device_id)
        self._put(regs.PCI_REVISION_ID, 1, revision)
        self._put(regs.PCI_CLASS_PROG, 3, regs.PCI_CLASS_DISPLAY_VGA)
        self._put(regs.PCI_SUBSYSTEM_VENDOR_ID, 2, regs.PCI_VENDOR_NVIDIA)
        self._put(regs.PCI_SUBSYSTEM_ID, 2, regs.PCI_SUBSYSTEM_QUADRO_6000)
        self._put(regs.PCI_INTERRUPT_PIN, 1, 1)  # INTA
        self._bar_values = {i: self._bar_flags(i) for i in self.bars}
        for i, v in self._bar_values.items():
            self._put(regs.PCI_BASE_ADDRESS_0 + 4 * i, 4, v)

    def _bar_flags(self, index: int) -> int:
        _, io = self.bars[index]
        if io:
            return regs.PCI_BASE_ADDRESS_SPACE_IO
        return 0 if index == regs.BAR0 else regs.PCI_BASE_ADDRESS_MEM_PREFETCH

    def _put(self, offset: int, size: int, value: int) -> None:
        self.space[offset:offset + size] = value.to_bytes(size, "little")

    def read(self, offset: int, size: int) -> int:
        if offset < 0 or offset + size > len(self.space):
            return (1 << (8 * size)) - 1
        return int.from_bytes(self.space[offset:offset + size], "little")

    def write(self, offset: int, size: int, value: int) -> None:
        if offset == regs.PCI_COMMAND and size in (2, 4):
            self._put(regs.PCI_COMMAND, 2, value & _WRITABLE_COMMAND)
            return
        index = (offset - regs.PCI_BASE_ADDRESS_0) // 4
        if size == 4 and offset % 4 == 0 and index in self.bars:
            # BAR sizing: the address bits take what is written, below the size they stay 0
            bar_size, _ = self.bars[index]
            flags = self._bar_flags(index)
            low = 0x3 if flags & regs.PCI_BASE_ADDRESS_SPACE_IO else 0xF
            self._put(offset, 4, (value & ~(bar_size - 1) & ~low & 0xFFFFFFFF) | flags)
        # anything else is read-only

    @property
    def command(self) -> int:
        return self.read(regs.PCI_COMMAND, 2)
