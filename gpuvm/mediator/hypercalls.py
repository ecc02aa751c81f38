"""Paravirtual hypercalls: page tables allocated and filled by the hypervisor.

The guest writes the guest-physical address of a hypercall record (header + {va, pte}
entries) to the vGPU's BAR4 hypercall port; the record is read and answered through the
vGPU's DMA mappings, like any device access to guest memory.  Every entry is validated and translated as it is
written (GPUvm's prototype validated nothing here).
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from gpuvm.device import regs
from gpuvm.device.dma import DmaMappings
from gpuvm.device.vram import Vram
from gpuvm.mediator.channels import Channels
from gpuvm.mediator.host_port import HostPort
from gpuvm.mediator.meter import VmMeter
from gpuvm.mediator.partition import Partition
from gpuvm.mediator.planted import planted
from gpuvm.mediator.shadowing import Shadowing
from gpuvm import pv_abi as abi
from shadow.entries import EntryPolicy
from shadow.pv_space import PvSpace
from shadow.vram_pool import PoolExhausted

OP_NAMES = {abi.HC_SET_PGD: "set_pgd", abi.HC_MAP_BATCH: "map_batch",
            abi.HC_UNMAP_BATCH: "unmap_batch", abi.HC_VM_FLUSH: "vm_flush",
            abi.HC_FREE_PGD: "free_pgd"}
_ENTRY = np.dtype([("va", "<u8"), ("pte", "<u8")])


class Hypercalls:
    """The vGPU's BAR4 hypercall port: each PV page-table call read from the VM's RAM,
    validated, applied to its PV spaces and answered in place.

    Built with exactly what it uses -- the VM's RAM as DMA-mapped (the record), its
    lock (a call that fills only its own tables takes that and not the mediator's), its
    meter (counts, and the mediator's lock in virtual time for a call that reaches the
    physical GPU), its shadowing and channels, the partition, its entry policy, the VRAM
    view and the physical GPU's port -- never the vGPU or the mediator."""

    def __init__(self, guest_ram: DmaMappings, vm_lock: threading.RLock, meter: VmMeter,
                 shadowing: Shadowing, channels: Channels, part: Partition,
                 policy: EntryPolicy, vram: Vram, host: HostPort) -> None:
        self.guest_ram = guest_ram
        self.vm_lock = vm_lock
        self.meter = meter
        self.shadowing = shadowing
        self.channels = channels
        self.part = part
        self.policy = policy
        self.host = host
        self.vram = vram

    def _guest_memory(self, iova: int, size: int) -> np.ndarray | None:
        """DMA-mapped guest memory (the hypercall record), or None: a record the device
        cannot reach (counted)."""
        view = self.guest_ram.region(iova, size)
        if view is None:
            self.meter.count("trap.refused.hcall_record", 1)
        return view

    def handle(self, gpa: int) -> None:
        meter = self.meter
        record = self._guest_memory(gpa, ctypes.sizeof(abi.HcallHeader))
        if record is None:
            return  # nothing to answer in
        hdr = abi.HcallHeader.from_buffer(record)
        op, count, key = int(hdr.op), int(hdr.count), int(hdr.args[0])
        meter.count("hcall.calls", 1)
        meter.count(f"hcall.{OP_NAMES.get(op, 'bad')}", 1)
        status, refused = abi.HC_OK, 0
        with self.vm_lock:
            if count > abi.HC_MAX_ENTRIES:
                status = abi.HC_EINVAL
            elif op == abi.HC_SET_PGD:
                status = self._set_pgd(key)
            elif op in (abi.HC_MAP_BATCH, abi.HC_UNMAP_BATCH):
                status, refused = self._map_batch(op, gpa, count, key)
            elif op in (abi.HC_VM_FLUSH, abi.HC_FREE_PGD):
                # these reach the physical GPU (its TLB, channels, BAR windows): the
                # mediator's lock as well
                with meter.hold:
                    status = (self._flush if op == abi.HC_VM_FLUSH else self._free)(key)
            else:
                status = abi.HC_EINVAL
        hdr.status = status
        hdr.args[3] = refused
        del hdr

    def _map_batch(self, op: int, gpa: int, count: int, key: int) -> tuple[int, int]:
        """HC_MAP_BATCH / HC_UNMAP_BATCH: the VM's own tables in its own shadow reserve,
        under its own lock alone (the guest flushes before the device may use them).
        Returns (status, entries refused)."""
        meter = self.meter
        space = self.shadowing.pv_spaces.get(key)
        if space is None:
            return abi.HC_EINVAL, 0
        raw = self._guest_memory(gpa + abi.HCALL_HEADER_BYTES, count * _ENTRY.itemsize)
        if raw is None:
            return abi.HC_EINVAL, 0
        entries = raw.copy().view(_ENTRY)
        meter.count("hcall.entries", count)
        meter.counts["hcall.batch_max"] = max(meter.counts.get("hcall.batch_max", 0), count)
        try:
            if op == abi.HC_MAP_BATCH:
                refused = space.map(entries["va"], entries["pte"])
            else:
                refused = space.unmap(entries["va"])
        except PoolExhausted:
            # the VM's shadow reserve is full: its own problem, not the host's
            meter.count("trap.refused.hcall_nomem", 1)
            return abi.HC_ENOMEM, 0
        return (abi.HC_OK if refused == 0 else abi.HC_EINVAL), refused

    def _set_pgd(self, key: int) -> int:
        spaces = self.shadowing.pv_spaces
        if not self.policy.guest_vram_ok(key, regs.PD_BYTES) or key in spaces:
            return abi.HC_EINVAL
        try:
            spaces[key] = PvSpace(self.vram, self.policy, self.part.shadow_pool, key,
                                  self.meter.count)
        except PoolExhausted:
            self.meter.count("trap.refused.hcall_nomem", 1)
            return abi.HC_ENOMEM
        return abi.HC_OK

    def _free(self, key: int) -> int:
        """HC_FREE_PGD: channels still using the space are moved off it first (their
        shadow RAMIN rebuilt, the device kicked), then the shadowing rebinds the BAR
        windows on it, makes the TLB forget it and frees its tables."""
        space = self.shadowing.pv_spaces.pop(key, None)
        if space is None:
            return abi.HC_EINVAL
        for ch in self.channels.by_vchid.values() if not planted("free-bound-pgd") else ():
            if ch.bound and ch.guest_pd == key:
                self.channels.rebuild(ch)
                self.meter.count("pv.frees_while_bound", 1)
        self.shadowing.free_pv(space)
        return abi.HC_OK

    def _flush(self, key: int) -> int:
        shadowing = self.shadowing
        space = shadowing.pv_spaces.get(key)
        if space is None:
            return abi.HC_EINVAL
        self.host.flush(space.pd)
        for window, bar in ((shadowing.bar1, regs.BAR1), (shadowing.bar3, regs.BAR3)):
            if window.pv is space:
                shadowing.sync_window(window, bar)
        return abi.HC_OK
