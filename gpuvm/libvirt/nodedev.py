"""The host's GPU and its vGPUs as libvirt node devices, and the test driver's file.

A real host shows each mediated-device parent as a PCI node device with an `mdev_types`
capability (each type's id, name, device API and available instances, as sysfs
`mdev_supported_types/` has them) and every vGPU as an `mdev` device whose parent is that
GPU.  gpuvm builds the same XML from its mdev store, so `virsh nodedev-dumpxml` on the
test driver's file shows what `gpuvm mdev types` and `gpuvm mdev list` print.  The file
itself (`<node>` with `<device>`s and `<domain>`s) is the format libvirt's test driver
reads at connect time; see gpuvm.libvirt for why domains are kept in it.
"""

from __future__ import annotations

import uuid as uuidlib
import xml.etree.ElementTree as ET
from pathlib import Path

from gpuvm.device import regs
from gpuvm.mdevctl import MdevDefinition, MdevStore, ParentGpu

COMPUTER = "computer"  # the root of libvirt's node-device tree
# PCI class code of the GPU's function (base 0x03 display controller, sub 0x00 VGA): the
# host's view of the card in config space, which the emulated device does not model
PCI_CLASS_VGA = 0x030000
VENDOR_NAMES = {regs.PCI_VENDOR_NVIDIA: "NVIDIA Corporation"}
PARENT_IOMMU_GROUP = 1  # of the first parent GPU; the i-th has 1 + i
# a vfio-mdev instance gets an IOMMU group of its own; numbered after the host's groups
MDEV_IOMMU_GROUP_BASE = 100
# the test driver's own XML namespace: <test:runstate> gives a domain its state at connect
TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"

ET.register_namespace("test", TEST_NS)


def pci_parts(address: str) -> tuple[int, int, int, int]:
    """'0000:01:00.0' -> (domain, bus, slot, function)."""
    dom, bus, rest = address.split(":")
    slot, func = rest.split(".")
    return int(dom, 16), int(bus, 16), int(slot, 16), int(func, 16)


def pci_name(address: str) -> str:
    """libvirt's node-device name of a PCI function: pci_0000_01_00_0."""
    return "pci_" + address.replace(":", "_").replace(".", "_")


def mdev_name(d: MdevDefinition) -> str:
    """libvirt's node-device name of an mdev: its UUID and its parent's address."""
    return f"mdev_{d.uuid.replace('-', '_')}_{d.parent.replace(':', '_').replace('.', '_')}"


def mdev_iommu_group(d: MdevDefinition) -> int:
    return MDEV_IOMMU_GROUP_BASE + d.order


def _text(parent: ET.Element, tag: str, text: str, **attrs: str) -> ET.Element:
    el = ET.SubElement(parent, tag, attrs)
    el.text = text
    return el


def host_uuid(store: MdevStore) -> str:
    """The host's system UUID: stable for one state directory (libvirt requires one)."""
    return str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuvm-host:{store.root.resolve()}"))


def computer_device(store: MdevStore) -> ET.Element:
    """The root of the device tree, which the GPU names as its parent."""
    dev = ET.Element("device")
    _text(dev, "name", COMPUTER)
    cap = ET.SubElement(dev, "capability", type="system")
    _text(cap, "product", "gpuvm host")
    hw = ET.SubElement(cap, "hardware")
    _text(hw, "vendor", "gpuvm")
    _text(hw, "uuid", host_uuid(store))
    fw = ET.SubElement(cap, "firmware")
    _text(fw, "vendor", "gpuvm")
    return dev


def gpu_device(store: MdevStore, parent: ParentGpu | None = None) -> ET.Element:
    """A parent GPU (default the first): a PCI device with every type it offers and what
    is left of each."""
    parent = parent or store.parent
    dom, bus, slot, func = pci_parts(parent.address)
    dev = ET.Element("device")
    _text(dev, "name", pci_name(parent.address))
    _text(dev, "path", f"/sys/devices/pci{dom:04x}:00/{parent.address}")
    _text(dev, "parent", COMPUTER)
    cap = ET.SubElement(dev, "capability", type="pci")
    _text(cap, "class", f"{PCI_CLASS_VGA:#08x}")
    for tag, value in (("domain", dom), ("bus", bus), ("slot", slot), ("function", func)):
        _text(cap, tag, str(value))
    _text(cap, "product", parent.profile.name, id=f"{parent.profile.pci_device:#06x}")
    vendor = regs.PCI_VENDOR_NVIDIA
    _text(cap, "vendor", VENDOR_NAMES[vendor], id=f"{vendor:#06x}")
    types = ET.SubElement(cap, "capability", type="mdev_types")
    available = store.available(parent.address)
    for t in parent.types().values():
        te = ET.SubElement(types, "type", id=t.type_id)
        _text(te, "name", t.name)
        _text(te, "deviceAPI", t.device_api)
        _text(te, "availableInstances", str(available[t.type_id]))
    group = ET.SubElement(cap, "iommuGroup", number=str(PARENT_IOMMU_GROUP + parent.index))
    ET.SubElement(group, "address", domain=f"{dom:#06x}", bus=f"{bus:#04x}",
                  slot=f"{slot:#04x}", function=f"{func:#x}")
    return dev


def mdev_device(d: MdevDefinition) -> ET.Element:
    """One vGPU: its UUID and type, a child of the GPU it was created on."""
    dev = ET.Element("device")
    _text(dev, "name", mdev_name(d))
    _text(dev, "parent", pci_name(d.parent))
    cap = ET.SubElement(dev, "capability", type="mdev")
    ET.SubElement(cap, "type", id=d.type_id)
    _text(cap, "uuid", d.uuid)
    ET.SubElement(cap, "iommuGroup", number=str(mdev_iommu_group(d)))
    return dev


def node_devices(store: MdevStore) -> list[ET.Element]:
    """The host, each parent GPU, then every mdev (a child of its parent)."""
    return [computer_device(store)] + [gpu_device(store, p) for p in store.parents] \
        + [mdev_device(d) for d in store.list()]


def to_text(el: ET.Element) -> str:
    ET.indent(el)
    return ET.tostring(el, encoding="unicode") + "\n"


def driver_file(store: MdevStore, domains: list[tuple[str, int]]) -> str:
    """The test driver's whole host: node devices, then each domain (its XML as libvirt
    wrote it, and the libvirt state number it has when a connection opens)."""
    node = ET.Element("node")
    node.extend(node_devices(store))
    for xml, state in domains:
        dom = ET.fromstring(xml)
        ET.SubElement(dom, f"{{{TEST_NS}}}runstate").text = str(state)
        node.append(dom)
    return to_text(node)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)
