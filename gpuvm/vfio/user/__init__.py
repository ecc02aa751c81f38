"""vfio-user: a gpuvm device served to a VMM in another process over a UNIX socket.

`protocol.py` is the wire format (QEMU's docs/interop/vfio-user.rst, protocol 0.1),
`server.py` serves any VfioDevice on one connection, `client.py` is the VMM's
`VfioUserDevice`, and `serve.py` is the `gpuvm serve` daemon (one socket per mdev).

What the spec does not cover, and gpuvm adds (offered in VERSION's JSON as
`"capabilities": {"gpuvm": ["mapping", "stats"]}`; a server that did not list an
extension in its reply never sees its commands, and a client that did not ask never
receives them):

- Run-time BAR remap (extension "mapping").  A vGPU decides page by page, as the guest
  edits its BAR page tables, which BAR1/BAR3 pages may be mapped into the guest.  The
  spec's sparse-mmap capability is static, so:
  * GET_REGION_INFO of a remap region says MMAP|CAPS with a sparse area covering the
    region (as in-process) and carries one fd: the memfd of that vGPU's own partition of
    VRAM (each partition is a memfd of its own, sealed against resizing: see
    gpuvm/device/vram.py), so a VMM can map its partition's pages and no one else's.
    Its reply `offset` is 0; the client maps the fd whole, once (MAP_SHARED, NORESERVE:
    nothing is committed).
  * GPUVM_MAPPING_LISTEN (0x8001, client -> server, {u32 enable}, empty reply) is
    `set_mapping_listener`: 1 installs a listener in the server that forwards grants,
    0 revokes every grant and removes it.
  * GPUVM_MAPPING_EVENT (0x8002, server -> client, no-reply flag set, {u32 region,
    u32 kind (1 map, 0 unmap), u64 offset in the region, u64 offset in the fd,
    u64 size}) is one grant or revocation; `offset in the fd` counts from the start of
    the partition's memfd.  The server sends it while it handles the
    command that caused it, ahead of that command's reply, and the client applies it
    (a KVM memslot) before returning -- the order an in-process listener sees.  The
    client maps only what the events name, inside the region's sparse areas (the
    MemslotListener checks).
- Lab counters (extension "stats").  GPUVM_DEVICE_STATS (0x8003, client -> server,
  request {u32 what}: 1 counters, 2 faults, 4 device time; an empty request means all)
  replies with UTF-8 JSON holding the parts asked for: {"counters": {name: int},
  "faults": [the ChannelFault fields], "device_time_ns": int} -- what DeviceStats returns
  in-process, so a guest session's per-phase counts are the same over the socket.  A
  fence wait asks for the faults alone on each check, which keeps that cheap.
"""
