"""`gpuvm nodedev list [--cap CAP] | dumpxml NAME | uri`: the host's GPU and vGPUs as
libvirt node devices, read back through libvirt-python.

`uri` rewrites gpuvm's test-driver file from the mdev store and prints its URI, for
`virsh -c URI nodedev-dumpxml ...`.  (virsh 9.0's own `nodedev-list` asks the test driver
for active devices only, a filter that driver refuses; `gpuvm nodedev list` lists through
the capability filters it does support.)
"""

from __future__ import annotations

import argparse

import libvirt

from gpuvm.errors import UserError
from gpuvm.libvirt.host import Host, libvirt_message

CAPS = {"system": libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_SYSTEM,
        "pci": libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_PCI_DEV,
        "mdev_types": libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV_TYPES,
        "mdev": libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connect", "-c", metavar="URI",
                        help="libvirt connection (default: gpuvm's test-driver host)")
    sub = parser.add_subparsers(dest="nodedev_command", required=True)
    listing = sub.add_parser("list", help="node device names, as virsh nodedev-list")
    listing.add_argument("--cap", choices=sorted(CAPS), help="only devices with this capability")
    sub.add_parser("dumpxml", help="a node device's XML").add_argument("name", metavar="NAME")
    sub.add_parser("uri", help="write gpuvm's test-driver file and print its URI")


def main(args: argparse.Namespace) -> int:
    host = Host(uri=args.connect)
    if args.nodedev_command == "uri":
        if not host.own:
            raise UserError("`uri` is gpuvm's own test-driver host: drop --connect")
        host.write_driver_file()
        print(host.uri)
        return 0
    conn = host.connect()
    try:
        if args.nodedev_command == "list":
            for dev in sorted(conn.listAllDevices(CAPS[args.cap] if args.cap else 0),
                              key=lambda d: d.name()):
                print(dev.name())
        else:
            print(conn.nodeDeviceLookupByName(args.name).XMLDesc(0), end="")
    except libvirt.libvirtError as exc:
        raise UserError(f"{host.uri}: {libvirt_message(exc)}") from None
    return 0
