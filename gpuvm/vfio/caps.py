"""The bytes of VFIO_DEVICE_GET_REGION_INFO: struct vfio_region_info and its capability
chain, encoded from and decoded into a `RegionInfo`.

The kernel's reply is a fixed structure followed, when the caller's buffer (`argsz`) is
large enough, by a chain of capabilities: each starts with {u16 id, u16 version, u32 next}
where `next` is an offset from the start of the buffer (0 ends the chain), and each is
placed at an 8-byte boundary.  When the buffer is too small the kernel still sets the
CAPS flag but writes only the fixed structure, with cap_offset 0 and argsz raised to the
size it needs; the caller asks again with that size.  `encode_region_info` produces what
a device would return for a given argsz (the kernel client's tests and any device server
use it); `decode_region_info` is what a VMM runs on a reply, and it trusts nothing: a
chain that loops, points outside argsz or into the fixed structure, or is cut short is
refused with a VfioError naming the fault.  Capabilities it does not know (vfio-pci's
MSIX_MAPPABLE, for one) are stepped over.
"""

from __future__ import annotations

import ctypes

from gpuvm.vfio import abi
from gpuvm.vfio.device import RegionInfo, RegionType, SparseArea, VfioError

REGION_INFO_SIZE = ctypes.sizeof(abi.VfioRegionInfo)
CAP_HEADER_SIZE = ctypes.sizeof(abi.VfioInfoCapHeader)
SPARSE_CAP_SIZE = ctypes.sizeof(abi.VfioRegionInfoCapSparseMmap)
SPARSE_AREA_SIZE = ctypes.sizeof(abi.VfioRegionSparseMmapArea)
TYPE_CAP_SIZE = ctypes.sizeof(abi.VfioRegionInfoCapType)
CAP_ALIGN = 8
SPARSE_MMAP_VERSION = 1
TYPE_VERSION = 1


# ------------------------------------------------------------------------------- encode
def _sparse_cap(areas: tuple[SparseArea, ...]) -> bytes:
    cap = abi.VfioRegionInfoCapSparseMmap(nr_areas=len(areas))
    cap.header.id = abi.VFIO_REGION_INFO_CAP_SPARSE_MMAP
    cap.header.version = SPARSE_MMAP_VERSION
    return bytes(cap) + b"".join(bytes(abi.VfioRegionSparseMmapArea(a.offset, a.size))
                                 for a in areas)


def _type_cap(region_type: RegionType) -> bytes:
    cap = abi.VfioRegionInfoCapType(type=region_type.type, subtype=region_type.subtype)
    cap.header.id = abi.VFIO_REGION_INFO_CAP_TYPE
    cap.header.version = TYPE_VERSION
    return bytes(cap)


def encode_chain(caps: list[bytes], start: int) -> bytes:
    """Lay capabilities out one after another from buffer offset `start`, each at an
    8-byte boundary, linking each header's `next` to the following one."""
    chain = bytearray()
    offsets = []
    for cap in caps:
        chain += bytes(-(start + len(chain)) % CAP_ALIGN)
        offsets.append(start + len(chain))
        chain += cap
    for i, offset in enumerate(offsets):
        following = offsets[i + 1] if i + 1 < len(offsets) else 0
        header = abi.VfioInfoCapHeader.from_buffer(chain, offset - start)
        header.next = following
    return bytes(chain)


def region_capabilities(info: RegionInfo) -> list[bytes]:
    """The capabilities a region reports, in the order vfio-pci emits them."""
    caps = []
    if info.sparse:
        caps.append(_sparse_cap(info.sparse))
    if info.type is not None:
        caps.append(_type_cap(info.type))
    return caps


def encode_region_info(info: RegionInfo, argsz: int) -> bytes:
    """What VFIO_DEVICE_GET_REGION_INFO leaves in a caller's buffer of `argsz` bytes:
    the structure and its chain when they fit, else the structure alone with argsz
    raised to the size needed and cap_offset 0."""
    if argsz < REGION_INFO_SIZE:
        raise VfioError(f"argsz {argsz} is smaller than struct vfio_region_info "
                        f"({REGION_INFO_SIZE} bytes)")
    chain = encode_chain(region_capabilities(info), REGION_INFO_SIZE)
    flags = info.flags | (abi.VFIO_REGION_INFO_FLAG_CAPS if chain else 0)
    reply = abi.VfioRegionInfo(argsz=argsz, flags=flags, index=info.index, cap_offset=0,
                               size=info.size, offset=info.offset)
    needed = REGION_INFO_SIZE + len(chain)
    if not chain:
        return bytes(reply)
    if argsz < needed:
        reply.argsz = needed
        return bytes(reply)
    reply.cap_offset = REGION_INFO_SIZE
    return bytes(reply) + chain


# ------------------------------------------------------------------------------- decode
def required_argsz(reply: bytes) -> int:
    """The argsz a reply asks for (larger than the buffer when the chain did not fit)."""
    if len(reply) < 4:
        raise VfioError(f"region info reply of {len(reply)} bytes has no argsz")
    return int.from_bytes(reply[:4], "little")


def walk_chain(buf: bytes, first: int, fixed_size: int,
               what: str) -> list[tuple[int, abi.VfioInfoCapHeader]]:
    """The (offset, header) of each capability from `first`, checking that every link
    lies inside `buf` (the caller's argsz bytes), past the fixed structure, aligned, and
    that the chain ends."""
    found: list[tuple[int, abi.VfioInfoCapHeader]] = []
    seen: set[int] = set()
    offset = first
    while offset:
        if offset in seen:
            raise VfioError(f"{what}: capability chain loops back to offset {offset}")
        seen.add(offset)
        if offset < fixed_size:
            raise VfioError(f"{what}: capability at offset {offset} lies inside the "
                            f"{fixed_size}-byte fixed structure")
        if offset >= len(buf):
            raise VfioError(f"{what}: capability offset {offset} is beyond argsz "
                            f"{len(buf)}")
        if offset % CAP_ALIGN:
            raise VfioError(f"{what}: capability offset {offset} is not "
                            f"{CAP_ALIGN}-byte aligned")
        if offset + CAP_HEADER_SIZE > len(buf):
            raise VfioError(f"{what}: capability header at offset {offset} is truncated "
                            f"by argsz {len(buf)}")
        header = abi.VfioInfoCapHeader.from_buffer_copy(buf, offset)
        found.append((offset, header))
        offset = header.next
    return found


def _need(buf: bytes, offset: int, size: int, what: str, cap: str) -> None:
    if offset + size > len(buf):
        raise VfioError(f"{what}: {cap} capability at offset {offset} needs {size} bytes "
                        f"but argsz {len(buf)} leaves {len(buf) - offset}")


def _version(header: abi.VfioInfoCapHeader, expected: int, what: str, cap: str) -> None:
    if header.version != expected:
        raise VfioError(f"{what}: {cap} capability version {header.version} "
                        f"(gpuvm reads version {expected})")


def _sparse_areas(buf: bytes, offset: int, region_size: int,
                  what: str) -> tuple[SparseArea, ...]:
    _need(buf, offset, SPARSE_CAP_SIZE, what, "sparse-mmap")
    cap = abi.VfioRegionInfoCapSparseMmap.from_buffer_copy(buf, offset)
    _need(buf, offset, SPARSE_CAP_SIZE + cap.nr_areas * SPARSE_AREA_SIZE, what,
          f"sparse-mmap ({cap.nr_areas} areas)")
    areas = []
    for i in range(cap.nr_areas):
        raw = abi.VfioRegionSparseMmapArea.from_buffer_copy(
            buf, offset + SPARSE_CAP_SIZE + i * SPARSE_AREA_SIZE)
        if raw.offset + raw.size > region_size:
            raise VfioError(f"{what}: sparse-mmap area {i} [{raw.offset:#x}, "
                            f"+{raw.size:#x}) runs past the region's {region_size:#x} bytes")
        areas.append(SparseArea(raw.offset, raw.size))
    return tuple(areas)


def decode_region_info(reply: bytes) -> RegionInfo:
    """A RegionInfo from the bytes of a VFIO_DEVICE_GET_REGION_INFO reply (the whole
    buffer the caller passed); VfioError, naming the fault, for anything malformed."""
    if len(reply) < REGION_INFO_SIZE:
        raise VfioError(f"region info is {len(reply)} bytes, shorter than struct "
                        f"vfio_region_info ({REGION_INFO_SIZE})")
    fixed = abi.VfioRegionInfo.from_buffer_copy(reply)
    what = f"region {fixed.index} info"
    sparse: tuple[SparseArea, ...] = ()
    region_type: RegionType | None = None
    if fixed.flags & abi.VFIO_REGION_INFO_FLAG_CAPS:
        if fixed.argsz > len(reply):
            raise VfioError(f"{what}: its capabilities need argsz {fixed.argsz}, the "
                            f"buffer had {len(reply)}; ask again with {fixed.argsz}")
        if fixed.argsz < REGION_INFO_SIZE and fixed.cap_offset:
            raise VfioError(f"{what}: argsz {fixed.argsz} is shorter than the structure")
        chain = reply[:fixed.argsz]
        seen_ids: set[int] = set()
        for offset, header in walk_chain(chain, fixed.cap_offset, REGION_INFO_SIZE, what):
            if header.id in seen_ids and header.id in (abi.VFIO_REGION_INFO_CAP_SPARSE_MMAP,
                                                       abi.VFIO_REGION_INFO_CAP_TYPE):
                raise VfioError(f"{what}: capability {header.id} appears twice")
            seen_ids.add(header.id)
            if header.id == abi.VFIO_REGION_INFO_CAP_SPARSE_MMAP:
                _version(header, SPARSE_MMAP_VERSION, what, "sparse-mmap")
                sparse = _sparse_areas(chain, offset, fixed.size, what)
            elif header.id == abi.VFIO_REGION_INFO_CAP_TYPE:
                _version(header, TYPE_VERSION, what, "type")
                _need(chain, offset, TYPE_CAP_SIZE, what, "type")
                cap = abi.VfioRegionInfoCapType.from_buffer_copy(chain, offset)
                region_type = RegionType(cap.type, cap.subtype)
    return RegionInfo(fixed.index, fixed.size, fixed.flags, sparse, fixed.offset,
                      region_type)
