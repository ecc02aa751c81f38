"""Which pages back host memory: the kernel's THP knobs, and huge-page counts read from
/proc/meminfo and /proc/self/smaps.

Why a module of its own, at the bottom: guest RAM (gpuvm.vmm.guest_ram) checks that its huge pages are
real and counts the splits a pin makes, and the GPU calibration (gpuvm.calibrate) reads
the same files around each transfer; both import it from here, below them.
"""

from __future__ import annotations

import re
from pathlib import Path

SHMEM_THP_KNOB = Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled")
ANON_THP_KNOB = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# smaps fields that count huge-page-mapped kB (anonymous, shmem, other files)
THP_FIELDS = ("AnonHugePages", "ShmemPmdMapped", "FilePmdMapped")

_VMA_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+)\s")
_KB_FIELD = re.compile(r"^(\w+):\s+(\d+) kB$")


def selected_mode(knob_text: str) -> str:
    """The active choice of a sysfs THP knob: 'always [madvise] never' -> 'madvise'."""
    match = re.search(r"\[([^\]]+)\]", knob_text)
    if match is None:
        raise ValueError(f"no [selected] mode in {knob_text.strip()!r}")
    return match.group(1)


def read_knob(path: Path) -> str:
    """The knob's selected mode, or 'unavailable' (no THP in this kernel, no sysfs)."""
    try:
        return selected_mode(path.read_text())
    except (OSError, ValueError):
        return "unavailable"


def set_knob(path: Path, mode: str) -> str | None:
    """Select `mode` on a sysfs THP knob; None once the knob reads it back, else why not
    (not root, no such knob, a mode this kernel lacks)."""
    try:
        path.write_text(mode)
    except OSError as exc:
        return f"cannot set {path} to {mode!r}: {exc.strerror or exc}"
    now = read_knob(path)
    return None if now == mode else f"{path} reads [{now}] after writing {mode!r}"


# /proc/meminfo counts of huge-page-backed memory, system wide (kB)
MEMINFO_HUGE = ("AnonHugePages", "ShmemHugePages", "ShmemPmdMapped")


def meminfo_kib(text: str | None = None) -> dict[str, int]:
    """The huge-page lines of /proc/meminfo (or of `text`), in kB; absent ones are 0."""
    if text is None:
        try:
            text = Path("/proc/meminfo").read_text()
        except OSError:
            text = ""
    out = dict.fromkeys(MEMINFO_HUGE, 0)
    for line in text.splitlines():
        kb = _KB_FIELD.match(line)
        if kb and kb.group(1) in out:
            out[kb.group(1)] = int(kb.group(2))
    return out


def smaps_kib(smaps_text: str, start: int, end: int) -> dict[str, int]:
    """Sum of every 'Name: N kB' field over the VMAs overlapping [start, end).

    A region is one VMA until madvise or mprotect splits it; summing over all overlapping
    VMAs counts it whole either way."""
    totals: dict[str, int] = {}
    inside = False
    for line in smaps_text.splitlines():
        header = _VMA_HEADER.match(line)
        if header:
            lo, hi = int(header.group(1), 16), int(header.group(2), 16)
            inside = lo < end and hi > start
            continue
        if inside:
            kb = _KB_FIELD.match(line)
            if kb:
                totals[kb.group(1)] = totals.get(kb.group(1), 0) + int(kb.group(2))
    return totals


def huge_kib(fields: dict[str, int]) -> int:
    """kB of a region mapped by huge pages (PMD mappings), whatever backs it."""
    return sum(fields.get(name, 0) for name in THP_FIELDS)
