"""Builds guest programs with the machine's gcc, two ways from the same sources.

- flat: a freestanding x86-64 image linked at GUEST_IMAGE_BASE for KVM guests (entered at
  its first byte at CPL3; see guest_tools/boot/entry_kvm.c).
- shared: a host shared library for in-process guests (entry `gpuvm_guest_entry`).

The register map and ABI headers are generated from gpuvm.device.regs and gpuvm.vmm.abi
on every build, so the C side can never drift from the Python side.  A build is skipped
when a digest of its inputs (sources, headers, flags, compiler) is unchanged, so a stale
or missing output is rebuilt and a fresh one costs nothing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from gpuvm.device import regs
from gpuvm.vmm import abi

REPO_ROOT = Path(__file__).resolve().parents[2]


def _guest_tools() -> Path:
    """The guest sources: the checkout's guest_tools/, or the copy a `pip install .`
    puts inside the package (gpuvm/guest_tools, see setup.py)."""
    checkout = REPO_ROOT / "guest_tools"
    return checkout if checkout.is_dir() else Path(__file__).resolve().parents[1] / "guest_tools"


def _build_dir(tools: Path) -> Path:
    """Beside the sources when they are writable (a checkout); else a user cache dir (an
    installed package's directory is often read-only)."""
    if os.access(tools, os.W_OK):
        return tools / "build"
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "gpuvm" / "guest-build"


GUEST_TOOLS = _guest_tools()
BUILD_DIR = _build_dir(GUEST_TOOLS)
GENERATED = BUILD_DIR / "gen"
BOOT = GUEST_TOOLS / "boot"

COMMON_FLAGS = [
    "-std=gnu11", "-O2", "-ffreestanding", "-fno-builtin", "-fno-stack-protector",
    "-fcf-protection=none", "-fno-asynchronous-unwind-tables", "-Wall", "-Wextra",
    "-Werror=implicit-function-declaration", "-Wno-unused-parameter",
]
FLAT_FLAGS = ["-nostdlib", "-fno-pic", "-fno-pie", "-no-pie", "-mno-red-zone", "-static",
              "-Wl,--build-id=none"]
SHARED_FLAGS = ["-fPIC", "-shared", "-nostdlib", "-fvisibility=hidden",
                "-Wl,-z,defs"]  # an unresolved symbol fails the build, not the load


class BuildError(Exception):
    """A guest build failed; the message is one line naming the target and the cause."""


@dataclass
class GuestTarget:
    """One guest program: its sources (relative to guest_tools/) and its defines."""

    name: str
    sources: list[str]
    defines: dict[str, str] = field(default_factory=dict)
    include_dirs: list[str] = field(default_factory=list)

    def source_paths(self) -> list[Path]:
        return [(GUEST_TOOLS / s) if not Path(s).is_absolute() else Path(s)
                for s in self.sources]


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def generate_headers() -> Path:
    """(Re)write fermi_regs.h and gpuvm_abi.h; returns the include directory."""
    _write_if_changed(GENERATED / "fermi_regs.h", regs.c_header())
    _write_if_changed(GENERATED / "gpuvm_abi.h", abi.c_header())
    return GENERATED


def _compiler() -> str:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BuildError("guest build: no gcc on PATH (install gcc)")
    return cc


def _digest(target: GuestTarget, kind: str, argv: list[str]) -> str:
    h = hashlib.sha256()
    h.update(" ".join(argv).encode())
    h.update(kind.encode())
    inputs = target.source_paths() + sorted(GENERATED.glob("*.h"))
    for inc in [GUEST_TOOLS / "include", *(GUEST_TOOLS / d for d in target.include_dirs)]:
        if inc.is_dir():
            inputs += sorted(inc.rglob("*.h"))
    inputs += [BOOT / "flat.ld", BOOT / "entry_kvm.c", BOOT / "entry_host.c"]
    for p in inputs:
        h.update(str(p).encode())
        h.update(p.read_bytes() if p.exists() else b"<missing>")
    return h.hexdigest()


def _run(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        err = next((ln for ln in proc.stderr.splitlines() if "error" in ln),
                   proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "")
        raise BuildError(f"guest build of {what} failed: {err.strip()}")


def _build(target: GuestTarget, kind: str) -> Path:
    for src in target.source_paths():
        if not src.exists():
            raise BuildError(f"guest build of {target.name}: source {src} does not exist")
    inc = generate_headers()
    out_dir = BUILD_DIR / kind
    out_dir.mkdir(parents=True, exist_ok=True)
    cc = _compiler()
    include = [f"-I{inc}", f"-I{GUEST_TOOLS / 'include'}",
               *(f"-I{GUEST_TOOLS / d}" for d in target.include_dirs)]
    defines = [f"-D{k}={v}" if v else f"-D{k}" for k, v in sorted(target.defines.items())]
    srcs = [str(p) for p in target.source_paths()]
    if kind == "flat":
        elf = out_dir / f"{target.name}.elf"
        out = out_dir / f"{target.name}.bin"
        argv = [cc, *COMMON_FLAGS, *FLAT_FLAGS, "-DGPUVM_GUEST_KVM", *defines, *include,
                "-T", str(BOOT / "flat.ld"), "-o", str(elf), str(BOOT / "entry_kvm.c"), *srcs]
    else:
        out = out_dir / f"lib{target.name}.so"
        argv = [cc, *COMMON_FLAGS, *SHARED_FLAGS, "-DGPUVM_GUEST_HOST", *defines, *include,
                "-o", str(out), str(BOOT / "entry_host.c"), *srcs]
    stamp = out.with_suffix(out.suffix + ".digest")
    digest = _digest(target, kind, argv)
    if out.exists() and stamp.exists() and stamp.read_text() == digest:
        return out
    _run(argv, f"{target.name} ({kind})")
    if kind == "flat":
        _run(["objcopy", "-O", "binary", str(elf), str(out)], f"{target.name} (objcopy)")
        image_end = _symbol(elf, "__image_end")
        if image_end - abi.GUEST_IMAGE_BASE > abi.GUEST_IMAGE_MAX:
            raise BuildError(f"guest build of {target.name}: image with .bss is "
                             f"{image_end - abi.GUEST_IMAGE_BASE:#x} bytes, over the "
                             f"{abi.GUEST_IMAGE_MAX:#x} the layout allows")
    stamp.write_text(digest)
    return out


def _symbol(elf: Path, name: str) -> int:
    proc = subprocess.run(["nm", str(elf)], capture_output=True, text=True, check=True)
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == name:
            return int(parts[0], 16)
    raise BuildError(f"guest build: symbol {name} missing from {elf.name}")


def build_flat(target: GuestTarget) -> Path:
    """The flat KVM image of `target` (rebuilt only when its inputs changed)."""
    return _build(target, "flat")


def build_shared(target: GuestTarget) -> Path:
    """The in-process shared library of `target` (rebuilt only when its inputs changed)."""
    return _build(target, "shared")
