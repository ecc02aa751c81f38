"""BAR0 as a bus of register blocks (Firecracker's Bus / kvmtool's MMIO handlers).

Each block owns an address range and answers read/write at absolute BAR0 offsets, so the
register names from regs.py can be used unchanged inside the block.  Lookup is one list
index per access (the bus is built once), which keeps the trap path short.
"""

from __future__ import annotations

import logging
from typing import Callable

from gpuvm.device import regs
from gpuvm.device.counters import Counters

log = logging.getLogger(__name__)

UNIMPLEMENTED_VALUE = 0xBADF1100
_GRAIN_SHIFT = 11  # blocks start and end on 2 KiB boundaries


class RegisterBlock:
    """A BAR0 range with per-register read/write handlers; the rest is unimplemented."""

    name = "block"
    start = 0
    size = 0

    def __init__(self) -> None:
        self.readers: dict[int, Callable[[], int]] = {}
        self.writers: dict[int, Callable[[int], None]] = {}
        self.unlocked_writes: set[int] = set()

    def reg(self, offset: int, read: Callable[[], int] | None = None,
            write: Callable[[int], None] | None = None, plain: bool = False) -> None:
        """Register handlers.  Reads never take the device lock (they read one value);
        a write does unless `plain`: it only stores a value nothing else updates."""
        if read is not None:
            self.readers[offset] = read
        if write is not None:
            self.writers[offset] = write
            if plain:
                self.unlocked_writes.add(offset)

    def read(self, offset: int) -> int | None:
        """The register's value, or None when this block does not implement it."""
        handler = self.readers.get(offset)
        return None if handler is None else handler()

    def write(self, offset: int, value: int) -> bool:
        handler = self.writers.get(offset)
        if handler is None:
            return False
        handler(value)
        return True


class MmioBus:
    """BAR0 as a table of register blocks, one list index per access, so the trap path finds a
    register's block without a search."""

    def __init__(self, counters: Counters) -> None:
        self.counters = counters
        self._slots: list[RegisterBlock | None] = [None] * (regs.BAR0_SIZE >> _GRAIN_SHIFT)
        self._seen_unimplemented: set[tuple[int, str]] = set()
        self._keys: dict[str, tuple[str, str]] = {}

    def add(self, block: RegisterBlock) -> None:
        if block.start & ((1 << _GRAIN_SHIFT) - 1) or block.size & ((1 << _GRAIN_SHIFT) - 1):
            raise ValueError(f"block {block.name} is not 2 KiB aligned")
        for i in range(block.start >> _GRAIN_SHIFT, (block.start + block.size) >> _GRAIN_SHIFT):
            if self._slots[i] is not None:
                raise ValueError(f"block {block.name} overlaps {self._slots[i].name}")
            self._slots[i] = block
        self._keys[block.name] = (f"mmio.bar0.{block.name}.read", f"mmio.bar0.{block.name}.write")

    def fast_tables(self) -> tuple[dict[int, tuple[Callable[[], int], str]],
                                   dict[int, tuple[Callable[[int], None], str, bool]]]:
        """Every register handler by offset with its counter name (and, for writes, whether
        it needs the device lock): one dict lookup per access on the measured trap path."""
        reads: dict[int, tuple[Callable[[], int], str]] = {}
        writes: dict[int, tuple[Callable[[int], None], str, bool]] = {}
        for block in {b for b in self._slots if b is not None}:
            rkey, wkey = self._keys[block.name]
            reads.update({off: (fn, rkey) for off, fn in block.readers.items()})
            writes.update({off: (fn, wkey, off not in block.unlocked_writes)
                           for off, fn in block.writers.items()})
        return reads, writes

    def block_at(self, offset: int) -> RegisterBlock | None:
        if 0 <= offset < regs.BAR0_SIZE:
            return self._slots[offset >> _GRAIN_SHIFT]
        return None

    def unimplemented(self, offset: int, how: str) -> None:
        self.counters.inc("mmio.unimplemented")
        if (offset, how) not in self._seen_unimplemented:
            self._seen_unimplemented.add((offset, how))
            log.warning("BAR0 %s at %#08x: not implemented", how, offset)

    def read(self, offset: int, size: int) -> int:
        block = self._slots[offset >> _GRAIN_SHIFT] if 0 <= offset < regs.BAR0_SIZE else None
        if block is None or size != 4 or offset & 3:
            self.counters.inc("mmio.bar0.other.read")
            self.unimplemented(offset, f"read{size * 8}")
            return UNIMPLEMENTED_VALUE
        self.counters.total[self._keys[block.name][0]] += 1
        value = block.read(offset)
        if value is None:
            self.unimplemented(offset, "read")
            return UNIMPLEMENTED_VALUE
        return value

    def write(self, offset: int, size: int, value: int) -> None:
        block = self._slots[offset >> _GRAIN_SHIFT] if 0 <= offset < regs.BAR0_SIZE else None
        if block is None or size != 4 or offset & 3:
            self.counters.inc("mmio.bar0.other.write")
            self.unimplemented(offset, f"write{size * 8}")
            return
        self.counters.total[self._keys[block.name][1]] += 1
        if not block.write(offset, value & 0xFFFFFFFF):
            self.unimplemented(offset, "write")
