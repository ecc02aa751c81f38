"""`gpuvm experiment NAME|FILE.toml`: run an experiment from its config file.

NAME is an experiment that ships with gpuvm (`--list` shows them; gpuvm.experiment.catalog).
Writes results/<name>/<timestamp>/ under the current directory (or under `--out DIR`): (manifest.json, runs.jsonl, results.csv, figures,
report.md, and COMPLETE once every planned run is in) and then points
results/<name>/latest at it.  Ctrl-C or SIGTERM stops the running guests and leaves the
directory incomplete; `--resume [DIR]` finishes it without redoing the runs it holds.
`--report DIR` rebuilds the report of a run from its runs.jsonl without running anything.
The command exits non-zero when any VM run failed (after writing everything).
"""

from __future__ import annotations

import argparse
import signal
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn,
                           TimeRemainingColumn)
from rich.table import Table

from gpuvm.device import regs
from gpuvm.errors import UserError
from gpuvm.experiment.catalog import NoSuchExperiment, directory, resolve, shipped
from gpuvm.experiment.config import ConfigError, Experiment, load
from gpuvm.experiment.execute import VmRow, execute, row_from_dict
from gpuvm.experiment.interrupt import StopSignals
from gpuvm.experiment.paper import SuitePart, write_paper_report
from gpuvm.experiment.report import REPORT, report_rows, write_report
from gpuvm.experiment.rundir import (RunDir, RunDirError, RunKey, complete_runs, key_of,
                                     output_base, plan, repeated_run)
from gpuvm.experiment.summary import summary_table
from gpuvm.run.host_fit import available_bytes, shortfall
from gpuvm.vmm.backends import BACKENDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", nargs="?", metavar="NAME|FILE",
                        help="an experiment that ships with gpuvm (see --list) or a TOML file")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--list", action="store_true",
                      help="list the experiments that ship with gpuvm")
    what.add_argument("--report", type=Path, metavar="RUN_DIR",
                      help="only rebuild the report of a run directory (never over a report "
                           "built from more rows)")
    what.add_argument("--resume", nargs="?", const="", metavar="RUN_DIR",
                      help="finish an interrupted run without redoing the runs it holds "
                           "(default: the newest interrupted run of this configuration)")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="override the file's backend")
    parser.add_argument("--out", type=Path, metavar="DIR",
                        help="results go to DIR/<name>/<timestamp> (default: ./results)")


def resume_command(config: Path, run: RunDir) -> str:
    return f"gpuvm experiment {config} --resume {run.path}"


def _list() -> int:
    table = Table(box=None, pad_edge=False, title_justify="left",
                  title=f"experiments that ship with gpuvm ({directory()})")
    table.add_column("name", no_wrap=True)
    table.add_column("kind", no_wrap=True)
    table.add_column("what it runs (first sentence)", overflow="fold")
    for s in shipped():
        table.add_row(s.name, s.kind, s.description.split(". ")[0])
    Console(soft_wrap=False).print(table)
    print("run one: gpuvm experiment NAME (results under ./results)", file=sys.stderr)
    return 0


def _load(given: str | Path, args: argparse.Namespace) -> Experiment:
    """The experiment a name or path gives, with --backend and --out applied."""
    try:
        exp = load(resolve(given))
    except (ConfigError, NoSuchExperiment) as exc:
        raise UserError(str(exc)) from None
    if getattr(args, "backend", None):
        exp = replace(exp, backend=args.backend)
    if args.out is not None:
        exp = replace(exp, output=args.out.resolve() / exp.name)
    return exp


def main(args: argparse.Namespace) -> int:
    if getattr(args, "list", False):
        return _list()
    if args.config is None:
        raise UserError("experiment: give an experiment's name or file "
                        "(`gpuvm experiment --list` shows the names)")
    # `gpuvm run --config FILE` calls in here with only config, report and backend
    args.resume = getattr(args, "resume", None)
    args.out = getattr(args, "out", None)
    exp = _load(args.config, args)
    try:
        if exp.kind == "suite":
            return _run_suite(exp, args)
        if args.report is not None:
            return _rebuild_report(exp, args)
        return _run(exp, args)
    except RunDirError as exc:
        raise UserError(str(exc)) from None


def _warn(lines: list[str]) -> None:
    for line in lines:
        print(f"gpuvm: warning: {line}", file=sys.stderr)


def _once(run: RunDir, dicts: list[dict[str, Any]]) -> None:
    """Refuse rows that repeat a run (written by two writers at once, before the lock)."""
    repeated = repeated_run(dicts)
    if repeated:
        raise RunDirError(f"{run.rows_path}: {repeated}; not reported (two writers? keep "
                          f"one row per run)")


def _rows(run: RunDir, dicts: list[dict[str, Any]]) -> list[VmRow]:
    _once(run, dicts)
    try:
        return [row_from_dict(d) for d in dicts]
    except TypeError as exc:
        raise RunDirError(f"{run.rows_path}: a row of another format: {exc}") from None


def _summary(exp: Experiment, rows: list[VmRow], report: Path) -> None:
    """The compact table on stdout (the terminal's width, piped 80), then the report's
    path: what an experiment ends with."""
    console = Console()
    console.print(summary_table(exp.name, exp.cost_profile, rows))
    console.print(f"full report: {_near(report)}", soft_wrap=True)


def _near(path: Path) -> Path:
    """`path` relative to the current directory where it is under it (results/...): the
    short form a user can open from where they are."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def _failed(rows: list[VmRow], report: Path) -> int:
    failed = [r for r in rows if not r.passed]
    if failed:
        print(f"gpuvm: {len(failed)} of {len(rows)} VM run(s) failed; see {report}",
              file=sys.stderr)
        return 1
    return 0


def _rebuild_report(exp: Experiment, args: argparse.Namespace) -> int:
    run = RunDir.open(args.report).hold()
    try:
        return _report_from_rows(exp, args, run)
    finally:
        run.release()


def _report_from_rows(exp: Experiment, args: argparse.Namespace, run: RunDir) -> int:
    run.check(exp)
    loaded = run.read_rows()
    _warn(loaded.warnings)
    rows = _rows(run, loaded.rows)
    before = report_rows(run.path)
    if before is not None and before > len(rows):
        raise RunDirError(f"{run.path / REPORT}: was built from {before} rows but runs.jsonl "
                          f"has {len(rows)}; not overwritten")
    exp = replace(exp, backend=run.manifest.get("backend", exp.backend))
    report = write_report(exp, rows, run.path, complete=run.complete,
                          resume=resume_command(args.config, run))
    _summary(exp, rows, report)
    status = _failed(rows, report)
    if not run.complete:
        print(f"gpuvm: {run.path} is incomplete; finish it with: "
              f"{resume_command(args.config, run)}", file=sys.stderr)
        return 1
    return status


def _open_for_resume(exp: Experiment, args: argparse.Namespace
                     ) -> tuple[Experiment, RunDir, set[RunKey], list[dict[str, Any]]]:
    """The interrupted run, its finished runs' rows (rewriting runs.jsonl without a torn
    line or the rows of a run cut short), and the experiment with the run's backend."""
    run = RunDir.open(Path(args.resume)) if args.resume else RunDir.newest_incomplete(exp)
    run.hold()  # the one writer from here (a second resume of it is refused)
    try:
        return _resumable(exp, args, run)
    except BaseException:
        run.release()
        raise


def _resumable(exp: Experiment, args: argparse.Namespace, run: RunDir
               ) -> tuple[Experiment, RunDir, set[RunKey], list[dict[str, Any]]]:
    run.check(exp)
    if run.complete:
        raise RunDirError(f"{run.path}: already complete; nothing to resume "
                          f"(`--report {run.path}` rebuilds its report)")
    backend = run.manifest.get("backend", exp.backend)
    if args.backend and args.backend != backend:
        raise RunDirError(f"{run.path}: was run with backend {backend!r}; resume it with "
                          f"the same")
    exp = replace(exp, backend=backend)
    loaded = run.read_rows()
    _once(run, loaded.rows)
    done = complete_runs(loaded.rows, exp)
    kept = [(row, line) for row, line in zip(loaded.rows, loaded.lines) if key_of(row) in done]
    warnings = list(loaded.warnings)
    if len(kept) < len(loaded.rows):
        warnings.append(f"{run.rows_path}: dropped {len(loaded.rows) - len(kept)} row(s) of "
                        f"a run that did not finish; it is run again")
    if warnings:
        run.rewrite_rows([line for _, line in kept])
        _warn(warnings)
    return exp, run, done, [row for row, _ in kept]


@contextmanager
def _progress_bar(console: Any, runs: int) -> Iterator[Callable[[str], None]]:
    """Each finished run's line, and on a terminal a bar of runs done with an ETA under
    them (nothing more when the output is not a terminal)."""
    if not (console.is_terminal and sys.stdout.isatty()):
        yield lambda line: console.print(line)
        return
    with Progress("runs", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=True) as bar:
        task = bar.add_task("runs", total=runs)

        def line(text: str) -> None:
            bar.console.print(text)
            bar.advance(task)
        yield line


def _fits_the_host(exp: Experiment) -> None:
    """Each scenario's VMs run at once: refuse, before anything runs, one whose guest
    RAM the host cannot give (gpuvm.run.host_fit)."""
    available = available_bytes()
    for s in exp.scenarios:
        short = shortfall([vm.ram_mib * regs.MiB for vm in s.vms
                           if vm.ram_alloc == "immediate"], available,
                          on_demand='ram_alloc = "ondemand"')
        if short:
            raise UserError(f"{exp.source}: scenario {s.name}: {short}")


def _run(exp: Experiment, args: argparse.Namespace) -> int:
    _fits_the_host(exp)
    console = Console(stderr=True, soft_wrap=True)  # a path is never broken over lines
    with StopSignals() as stop:
        if args.resume is None:
            run, done, kept = RunDir.create(exp), set(), []
            console.print(f"[bold]{exp.name}[/]: {len(exp.scenarios)} scenario(s) x "
                          f"{len(exp.modes)} mode(s) x {len(exp.policies)} polic(y/ies) x "
                          f"{exp.repetitions} rep(s) -> {run.path}")
        else:
            exp, run, done, kept = _open_for_resume(exp, args)
            console.print(f"[bold]{exp.name}[/]: resuming {run.path}: "
                          f"{sum(key in done for key in plan(exp))} of {len(plan(exp))} "
                          f"planned runs already recorded")
        try:
            to_make = sum(key not in done for key in plan(exp))
            with _progress_bar(console, to_make) as report_line:
                new = execute(exp, run, progress=report_line, skip=done,
                              deferred=stop.deferred)
            rows = _rows(run, kept) + new
            with stop.deferred():  # the report, then COMPLETE, then `latest`: in this order
                report = write_report(exp, rows, run.path)
                run.mark_complete(len(rows))
                run.point_latest()
        except KeyboardInterrupt:
            complete = complete_runs(run.read_rows().rows, exp)
            recorded = sum(key in complete for key in plan(exp))
            name = signal.Signals(stop.received or signal.SIGINT).name
            print(f"gpuvm: interrupted by {name}: {run.path} holds {recorded} of "
                  f"{len(plan(exp))} planned runs; finish it with: "
                  f"{resume_command(args.config, run)}", file=sys.stderr)
            return stop.exit_status
        finally:
            run.release()
    _summary(exp, rows, report)
    return _failed(rows, report)


def _run_suite(exp: Experiment, args: argparse.Namespace) -> int:
    """Each included experiment in turn, into its own run directory (as if run alone),
    then one report over them all in the suite's own directory.  `--report DIR` rebuilds
    that report from the included experiments' latest complete runs."""
    if args.resume is not None:
        raise UserError(f"{args.config}: a suite is not resumed as a whole; resume the "
                        "included experiment that was interrupted, then run "
                        f"`gpuvm experiment {args.config} --report DIR`")
    parts: list[SuitePart] = []
    status = 0
    for path in exp.includes:
        sub = _load(path, args)
        if args.report is None:
            sub_args = argparse.Namespace(config=path, report=None, resume=None,
                                          backend=args.backend, out=args.out)
            sub_status = _run(sub, sub_args)
            if sub_status in (130, 143):  # interrupted: the suite stops there
                return sub_status
            status = max(status, sub_status)
        latest = output_base(sub) / "latest"
        if not latest.exists():
            raise UserError(f"{latest}: no complete run of {path} to report")
        run = RunDir.open(latest)
        run.check(sub)
        parts.append(SuitePart(sub, run.path, _rows(run, run.read_rows().rows)))
    if args.report is not None:
        run = RunDir.open(args.report).hold()
    else:
        run = RunDir.create(exp)
    try:
        run.check(exp)
        report = write_paper_report(exp, parts, run.path)
        if args.report is None:
            run.mark_complete(0)
            run.point_latest()
    finally:
        run.release()
    print(f"full report: {_near(report)}")
    return status
