"""`gpuvm bench {device,exits,shadow,vms,isolation,sim,vfio-user,vfio-user-fuzz,fuzz,
ram-alloc}`: each prints what it measures side by side in one run (ratios, or counts for
fuzz).

Each bench module defines its own options (`add_arguments`) and entry point.
"""

from __future__ import annotations

import argparse
from types import ModuleType
from typing import Callable

from gpuvm.bench import (device, exits, fuzz, isolation, ram_alloc, shadow, sim, vfio_user,
                         vfio_user_fuzz, vms)

# bench name -> (module with add_arguments, entry point taking the parsed args, help)
BENCHES: dict[str, tuple[ModuleType, Callable[[argparse.Namespace], int], str]] = {
    "device": (device, device.main_device, "the emulated device's own speed"),
    "exits": (exits, exits.main_exits, "a trapped access on KVM: raw, dispatched, mediated, "
                                       "remapped"),
    "shadow": (shadow, shadow.main_shadow, "shadow page-table resync: full vs incremental"),
    "vms": (vms, vms.main_vms, "several VMs at once, a GPU each, vs one alone"),
    "isolation": (isolation, isolation.main_isolation, "VMs as threads vs as VMM processes "
                                                       "over vfio-user"),
    "sim": (sim, sim.main_sim, "the simpy model's events/s at 16 and 1,024 VMs"),
    "vfio-user": (vfio_user, vfio_user.main_vfio_user, "a trapped access over a vfio-user "
                  "socket vs in-process, no KVM (--baseline: two checkouts)"),
    "vfio-user-fuzz": (vfio_user_fuzz, vfio_user_fuzz.main_vfio_user_fuzz, "a hostile "
                       "vfio-user client against gpuvm serve, beside a VM on another vGPU"),
    "fuzz": (fuzz, fuzz.main_fuzz, "hostile guest operations against two vGPUs, the "
                                   "reference monitor on"),
    "ram-alloc": (ram_alloc, ram_alloc.main_ram_alloc, "guest RAM allocated as the VM is "
                  "built vs as the guest first touches it"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="which", required=True, metavar="BENCH")  # 80 columns
    for name, (module, _, help_text) in BENCHES.items():
        module.add_arguments(sub.add_parser(name, help=help_text))


def main(args: argparse.Namespace) -> int:
    _, entry, _ = BENCHES[args.which]
    return int(entry(args) or 0)
