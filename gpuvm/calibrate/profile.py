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
class DeviceInfo:
    gpu: str
    driver: str
    cuda_runtime: str
    backend: str
    date: str  # UTC, ISO 8601
    command: str
    kernel: str
    shmem_thp: str  # /sys/kernel/mm/transparent_hugepage/shmem_enabled, selected mode
    anon_thp: str  # /sys/kernel/mm/transparent_hugepage/enabled, selected mode
    reps: int
    chunk_bytes: int
    chunk_offset: int = 0  # start of the chunk grid inside each region



@dataclass(frozen=True)
class Bandwidth:
    """One copy direction between device memory and pinned or pageable host memory."""

    direction: str  # "h2d" | "d2h"
    host: str  # "pinned" | "pageable"
    nbytes: int
    gib_s: Spread


@dataclass(frozen=True)
class PinCost:
    """Registering (cudaHostRegister) a region chunk by chunk, then unregistering it."""

    memory: str  # a hostmem.REGION_KINDS name
    nbytes: int
    chunk_bytes: int
    chunks: int  # registrations per pass (one more than nbytes/chunk_bytes if offset)
    huge_kib: int  # kB of the region mapped by huge pages when measured
    register_ms: Spread  # the whole region
    unregister_ms: Spread


@dataclass(frozen=True)
class CopyInto:
    """A device-to-host copy of a whole region, in one of the ways a driver can do it."""

    memory: str
    # "pageable": one cudaMemcpy into unpinned memory (the driver stages it);
    # "chunk-pinned": per chunk register, copy, unregister (how a proxied driver pins
    # pageable memory); "registered": all chunks registered first, copied chunk by chunk
    mode: str
    nbytes: int
    huge_kib_before: int
    huge_kib_after: int
    gib_s: Spread


@dataclass(frozen=True)
class GpuProfile:
    device: DeviceInfo
    bandwidth: list[Bandwidth] = field(default_factory=list)
    pin: list[PinCost] = field(default_factory=list)
    d2h_into: list[CopyInto] = field(default_factory=list)

    def costs(self) -> dict[str, float]:
        """Medians the emulator prices events with: bandwidth at the largest size measured,
        pin/unpin per chunk per memory kind."""
        out: dict[str, float] = {}
        largest = max((b.nbytes for b in self.bandwidth), default=0)
        for b in self.bandwidth:
            if b.nbytes == largest:
                out[f"{b.direction}_{b.host}_gib_s"] = round(b.gib_s.median, 3)
        for p in self.pin:
            key = p.memory.replace("-", "_")
            out[f"pin_chunk_{key}_us"] = round(p.register_ms.median * 1000 / p.chunks, 3)
            out[f"unpin_chunk_{key}_us"] = round(p.unregister_ms.median * 1000 / p.chunks, 3)
        for c in self.d2h_into:
            key = f"d2h_{c.mode}_{c.memory}".replace("-", "_")
            out[f"{key}_gib_s"] = round(c.gib_s.median, 3)
        return out


# ------------------------------------------------------------------ TOML
def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
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
        "# Each measurement: median, min and max over n repetitions (GiB/s = 2^30 B/s).",
        "",
        "[costs]",
        *[f"{k} = {v!r}" for k, v in profile.costs().items()],
        "",
        "[device]",
        *_table(d),
    ]
    for name, rows in (("bandwidth", profile.bandwidth), ("pin", profile.pin),
                       ("d2h_into", profile.d2h_into)):
        for row in rows:
            lines += ["", f"[[{name}]]", *_table(row)]
    return "\n".join(lines) + "\n"


def _spreads(table: dict) -> dict:
    return {k: Spread(**v) if isinstance(v, dict) else v for k, v in table.items()}


def from_toml(text: str) -> GpuProfile:
    data = tomllib.loads(text)
    return GpuProfile(
        DeviceInfo(**data["device"]),
        [Bandwidth(**_spreads(t)) for t in data.get("bandwidth", [])],
        [PinCost(**_spreads(t)) for t in data.get("pin", [])],
        [CopyInto(**_spreads(t)) for t in data.get("d2h_into", [])],
    )


def load(path: Path) -> GpuProfile:
    return from_toml(Path(path).read_text())


def to_json_dict(profile: GpuProfile) -> dict:
    out = asdict(profile)
    out["costs"] = profile.costs()
    return out
