"""The `gpuvm` command line.

Each subcommand lives in the module that owns the work; this file only parses arguments
and turns expected errors into one clear line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import logging
import signal
import sys
import threading
from typing import NoReturn

from gpuvm.errors import UserError

# subcommand -> (module, help); each module has add_arguments(parser) and main(args) -> int
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("gpuvm.run.cli", "run benchmark(s) in one or more VMs and print a table"),
    "experiment": ("gpuvm.experiment.cli", "run an experiment described by a TOML file"),
    "bench": ("gpuvm.bench.cli", "micro-benchmarks: device, exits, shadow, vms"),
    "smi": ("gpuvm.smi", "the vGPUs of running `gpuvm run`s and experiments: type, VM, "
                         "VRAM, utilisation"),
    "build-guest": ("gpuvm.vmm.guest_programs", "build the guest binaries (idempotent)"),
    "mdev": ("gpuvm.mdevctl", "vGPU types and instances (mediated devices), as mdevctl"),
    "calibrate": ("gpuvm.calibrate.cli", "measure a real GPU (--gpu); page-table VRAM "
                                             "for pinned sysram (--pt-footprint)"),
    "model": ("gpuvm.sim.cli", "the model of the whole system: an experiment file's "
                                   "VMs replayed from cached traces, at any VM count"),
    "domain": ("gpuvm.libvirt.domain_cli", "VMs as libvirt domains with a vGPU hostdev"),
    "nodedev": ("gpuvm.libvirt.nodedev_cli", "the GPU and its vGPUs as libvirt node devices"),
    "serve": ("gpuvm.serve", "serve every defined vGPU over vfio-user (a daemon)"),
    "vm": ("gpuvm.vm_command", "a VM in its own process on a served vGPU (vm start)"),
}


EXIT_STATUS = ("exit status: 0 done; 1 a VM failed (run, experiment: after writing "
               "everything); 2 bad input (one `gpuvm: error:` line); 130 / 143 "
               "interrupted by SIGINT / SIGTERM")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, so what runs stops its guests and cleans
    up as on Ctrl-C (commands with their own handling, `experiment`, install theirs)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line (`gpuvm: error: ...`), not usage + error:
    the project's rule for every bad value.  Subparsers inherit the class."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("gpuvm").strip()
        self.exit(2, f"gpuvm: error: {where + ': ' if where else ''}{message}\n")


def _version() -> str:
    try:
        return importlib.metadata.version("gpuvm")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = OneLineParser(prog="gpuvm", description=__doc__.splitlines()[0],
                           epilog=EXIT_STATUS)
    parser.add_argument("-v", "--verbose", action="store_true", help="log guest consoles")
    parser.add_argument("--version", action="version", version=f"gpuvm {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Only the chosen command's module is imported, so `gpuvm bench` does not pay for (or
    # depend on) the experiment runner and vice versa.  This table is the project's one
    # lazy import of its own modules (tests/test_code_shape.py allows it here only).
    chosen = next((a for a in argv if a in COMMANDS), None)
    module = None
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text, epilog=EXIT_STATUS)
        # -v also after the subcommand; SUPPRESS keeps the top-level value when absent
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="log guest consoles")
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    previous = signal.signal(signal.SIGTERM, _terminate) \
        if threading.current_thread() is threading.main_thread() else None
    try:
        return int(module.main(args) or 0)
    except UserError as exc:
        print(f"gpuvm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        by = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        print(f"gpuvm: interrupted by {by.name}", file=sys.stderr)
        return 128 + by
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)

if __name__ == "__main__":
    sys.exit(main())
