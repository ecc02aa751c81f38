"""The `gpuvm` command line.

Each subcommand lives in the module that owns the work; this file only parses arguments
and turns expected errors into one clear line and a non-zero exit.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand -> (module, help); each module has add_arguments(parser) and main(args) -> int
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("gpuvm.runner", "run benchmark(s) in one or more VMs and print a table"),
    "experiment": ("gpuvm.experiment", "run an experiment described by a TOML file"),
    "bench": ("gpuvm.bench.command", "micro-benchmarks: device, exits, shadow"),
    "build-guest": ("gpuvm.vmm.guest_programs", "build the guest binaries (idempotent)"),
}


class UserError(Exception):
    """Bad input from the user or a guest; printed as one line, exit status 2."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuvm", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log guest consoles")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        modules[name] = importlib.import_module(module)
        modules[name].add_arguments(p)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(modules[args.command].main(args) or 0)
    except UserError as exc:
        print(f"gpuvm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpuvm: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
