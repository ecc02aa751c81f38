"""The measured GPU host-memory profile and its TOML form (experiments/costs/gpu-*.toml).

Every number keeps its spread (median, min, max over n repetitions) so a reader can see
how steady it was.  A `[costs]` table at the top summarises the medians the emulator's
cost model prices events with; the detailed tables below it are what they came from.
"""

from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from gpuvm.calibrate.stats import Spread

MiB = 1 << 20


@dataclass(frozen=True)
class MeasurementSetup:
    """What a profile was measured on and how (GPU, driver, runtime, kernel, THP modes,
    the command): without it a profile's numbers could not be told apart from another
    machine's, nor the run repeated."""

    gpu: str
    driver: str
    cuda_runtime: str
    backend: str
    date: str  # UTC, ISO 8601
    command: str
    kernel: str
    shmem_thp: str  # shmem_enabled's selected mode when the run began (and ended: restored)
    anon_thp: str  # /sys/kernel/mm/transparent_hugepage/enabled, selected mode
    reps: int
    chunk_bytes: int
    chunk_offset: int = 0  # start of the chunk grid of [costs] rows inside each region
    host: str = ""  # cores, memory, what kind of machine
    # the shmem THP mode the [costs] medians come from (rows carry their own)
    costs_shmem_thp: str = ""


@dataclass(frozen=True)
class ThpSetting:
    """One shmem THP mode the run asked for, and whether the kernel took it."""

    requested: str
    selected: str  # what shmem_enabled read while measuring
    note: str = ""  # why it could not be set ("" when it was)


@dataclass(frozen=True)
class Bandwidth:
    """One copy direction between device memory and pinned or pageable host memory."""

    direction: str  # "h2d" | "d2h"
    host: str  # "pinned" | "pageable"
    nbytes: int
    gib_s: Spread
    shmem_thp: str = ""
    seconds: list[float] = field(default_factory=list)  # every repetition


@dataclass(frozen=True)
class PinCost:
    """Registering (cudaHostRegister) a region chunk by chunk, then unregistering it."""

    memory: str  # a hostmem.REGION_KINDS name
    nbytes: int
    chunk_bytes: int
    chunks: int  # registrations per pass (one more than nbytes/chunk_bytes if offset)
    huge_kib: int  # kB of the region mapped by huge pages when measured (smaps)
    register_ms: Spread  # the whole region
    unregister_ms: Spread
    shmem_thp: str = ""
    chunk_offset: int = 0
    huge_kib_after: int = -1  # smaps once every pass was done (-1: not read)
    register_s: list[float] = field(default_factory=list)  # every repetition
    unregister_s: list[float] = field(default_factory=list)

    def per_chunk_us(self) -> tuple[float, float]:
        return (self.register_ms.median * 1000 / self.chunks,
                self.unregister_ms.median * 1000 / self.chunks)


@dataclass(frozen=True)
class CopyInto:
    """A device-to-host copy of a whole region, in one of the ways a driver can do it."""

    memory: str
    # "pageable": one cudaMemcpy into unpinned memory (the driver stages it);
    # "chunk-pinned": per chunk register, copy, unregister (how a proxied driver pins
    # pageable memory); "registered": all chunks registered first, copied chunk by chunk
    mode: str
    nbytes: int
    huge_kib_before: int  # the region's huge-mapped kB (smaps) before the copies
    huge_kib_after: int  # and after every repetition
    gib_s: Spread
    shmem_thp: str = ""
    chunk_offset: int = 0
    # system-wide /proc/meminfo ShmemHugePages (kB) before and after: huge pages that
    # still exist, mapped or not -- a split page leaves this count
    shmem_huge_kib_before: int = -1
    shmem_huge_kib_after: int = -1
    seconds: list[float] = field(default_factory=list)

    @property
    def huge_pages_split(self) -> int:
        """2 MiB pages of the region no longer huge-mapped after the copies."""
        return max(0, self.huge_kib_before - self.huge_kib_after) // 2048


@dataclass(frozen=True)
class SmartPin:
    """The smart-pinning benchmark at one allocation size under one pin policy: host
    allocations, their copies to the GPU and back, and their frees, timed together."""

    policy: str  # "none" (the profile run) | "all" | "smart" (pins the profile's hot ones)
    nbytes: int  # per allocation
    allocations: int
    rounds: int
    stride: int  # every stride-th allocation is hot
    pinned: int  # allocations pinned
    ms: Spread
    seconds: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class GpuProfile:
    """Everything one calibration run measured on a real GPU, with where and how: the file
    experiments read host-memory costs from, so a cost traces back to a measurement."""

    device: MeasurementSetup
    bandwidth: list[Bandwidth] = field(default_factory=list)
    pin: list[PinCost] = field(default_factory=list)
    d2h_into: list[CopyInto] = field(default_factory=list)
    thp: list[ThpSetting] = field(default_factory=list)
    smart: list[SmartPin] = field(default_factory=list)

    def costs_mode(self) -> str:
        """The shmem THP mode the medians come from: the last one whose memfd-thp rows
        really were on huge pages (so THP prices are THP), else the device's own."""
        huge = [p.shmem_thp for p in self.pin if p.memory == "memfd-thp" and p.huge_kib > 0]
        return huge[-1] if huge else self.device.costs_shmem_thp or self.device.shmem_thp

    def costs_rows(self, rows: list) -> list:
        """The rows [costs] comes from: the costs mode's, on the main chunk grid."""
        mode = self.costs_mode()
        picked = [r for r in rows if r.shmem_thp in ("", mode)
                  and getattr(r, "chunk_offset", 0) == self.device.chunk_offset]
        return picked or rows

    def thp_split_us(self) -> float:
        """Cost of one huge page split by chunked pinning, from what the kernel did: 0
        where no chunk-pinned copy into THP memory left fewer huge pages than it found;
        else the chunk-pinned D2H time into THP memory over that into 4 KiB memory (same
        mode, offset), per huge page split in one pass."""
        worst = 0.0
        by = {(c.memory, c.mode, c.shmem_thp, c.chunk_offset): c for c in self.d2h_into}
        for c in self.d2h_into:
            if c.memory != "memfd-thp" or c.mode != "chunk-pinned" or not c.huge_pages_split:
                continue
            base = by.get(("memfd-4k", c.mode, c.shmem_thp, c.chunk_offset))
            if base is None:
                continue
            extra_s = c.nbytes / (1 << 30) * (1 / c.gib_s.median - 1 / base.gib_s.median)
            worst = max(worst, extra_s * 1e6 / c.huge_pages_split)
        return round(worst, 3)

    def costs(self) -> dict[str, float]:
        """Medians the emulator prices events with: bandwidth at the largest size measured,
        pin/unpin per chunk per memory kind, the measured split cost."""
        out: dict[str, float] = {}
        bandwidth = self.costs_rows(self.bandwidth)
        largest = max((b.nbytes for b in bandwidth), default=0)
        for b in bandwidth:
            if b.nbytes == largest:
                out[f"{b.direction}_{b.host}_gib_s"] = round(b.gib_s.median, 3)
        for p in self.costs_rows(self.pin):
            key = p.memory.replace("-", "_")
            pin_us, unpin_us = p.per_chunk_us()
            out[f"pin_chunk_{key}_us"] = round(pin_us, 3)
            out[f"unpin_chunk_{key}_us"] = round(unpin_us, 3)
        for c in self.costs_rows(self.d2h_into):
            key = f"d2h_{c.mode}_{c.memory}".replace("-", "_")
            out[f"{key}_gib_s"] = round(c.gib_s.median, 3)
        if self.d2h_into:
            out["thp_split_us"] = self.thp_split_us()
        return out


# ------------------------------------------------------------------ TOML
def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Spread):
        return (f"{{ median = {v.median!r}, min = {v.min!r}, max = {v.max!r}, "
                f"n = {v.n} }}")
    text = str(v).replace("\\", "\\\\").replace('"', '\\"')
    return f'"{text}"'


def _table(obj: object) -> list[str]:
    return [f"{f.name} = {_value(getattr(obj, f.name))}" for f in fields(obj)]


def to_toml(profile: GpuProfile) -> str:
    d = profile.device
    lines = [
        f"# Host-memory costs measured on {d.gpu} (driver {d.driver}) on {d.date}",
        f"# by: {d.command}",
        "# Each measurement: median, min and max over n repetitions (GiB/s = 2^30 B/s);",
        "# seconds / register_s / unregister_s: every repetition, as timed.",
        "",
        "[costs]",
        *[f"{k} = {v!r}" for k, v in profile.costs().items()],
        "",
        "[device]",
        *_table(d),
    ]
    for name, rows in (("thp", profile.thp), ("bandwidth", profile.bandwidth),
                       ("pin", profile.pin), ("d2h_into", profile.d2h_into),
                       ("smart", profile.smart)):
        for row in rows:
            lines += ["", f"[[{name}]]", *_table(row)]
    return "\n".join(lines) + "\n"


def _spreads(table: dict) -> dict:
    return {k: Spread(**v) if isinstance(v, dict) else v for k, v in table.items()}


def from_toml(text: str) -> GpuProfile:
    data = tomllib.loads(text)
    return GpuProfile(
        MeasurementSetup(**data["device"]),
        [Bandwidth(**_spreads(t)) for t in data.get("bandwidth", [])],
        [PinCost(**_spreads(t)) for t in data.get("pin", [])],
        [CopyInto(**_spreads(t)) for t in data.get("d2h_into", [])],
        [ThpSetting(**t) for t in data.get("thp", [])],
        [SmartPin(**_spreads(t)) for t in data.get("smart", [])],
    )


def load(path: Path) -> GpuProfile:
    return from_toml(Path(path).read_text())


def to_json_dict(profile: GpuProfile) -> dict:
    out = asdict(profile)
    out["costs"] = profile.costs()
    return out
