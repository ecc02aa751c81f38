"""`gpuvm experiment FILE.toml`: replay an experiment from its config file.

Writes results/<name>/<timestamp>/ (runs.jsonl, results.csv, figures, report.md) and
points results/<name>/latest at it.  `--report DIR` rebuilds the report of a finished
run from its runs.jsonl without running anything.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="experiment file (TOML)")
    parser.add_argument("--report", type=Path, metavar="RUN_DIR",
                        help="only rebuild the report of a finished run directory")
    parser.add_argument("--backend", choices=("kvm", "inproc", "auto"),
                        help="override the file's backend")


def main(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from rich.console import Console

    from gpuvm.errors import UserError
    from gpuvm.experiment.config import ConfigError, load
    from gpuvm.experiment.execute import execute, load_rows, run_directory
    from gpuvm.experiment.report import write_report

    try:
        exp = load(args.config)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    if args.backend:
        exp = replace(exp, backend=args.backend)
    console = Console(stderr=True)
    if args.report:
        rows = load_rows(args.report / "runs.jsonl")
        out = args.report
    else:
        out = run_directory(exp)
        console.print(f"[bold]{exp.name}[/]: {len(exp.scenarios)} scenario(s) x "
                      f"{len(exp.modes)} mode(s) x {len(exp.policies)} polic(y/ies) x "
                      f"{exp.repetitions} rep(s) -> {out}")
        rows = execute(exp, out, progress=lambda line: console.print(line))
    report = write_report(exp, rows, out)
    print(report.read_text())
    console.print(f"report: {report}")
    failed = [r for r in rows if not r.passed]
    if failed:
        print(f"gpuvm: {len(failed)} VM run(s) failed; see {report}", file=sys.stderr)
        return 1
    return 0
