"""Region info and its capability chain: encode/decode round trip, the kernel's
too-small-buffer reply, and refusal of malformed chains."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuvm.vfio import abi
from gpuvm.vfio.caps import (REGION_INFO_SIZE, decode_region_info, encode_region_info,
                             required_argsz)
from gpuvm.vfio.device import RegionInfo, RegionType, SparseArea, VfioError

U32, U64 = 2**32 - 1, 2**64 - 1
CAPS = abi.VFIO_REGION_INFO_FLAG_CAPS


@st.composite
def region_infos(draw: st.DrawFn) -> RegionInfo:
    size = draw(st.integers(0, 2**48))
    areas = []
    for _ in range(draw(st.integers(0, 6))):
        offset = draw(st.integers(0, size))
        areas.append(SparseArea(offset, draw(st.integers(0, size - offset))))
    region_type = draw(st.none() | st.builds(RegionType, st.integers(0, U32),
                                             st.integers(0, U32)))
    flags = draw(st.integers(0, 0xF)) & ~CAPS
    if areas or region_type is not None:
        flags |= CAPS
    return RegionInfo(draw(st.integers(0, 64)), size, flags, tuple(areas),
                      draw(st.integers(0, U64)), region_type)


@given(region_infos(), st.integers(0, 64))
def test_round_trip_through_the_two_step_call(info: RegionInfo, slack: int) -> None:
    """First call with the bare structure: argsz grows iff there are capabilities; the
    second call, with that argsz (or more), decodes to the same RegionInfo."""
    first = encode_region_info(info, REGION_INFO_SIZE)
    assert len(first) == REGION_INFO_SIZE
    needed = required_argsz(first)
    fixed = abi.VfioRegionInfo.from_buffer_copy(first)
    assert fixed.cap_offset == 0
    if info.sparse or info.type is not None:
        assert needed > REGION_INFO_SIZE and fixed.flags & CAPS
        with pytest.raises(VfioError, match=f"ask again with {needed}"):
            decode_region_info(first)
    else:
        assert needed == REGION_INFO_SIZE
        assert decode_region_info(first) == info
    buffer = bytearray(needed + slack)
    reply = encode_region_info(info, len(buffer))
    buffer[:len(reply)] = reply
    assert decode_region_info(bytes(buffer)) == info


def test_layout_is_the_kernels() -> None:
    """Sparse cap right after the structure, type cap at the next 8-byte boundary,
    next offsets from the start of the buffer, 0 at the end."""
    info = RegionInfo(2, 0x100000, 0xF, (SparseArea(0x1000, 0x2000),), 0x20000000000,
                      RegionType(abi.VFIO_REGION_TYPE_PCI_VENDOR_TYPE | 0x10DE, 1))
    reply = encode_region_info(info, 200)
    argsz, flags, index, cap_offset, size, offset = struct.unpack_from("<IIIIQQ", reply)
    assert (argsz, flags, index, cap_offset, size, offset) == (200, 0xF, 2, 32, 0x100000,
                                                               0x20000000000)
    assert struct.unpack_from("<HHIII", reply, 32) == (1, 1, 64, 1, 0)  # sparse, next=64
    assert struct.unpack_from("<QQ", reply, 48) == (0x1000, 0x2000)
    assert struct.unpack_from("<HHIII", reply, 64) == (2, 1, 0, 0x800010DE, 1)
    assert len(reply) == 80


# ----------------------------------------------------------------------- malformed input
def _reply(argsz: int, cap_offset: int, caps: bytes, size: int = 0x10000) -> bytes:
    fixed = struct.pack("<IIIIQQ", argsz, 0xF, 0, cap_offset, size, 0)
    return (fixed + caps).ljust(max(argsz, REGION_INFO_SIZE), b"\0")


def _sparse(next_: int, areas: list[tuple[int, int]], version: int = 1,
            nr: int | None = None) -> bytes:
    body = b"".join(struct.pack("<QQ", o, s) for o, s in areas)
    return struct.pack("<HHIII", 1, version, next_, len(areas) if nr is None else nr, 0) + body


MALFORMED = {
    "loops back to offset 32": _reply(64, 32, _sparse(32, [(0, 0x1000)])),
    "chain loops back to offset 32": _reply(80, 32, struct.pack("<HHI", 9, 1, 48) + bytes(8)
                                      + struct.pack("<HHI", 9, 1, 32)),
    "offset 4096 is beyond argsz 48": _reply(48, 32, _sparse(4096, [])),
    "beyond argsz 32": _reply(32, 32, b""),
    "header at offset 40 is truncated": _reply(44, 32, struct.pack("<HHI", 9, 1, 40)),
    "inside the 32-byte fixed structure": _reply(64, 8, _sparse(0, [])),
    "not 8-byte aligned": _reply(64, 36, bytes(4) + _sparse(0, [])),
    "sparse-mmap (3 areas) capability at offset 32 needs 64 bytes": _reply(
        64, 32, _sparse(0, [(0, 1), (2, 1)], nr=3)),
    "runs past the region's 0x10000 bytes": _reply(64, 32, _sparse(0, [(0xF000, 0x2000)])),
    "sparse-mmap capability version 2": _reply(48, 32, _sparse(0, [], version=2)),
    "type capability at offset 32 needs 16 bytes": _reply(44, 32, struct.pack("<HHII", 2, 1,
                                                                              0, 7)),
    "capability 1 appears twice": _reply(64, 32, _sparse(48, []) + _sparse(0, [])),
    "ask again with 4096": _reply(4096, 0, b"")[:REGION_INFO_SIZE],
    "shorter than struct vfio_region_info": bytes(20),
}


@pytest.mark.parametrize("fault", list(MALFORMED))
def test_malformed_reply_is_refused_naming_the_fault(fault: str) -> None:
    with pytest.raises(VfioError, match=fault.replace("(", r"\(").replace(")", r"\)")) as err:
        decode_region_info(MALFORMED[fault])
    assert "\n" not in str(err.value)


def test_unknown_capabilities_are_stepped_over() -> None:
    """vfio-pci adds MSIX_MAPPABLE (id 3, a bare header) to BARs holding an MSI-X table."""
    msix = struct.pack("<HHI", abi.VFIO_REGION_INFO_CAP_SPARSE_MMAP + 2, 1, 40)
    reply = _reply(72, 32, msix + _sparse(0, [(0, 0x1000)]))
    assert decode_region_info(reply).sparse == (SparseArea(0, 0x1000),)


@given(st.binary(min_size=0, max_size=160))
def test_arbitrary_chain_bytes_give_a_region_info_or_one_vfio_error(tail: bytes) -> None:
    reply = _reply(REGION_INFO_SIZE + len(tail), 32, tail)
    try:
        info = decode_region_info(reply)
    except VfioError as err:
        assert "\n" not in str(err)
    else:
        assert all(a.offset + a.size <= info.size for a in info.sparse)


def test_argsz_below_the_structure_is_refused_by_the_encoder() -> None:
    with pytest.raises(VfioError, match="smaller than struct vfio_region_info"):
        encode_region_info(RegionInfo(0, 0, 0), 16)
