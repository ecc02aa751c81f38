"""The ctypes side of the VFIO ABI (gpuvm/vfio/abi.py) against the machine's own headers.

A C program generated here is compiled with gcc against <linux/vfio.h> (and
<linux/iommufd.h> where the machine has it) and prints every constant, ioctl number,
structure size and field offset that abi.py defines; each is checked against ctypes.
What the machine's headers do not define (the iommufd cdev ABI is newer than kernel 6.1)
is reported as absent and those checks skip, naming why.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpuvm.vfio import abi

VFIO_HEADER = Path("/usr/include/linux/vfio.h")

# What needs a newer header than kernel 6.1's: the C condition under which it exists.
_CDEV_GUARD = "defined(VFIO_DEVICE_BIND_IOMMUFD)"
_IOMMUFD_GUARD = "defined(HAVE_IOMMUFD_H)"
STRUCT_GUARDS = {
    "vfio_device_bind_iommufd": _CDEV_GUARD,
    "vfio_device_attach_iommufd_pt": _CDEV_GUARD,
    "iommu_ioas_alloc": _IOMMUFD_GUARD,
    "iommu_ioas_map": _IOMMUFD_GUARD,
    "iommu_ioas_unmap": _IOMMUFD_GUARD,
    "iommu_destroy": _IOMMUFD_GUARD,
}


def constant_names() -> list[str]:
    """Every integer constant abi.py defines (its public upper-case names)."""
    return sorted(name for name, value in vars(abi).items()
                  if re.fullmatch(r"(VFIO|IOMMU)[A-Z0-9_v]*", name)
                  and isinstance(value, int) and not isinstance(value, bool))


def constant_guard(name: str) -> str | None:
    if name.startswith("IOMMU"):
        return _IOMMUFD_GUARD
    if "IOMMUFD" in name:
        return f"defined({name})"
    return None


def struct_members(ctype: type[ctypes.Structure]) -> list[str]:
    names = [field[0] for field in ctype._fields_]
    flexible = getattr(ctype, "_flexible_", None)
    if flexible:
        names.append(flexible[0])
    return names


def c_program() -> str:
    lines = ["#include <stdio.h>", "#include <stddef.h>", "#include <linux/vfio.h>",
             "#if __has_include(<linux/iommufd.h>)", "#include <linux/iommufd.h>",
             "#define HAVE_IOMMUFD_H 1", "#endif", "int main(void) {"]

    def guarded(guard: str | None, what: str, body: list[str]) -> None:
        if guard is None:
            lines.extend(body)
            return
        lines.append(f"#if {guard}")
        lines.extend(body)
        lines.append("#else")
        lines.append(f'  puts("absent {what}");')
        lines.append("#endif")

    for name in constant_names():
        guarded(constant_guard(name), name,
                [f'  printf("const {name} %lld\\n", (long long)({name}));'])
    for cname, ctype in abi.C_STRUCTS.items():
        body = [f'  printf("size {cname} %zu\\n", sizeof(struct {cname}));']
        for member in struct_members(ctype):
            body.append(f'  printf("offset {cname}.{member} %zu\\n", '
                        f'offsetof(struct {cname}, {member}));')
        guarded(STRUCT_GUARDS.get(cname), cname, body)
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


class HeaderFacts:
    def __init__(self, output: str) -> None:
        self.values: dict[str, int] = {}
        self.absent: set[str] = set()
        for line in output.splitlines():
            kind, name, *rest = line.split()
            if kind == "absent":
                self.absent.add(name)
            else:
                value = int(rest[0])
                # (1 << 31) in C is an int: negative; the kernel stores it in a __u32
                self.values[f"{kind} {name}"] = value + (1 << 32) if value < 0 else value


@pytest.fixture(scope="module")
def header(tmp_path_factory: pytest.TempPathFactory) -> HeaderFacts:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed (make install puts it there)")
    if not VFIO_HEADER.exists():
        pytest.skip(f"{VFIO_HEADER} is missing: install Debian's linux-libc-dev "
                    "(make install does)")
    work = tmp_path_factory.mktemp("vfio_abi")
    source, binary = work / "abi.c", work / "abi"
    source.write_text(c_program())
    subprocess.run(["gcc", "-std=gnu11", "-Wall", "-Werror", "-o", str(binary), str(source)],
                   check=True, capture_output=True, text=True)
    return HeaderFacts(subprocess.run([str(binary)], check=True, capture_output=True,
                                      text=True).stdout)


def _present(header: HeaderFacts, name: str, guarded: bool) -> None:
    if name in header.absent:
        assert guarded, f"{name} is absent from the header but not expected to be"
        pytest.skip(f"{name} is not in this machine's headers (linux-libc-dev predates "
                    "the iommufd cdev ABI); checked where it is")


@pytest.mark.parametrize("name", constant_names())
def test_constant_and_ioctl_number_match_the_header(header: HeaderFacts, name: str) -> None:
    _present(header, name, constant_guard(name) is not None)
    assert getattr(abi, name) == header.values[f"const {name}"], name


@pytest.mark.parametrize("cname", sorted(abi.C_STRUCTS))
def test_structure_size_and_field_offsets_match_the_header(header: HeaderFacts,
                                                           cname: str) -> None:
    _present(header, cname, cname in STRUCT_GUARDS)
    ctype = abi.C_STRUCTS[cname]
    assert ctypes.sizeof(ctype) == header.values[f"size {cname}"], f"sizeof {cname}"
    for field in ctype._fields_:
        member = field[0]
        assert getattr(ctype, member).offset == header.values[f"offset {cname}.{member}"], \
            f"{cname}.{member}"
    flexible = getattr(ctype, "_flexible_", None)
    if flexible:  # the flexible array starts where the ctypes structure ends
        assert ctypes.sizeof(ctype) == header.values[f"offset {cname}.{flexible[0]}"]


def test_the_program_covers_the_abi(header: HeaderFacts) -> None:
    """Every constant and structure was either printed or reported absent; the
    container/group/type1 ABI that kernel 6.1 has is never absent."""
    printed = {key.split()[1] for key in header.values if key.startswith("const ")}
    assert printed | header.absent >= set(constant_names())
    for name in ("VFIO_GET_API_VERSION", "VFIO_IOMMU_MAP_DMA", "VFIO_DEVICE_SET_IRQS",
                 "VFIO_PCI_CONFIG_REGION_INDEX", "VFIO_TYPE1v2_IOMMU"):
        assert name in printed
    assert not (header.absent & {c for c in abi.C_STRUCTS if c not in STRUCT_GUARDS})


def test_ioctl_numbers_are_io_semicolon_100_plus_n() -> None:
    """The numbers the container/group/device path uses, written out: _IO(';', 100 + n)
    is 0x3b00 | (100 + n)."""
    assert abi.VFIO_GET_API_VERSION == 0x3B64
    assert abi.VFIO_GROUP_GET_DEVICE_FD == 0x3B6A
    assert abi.VFIO_DEVICE_GET_REGION_INFO == 0x3B6C
    assert abi.VFIO_IOMMU_UNMAP_DMA == 0x3B72
