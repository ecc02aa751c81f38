"""Domain files as the VMs of one experiment scenario: which vGPU type each gets, and
whether they all fit on the GPU together.

An experiment runs on a GPU of its own, so nothing is created in the mdev store: a domain
gets the type of the defined mdev its hostdev names, or, when that UUID is not defined on
this host, the type its `<gpuvm:vgpu>` names (domain files shipped with an experiment name
one, so the experiment runs from a fresh clone).  The types are then placed on an empty
partition table in order, as the mediator would place them.
"""

from __future__ import annotations

from pathlib import Path

from gpuvm.libvirt import domain_xml
from gpuvm.libvirt.domain_xml import DomainSpec
from gpuvm.mdevctl import MdevStore
from gpuvm.mediator import mdev_types
from gpuvm.mediator.mdev_types import MdevType, MdevTypeError
from gpuvm.mediator.partition import PartitionError


def vgpu_type(spec: DomainSpec, store: MdevStore) -> MdevType:
    types = store.parent.types()
    try:
        type_id = store.get(spec.mdev_uuid).type_id
    except MdevTypeError:
        if spec.workload.vgpu_type is None:
            raise domain_xml.hostdev_fail(
                spec, f"names mdev {spec.mdev_uuid}, which is not defined on "
                      f"{store.parent.address}, and the domain names no <gpuvm:vgpu "
                      f"type='...'/> to run one of") from None
        type_id = spec.workload.vgpu_type
    if spec.workload.vgpu_type and spec.workload.vgpu_type != type_id:
        raise domain_xml.vgpu_fail(spec, f"expects a {spec.workload.vgpu_type} vGPU but "
                                         f"mdev {spec.mdev_uuid} is a {type_id}")
    try:
        return mdev_types.lookup(types, type_id)
    except MdevTypeError as exc:
        raise domain_xml.vgpu_fail(spec, str(exc)) from None


def domain_vms(paths: list[Path], store: MdevStore) -> list[tuple[DomainSpec, MdevType]]:
    """Each domain file with its vGPU type; every one fits beside those before it."""
    table = store.parent.empty_table()
    out: list[tuple[DomainSpec, MdevType]] = []
    seen: dict[str, str] = {}
    for path in paths:
        spec = domain_xml.load(path)
        if spec.mdev_uuid in seen:
            raise domain_xml.hostdev_fail(spec, f"mdev {spec.mdev_uuid} is already given to "
                                                f"{seen[spec.mdev_uuid]}")
        seen[spec.mdev_uuid] = spec.source
        t = vgpu_type(spec, store)
        try:
            table.allocate(t.partition)
        except PartitionError:
            raise domain_xml.hostdev_fail(
                spec, f"type {t.type_id} has no instances left on {store.parent.address} "
                      f"beside the scenario's {len(out)} domain(s) before it") from None
        out.append((spec, t))
    return out
