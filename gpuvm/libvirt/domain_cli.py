"""`gpuvm domain define FILE.xml | start NAME | list | dumpxml NAME | destroy NAME |
undefine NAME`: VMs as libvirt domains, through libvirt-python.

The default connection is gpuvm's own test-driver host (see gpuvm.libvirt); `--connect URI`
uses another libvirt connection instead.  On a real hypervisor's connection (QEMU, ...)
every command says in one line what works there, and `start` is refused: the hypervisor
cannot open gpuvm's vGPUs.  `start` runs the guest to its end on gpuvm's
VMM with the domain's vGPU, so it returns when the domain has shut off again.
"""

from __future__ import annotations

import argparse
import sys

from rich import box
from rich.console import Console
from rich.table import Table

from gpuvm.errors import UserError
from gpuvm.libvirt import domain_xml
from gpuvm.libvirt.host import Host, RunSettings, real_driver, state_name, what_works_on
from gpuvm.vmm.backends import BACKENDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--connect", "-c", metavar="URI",
                        help="libvirt connection (default: gpuvm's test-driver host, "
                             "test:///$GPUVM_STATE_DIR/libvirt/host.xml)")
    sub = parser.add_subparsers(dest="domain_command", required=True)
    define = sub.add_parser("define", help="define a domain from its XML")
    define.add_argument("file", metavar="FILE.xml")
    start = sub.add_parser("start", help="run a domain's guest on its vGPU, to its end")
    start.add_argument("name", metavar="NAME")
    start.add_argument("--backend", default="auto", choices=BACKENDS)
    start.add_argument("--time-scale", type=float, default=1.0,
                       help="device clock speed relative to wall time")
    start.add_argument("--timeout", type=float, default=600.0, help="seconds for the guest")
    sub.add_parser("list", help="every domain, its state, vGPU and last result")
    for name, text in (("dumpxml", "a domain's XML, as libvirt has it"),
                       ("destroy", "stop a running domain"),
                       ("undefine", "remove a domain that is shut off")):
        sub.add_parser(name, help=text).add_argument("name", metavar="NAME")


def _summary(result: domain_xml.RunResult) -> str:
    rec = result.record
    sizes = " ".join(f"{k}={rec[k]}" for k in ("n", "bytes", "iterations") if k in rec)
    verdict = "PASS" if result.passed else f"FAIL ({result.error})"
    return f"{verdict} {sizes} ({result.mode}, {result.backend}, {result.wall_ms:.0f} ms)"


def _list(host: Host, conn) -> None:
    """Every domain on one line of at most 80 columns (wrapped, never cut): its vGPU by
    type and mode; the vGPU's UUID is in `gpuvm mdev list` and the domain's XML."""
    table = Table(title=f"domains on {host.uri}", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, caption="vGPU UUIDs: gpuvm mdev list, or gpuvm domain "
                  "dumpxml NAME", caption_justify="left")
    for col in ("Id", "Name", "State", "vGPU (mode)", "Workload", "Last result"):
        table.add_column(col, no_wrap=col == "Id", overflow="fold")
    doms = sorted(conn.listAllDomains(0), key=lambda d: d.name())
    for dom in doms:
        try:
            spec = host.spec_of(dom)
        except domain_xml.DomainXmlError:
            table.add_row(str(dom.ID()) if dom.isActive() else "-", dom.name(),
                          state_name(dom), "-", "-", "-")
            continue
        try:
            mdev = host.mdevs.get(spec.mdev_uuid)
            vgpu = f"{mdev.type_id} ({mdev.mode})"
        except ValueError:
            vgpu = "(not defined)"
        w = spec.workload
        workload = " ".join([w.benchmark, *map(str, w.params)]) + \
            (f" inject={w.inject}" if w.inject else "")
        table.add_row(str(dom.ID()) if dom.isActive() else "-", dom.name(), state_name(dom),
                      vgpu, workload, _summary(spec.result) if spec.result else "-")
    Console().print(table)  # the terminal's width; piped, $COLUMNS or 80


def main(args: argparse.Namespace) -> int:
    host = Host(uri=args.connect)
    cmd = args.domain_command
    spec = domain_xml.load(args.file) if cmd == "define" else None  # before connecting
    conn = host.connect()
    driver = real_driver(conn)
    if driver is not None:
        if cmd == "start":
            raise UserError(f"domain start: {what_works_on(host.uri, driver)}")
        print(f"gpuvm: note: {what_works_on(host.uri, driver)}", file=sys.stderr)
    if spec is not None:
        dom = host.define(conn, spec)
        print(f"Domain '{dom.name()}' defined from {args.file}")
        return 0
    if cmd == "list":
        _list(host, conn)
    elif cmd == "dumpxml":
        print(host.lookup(conn, args.name).XMLDesc(0), end="")
    elif cmd == "destroy":
        host.destroy(conn, args.name)
        print(f"Domain '{args.name}' destroyed")
    elif cmd == "undefine":
        host.undefine(conn, args.name)
        print(f"Domain '{args.name}' has been undefined")
    elif cmd == "start":
        settings = RunSettings(args.backend, args.time_scale, args.timeout)
        dom, result = host.start(
            conn, args.name, settings,
            on_running=lambda d, m: print(f"Domain '{d.name()}' started: {state_name(d)}\n"
                                          f"  vGPU {m.uuid} ({m.type_id}, {m.mode})",
                                          flush=True))
        print(f"Domain '{dom.name()}' {state_name(dom)}: "
              f"{host.spec_of(dom).workload.benchmark} {_summary(result)}")
        return 0 if result.passed else 1
    return 0
