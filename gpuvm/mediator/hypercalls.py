"""Paravirtual hypercalls: page tables allocated and filled by the hypervisor.

The guest writes the guest-physical address of a hypercall record (header + {va, pte}
entries) to the vGPU's BAR4 hypercall port; the record is read and answered through the
vGPU's DMA mappings, like any device access to guest memory.  Every entry is validated and translated as it is
written (GPUvm's prototype validated nothing here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gpuvm.device import regs
from gpuvm.device.vram import Vram
from gpuvm.mediator.host_port import HostPort
from gpuvm.vfio.device import VfioError
from gpuvm import pv_abi as abi
from shadow.pv_space import PvSpace
from shadow.vram_pool import PoolExhausted

if TYPE_CHECKING:
    from gpuvm.mediator.vgpu import VGpu

OP_NAMES = {abi.HC_SET_PGD: "set_pgd", abi.HC_MAP_BATCH: "map_batch",
            abi.HC_UNMAP_BATCH: "unmap_batch", abi.HC_VM_FLUSH: "vm_flush",
            abi.HC_FREE_PGD: "free_pgd"}
_ENTRY = np.dtype([("va", "<u8"), ("pte", "<u8")])


class Hypercalls:
    def __init__(self, vgpu: "VGpu", host: HostPort, vram: Vram) -> None:
        self.vgpu = vgpu
        self.host = host
        self.vram = vram

    def handle(self, gpa: int) -> None:
        v = self.vgpu
        try:
            hdr = v.guest_struct(gpa, abi.HcallHeader)
        except VfioError:
            v.count("trap.refused.hcall_record", 1)
            return  # a record the device cannot reach: nothing to answer in
        op, count, key = int(hdr.op), int(hdr.count), int(hdr.args[0])
        v.count("hcall.calls", 1)
        v.count(f"hcall.{OP_NAMES.get(op, 'bad')}", 1)
        status, refused = abi.HC_OK, 0
        with v.lock:
            if count > abi.HC_MAX_ENTRIES:
                status = abi.HC_EINVAL
            elif op == abi.HC_SET_PGD:
                status = self._set_pgd(key)
            elif op in (abi.HC_MAP_BATCH, abi.HC_UNMAP_BATCH):
                status, refused = self._map_batch(op, gpa, count, key)
            elif op in (abi.HC_VM_FLUSH, abi.HC_FREE_PGD):
                # these reach the physical GPU (its TLB, channels, BAR windows): the
                # mediator's lock as well
                status = v.under_lock(
                    0, self._flush if op == abi.HC_VM_FLUSH else self._free, key)
            else:
                status = abi.HC_EINVAL
        hdr.status = status
        hdr.args[3] = refused
        del hdr

    def _map_batch(self, op: int, gpa: int, count: int, key: int) -> tuple[int, int]:
        """HC_MAP_BATCH / HC_UNMAP_BATCH: the VM's own tables in its own shadow reserve,
        under its own lock alone (the guest flushes before the device may use them).
        Returns (status, entries refused)."""
        v = self.vgpu
        space = v.shadowing.pv_spaces.get(key)
        if space is None:
            return abi.HC_EINVAL, 0
        try:
            raw = v.guest_memory(gpa + abi.HCALL_HEADER_BYTES, count * _ENTRY.itemsize).copy()
        except VfioError:
            v.count("trap.refused.hcall_record", 1)
            return abi.HC_EINVAL, 0
        entries = raw.view(_ENTRY)
        v.count("hcall.entries", count)
        v.counts["hcall.batch_max"] = max(v.counts.get("hcall.batch_max", 0), count)
        try:
            if op == abi.HC_MAP_BATCH:
                refused = space.map(entries["va"], entries["pte"])
            else:
                refused = space.unmap(entries["va"])
        except PoolExhausted:
            # the VM's shadow reserve is full: its own problem, not the host's
            v.count("trap.refused.hcall_nomem", 1)
            return abi.HC_ENOMEM, 0
        return (abi.HC_OK if refused == 0 else abi.HC_EINVAL), refused

    def _set_pgd(self, key: int) -> int:
        v = self.vgpu
        if not v.policy.guest_vram_ok(key, regs.PD_BYTES) or key in v.shadowing.pv_spaces:
            return abi.HC_EINVAL
        try:
            v.shadowing.pv_spaces[key] = PvSpace(self.vram, v.policy, v.part.shadow_pool,
                                                 key, v.count)
        except PoolExhausted:
            v.count("trap.refused.hcall_nomem", 1)
            return abi.HC_ENOMEM
        return abi.HC_OK

    def _free(self, key: int) -> int:
        return abi.HC_OK if self.vgpu.shadowing.free_pv(key) else abi.HC_EINVAL

    def _flush(self, key: int) -> int:
        v = self.vgpu
        space = v.shadowing.pv_spaces.get(key)
        if space is None:
            return abi.HC_EINVAL
        self.host.flush(space.pd)
        for window, bar in ((v.shadowing.bar1, regs.BAR1), (v.shadowing.bar3, regs.BAR3)):
            if window.pv is space:
                v.shadowing.sync_window(window, bar)
        return abi.HC_OK
