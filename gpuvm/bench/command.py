"""`gpuvm bench {device,exits,shadow}`: each prints ratios measured side by side in one run."""

from __future__ import annotations

import argparse
import importlib

# bench name -> (module, function taking the parsed args)
BENCHES = {
    "device": ("gpuvm.bench.device", "main_device"),
    "exits": ("gpuvm.bench.exits", "main_exits"),
    "shadow": ("gpuvm.bench.shadow", "main_shadow"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("which", choices=sorted(BENCHES), help="what to measure")
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (best is kept)")
    parser.add_argument("--iterations", type=int, default=20000,
                        help="accesses per loop (exits bench)")


def main(args: argparse.Namespace) -> int:
    module, func = BENCHES[args.which]
    return int(getattr(importlib.import_module(module), func)(args) or 0)
