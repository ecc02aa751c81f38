"""vfio-user: a gpuvm device served to a VMM in another process over a UNIX socket.

`protocol.py` is the wire format (QEMU's docs/interop/vfio-user.rst, protocol 0.1),
`server.py` serves any VfioDevice on one connection, `client.py` is the VMM's
`VfioUserDevice`, and `serve.py` is the `gpuvm serve` daemon (one socket per mdev).
Both sides are tried against an independent implementation, Nutanix libvfio-user
(tests/test_vfio_user_interop.py), and the server against a hostile client
(`gpuvm bench vfio-user-fuzz`).


What gpuvm does with each command of the spec (server: `server.py`; client: `client.py`).
Every command gets a reply; a refused one an error reply with the errno named here, and
the connection goes on.  The server closes a connection only where the stream cannot go
on: a header whose size is below 16 or above MAX_MESSAGE_SIZE (E2BIG), a command before
VERSION (EINVAL), a major version other than 0 (ENOTSUP).

====  ===========================  ===================================================
 id   command                      gpuvm
====  ===========================  ===================================================
  1   VERSION                      0.1.  Capabilities: max_msg_fds 8, max_data_xfer_size
                                   1 MiB, max_dma_maps 1024, pgsizes 4096,
                                   write_multiple true; gpuvm's
                                   extensions (below) when both sides list them.
                                   Twin-socket mode: not offered.  A second VERSION:
                                   EINVAL.
  2   DMA_MAP                      With one fd (a file or memfd holding the whole
                                   window; a memfd is sealed against shrinking): mapped
                                   and handed to the device.  Without an fd: EINVAL
                                   (gpuvm's device reads guest memory in place, not by
                                   DMA_READ/WRITE).  Overlap: EEXIST; unaligned, empty,
                                   unknown flags: EINVAL; more than max_dma_maps:
                                   ENOSPC.
  3   DMA_UNMAP                    The mappings inside [address, +size) (a range that
                                   cuts one, or matches none: EINVAL); flag ALL (bit 1,
                                   address and size 0) unmaps every one; dirty bitmap
                                   (bit 0): ENOTSUP.  The reply echoes the request.
  4   DEVICE_GET_INFO              PCI | RESET, 9 regions, 5 IRQ indices.
  5   DEVICE_GET_REGION_INFO       Any index below num_regions (else EINVAL); argsz in
                                   the reply is the size needed, and a shorter request
                                   gets the structure alone.  BAR1/BAR3 of a remap mode
                                   are MMAP|CAPS with a sparse area and the partition's
                                   fd only for a client with the "mapping" extension;
                                   for any other they trap (READ|WRITE).
  6   DEVICE_GET_REGION_IO_FDS     Answered with no sub-region (gpuvm offers no
                                   ioeventfd or ioregionfd); a bad index: EINVAL.
  7   DEVICE_GET_IRQ_INFO          INTx (1 vector) and MSI (1 vector), EVENTFD|NORESIZE;
                                   the other PCI indices with 0 vectors.
  8   DEVICE_SET_IRQS              DATA_EVENTFD|ACTION_TRIGGER with one fd a vector, and
                                   the same without fds or DATA_NONE with count 0 to
                                   take them away.  MASK, UNMASK, DATA_BOOL, a
                                   client-side trigger: ENOTSUP (not maskable).
  9   REGION_READ                  Any count 1..max_data_xfer_size inside a readable
 10   REGION_WRITE                 (writable) region; taken by the device as the
                                   aligned accesses of at most 4 bytes that cover it
                                   (1/2/4/8-byte ones go whole).  Past the region, a
                                   bad index, count 0: EINVAL.
 11   DMA_READ                     Server -> client.  Sent to gpuvm's server: EINVAL.
 12   DMA_WRITE                    gpuvm's client answers both from the memory it
                                   DMA-mapped (outside it: EFAULT; against the
                                   mapping's flags: EPERM), while it waits for a reply
                                   or in `serve_requests`.
 13   DEVICE_RESET                 The vGPU's channels and shadows dropped and rebuilt.
 15   REGION_WRITE_MULTI           Offered to every client (capability write_multiple:
                                   true).  Each write as the REGION_WRITE of its count,
                                   in order; the reply's wr_cnt is how many were done
                                   (a write the device refuses ends the batch).  wr_cnt
                                   not the writes that follow, none, a count outside
                                   1..8, a write outside a writable region: EINVAL,
                                   nothing done.  gpuvm's VMM sends each drain of KVM's
                                   coalesced ring as one (docs/vfio-user.md).
 16   DEVICE_FEATURE               ENOTSUP (no migration, no dirty page logging).
 17   MIG_DATA_READ                ENOTSUP.
 18   MIG_DATA_WRITE               ENOTSUP.
 --   any other                    ENOSYS.
====  ===========================  ===================================================

What the spec does not cover, and gpuvm adds: extensions offered in VERSION's JSON as
`"capabilities": {"gpuvm": ["mapping", "stats", "clock"]}` and used only when both sides
list them -- a client whose server's reply does not name one never sends its commands (nor
expects its answers: no grants, no device counters), a server answers them with ENOSYS
unless the client asked, and `gpuvm serve --no-extensions` offers none, so the spec
alone carries a whole run:

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
    the partition's memfd.  Kinds 3 (post) and 2 (trap), offset in the fd 0, say
    whether the guest's stores to that range may wait, in order, for its next exit
    (MappingListener.post: PRAMIN while no channel is bound, in a remap mode).  The
    server sends it while it handles the command that caused it, ahead of that
    command's reply, and the client applies it (a KVM memslot) before returning -- the
    order an in-process listener sees.  The
    client maps only what the events name, inside the region's sparse areas (the
    MemslotListener checks).
- Lab counters (extension "stats").  GPUVM_DEVICE_STATS (0x8003, client -> server,
  request {u32 what}: 1 counters, 2 faults, 4 device time; an empty request means all)
  replies with UTF-8 JSON holding the parts asked for: {"counters": {name: int},
  "faults": [the ChannelFault fields], "device_time_ns": int} -- what DeviceStats returns
  in-process, so a guest session's per-phase counts are the same over the socket.  A
  fence wait asks for the faults alone on each check, which keeps that cheap.
- The VM's vCPU on the server's virtual clock (extension "clock", an isolated run's).
  Every REGION_READ/WRITE is one exit of the vCPU, ticked and priced where it is
  served; GPUVM_CLOCK (0x8004, client -> server, {u32 op, u32 pad, u64 arg}, reply
  {u64 v, u64 generation, u64 lock_waits, u64 lock_wait_ns}) carries what only the VMM
  sees: START, EXIT (a port it answers itself), NOW, SETTLE, WAIT, BLOCK (arg: the
  signal generation it read), AWAKE, END (protocol.CLOCK_*; handled in vcpu_clock.py,
  tabled in docs/vfio-user.md).  An op out of order is refused (EINVAL), as is any op
  on a device that is on no virtual clock.
"""
