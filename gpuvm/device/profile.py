"""Device profiles: what card the emulator pretends to be and how long its engines take.

Profiles are TOML data files (``profiles/<name>.toml`` or any path), so modelling another
card is a copy and an edit, not a code change.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields, replace
from pathlib import Path

from gpuvm.device import regs

PROFILE_DIR = Path(__file__).with_name("profiles")
DEFAULT_PROFILE = "quadro6000"


class ProfileError(ValueError):
    """A profile file is missing, malformed, or has an out-of-range value."""


@dataclass(frozen=True)
class CopyCosts:
    """What a copy costs on the modelled GPU: a launch, then bytes at VRAM or PCIe speed."""

    launch_ns: int
    vram_bytes_per_s: float
    pcie_bytes_per_s: float


@dataclass(frozen=True)
class ComputeCosts:
    """What a kernel costs on the modelled GPU: a launch, then its flops, bytes and loop
    iterations at the GPU's rates."""

    launch_ns: int
    flops_per_s: float
    bytes_per_s: float
    loop_ns_per_iteration: float


@dataclass(frozen=True)
class DeviceProfile:
    """One GPU model (PCI id, VRAM, BAR sizes, partitions, engine costs) loaded from a TOML
    profile, so the device and the mdev types follow the card named, not constants."""

    name: str
    pci_device: int
    boot0: int
    vram_size: int
    partitions: int
    bar1_size: int
    bar3_size: int
    copy: CopyCosts
    compute: ComputeCosts

    def with_vram(self, vram_size: int) -> "DeviceProfile":
        """The same card with a different amount of VRAM (tests, small machines)."""
        return replace(self, vram_size=vram_size)


def _section(data: dict, key: str, source: str, cls: type) -> object:
    sec = data.get(key)
    if not isinstance(sec, dict):
        raise ProfileError(f"{source}: missing [{key}] table")
    names = {f.name for f in fields(cls)}
    unknown = set(sec) - names
    if unknown:
        raise ProfileError(f"{source}: [{key}] has unknown key {sorted(unknown)[0]!r}")
    missing = names - set(sec)
    if missing:
        raise ProfileError(f"{source}: [{key}] is missing {sorted(missing)[0]!r}")
    for name, value in sec.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
            raise ProfileError(f"{source}: [{key}].{name} must be a positive number")
    return cls(**sec)


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> DeviceProfile:
    path = Path(name_or_path)
    if not path.suffix:
        path = PROFILE_DIR / f"{name_or_path}.toml"
    source = str(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ProfileError(f"device profile {source!r} not found ({path})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"device profile {source}: {exc}") from None
    dev = data.get("device")
    if not isinstance(dev, dict):
        raise ProfileError(f"{source}: missing [device] table")
    try:
        vram = int(dev["vram_mib"]) * regs.MiB
        partitions = int(dev["partitions"])
        prof = DeviceProfile(
            name=str(dev["name"]), pci_device=int(dev["pci_device"]), boot0=int(dev["boot0"]),
            vram_size=vram, partitions=partitions,
            bar1_size=int(dev["bar1_mib"]) * regs.MiB, bar3_size=int(dev["bar3_mib"]) * regs.MiB,
            copy=_section(data, "copy", source, CopyCosts),  # type: ignore[arg-type]
            compute=_section(data, "compute", source, ComputeCosts),  # type: ignore[arg-type]
        )
    except KeyError as exc:
        raise ProfileError(f"{source}: [device] is missing {exc.args[0]!r}") from None
    if not 1 <= partitions <= regs.PFB_MAX_PARTS or vram % (partitions * regs.MiB):
        raise ProfileError(f"{source}: vram_mib must split evenly over 1-{regs.PFB_MAX_PARTS} "
                           "partitions")
    return prof
