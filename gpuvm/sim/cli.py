"""`gpuvm model FILE.toml`: the model of the whole system on an experiment file's
scenarios -- each VM replays the cached trace of its benchmark x mode (recorded on the
emulator once), priced by a cost profile, competing for the mediator and the engine
under the scheduler policy.  `--vms N` makes every scenario N VMs of its
kind (its VMs repeated in turn), so "1,024 VMs of this kind" needs no 1,024-VM run."""

from __future__ import annotations

import argparse
import csv
import logging
from contextlib import contextmanager
from typing import Callable, Iterator

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuvm.cli_values import parse_counts
from gpuvm.errors import UserError
from gpuvm.run.host_fit import available_bytes
from gpuvm.experiment.catalog import NoSuchExperiment, resolve
from gpuvm.experiment.config import ConfigError, load
from gpuvm.experiment.costs import load_costs
from gpuvm.sim.sweep import distinct_points, points_for, run_sweep, traces_for, traces_needed
from gpuvm.vmm.backends import BACKENDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="NAME|FILE",
                        help="an experiment that ships with gpuvm (`gpuvm experiment "
                             "--list`) or a TOML file")
    parser.add_argument("--profile", default=None,
                        help="cost profile(s), comma-separated (default: the file's)")
    parser.add_argument("--vms", default=None, metavar="N[,N...]",
                        help="run every scenario with N VMs of its kind (several: a sweep)")
    parser.add_argument("--dask", nargs="?", const="local", default=None, metavar="ADDRESS",
                        help="run the points on Dask: a local cluster, or the scheduler at "
                             "ADDRESS (its logging only with -v)")
    parser.add_argument("--csv", default=None, help="also write the rows to this CSV file")
    parser.add_argument("--refresh", action="store_true", help="re-record the traces")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="backend that records missing traces")


def _quiet_dask(verbose: bool) -> None:
    """Dask logs every worker's start and stop at INFO (its own logging config, set as
    `distributed` is imported): kept for -v, else only its warnings."""
    # heavy, and only for --dask; importing it sets the levels this then overrides
    import distributed  # noqa: F401

    level = logging.INFO if verbose else logging.WARNING
    for name in ("distributed", "distributed.scheduler", "distributed.nanny",
                 "distributed.worker", "distributed.core", "distributed.http.proxy"):
        logging.getLogger(name).setLevel(level)


@contextmanager
def _progress(console: Console, traces: int, points: int
              ) -> Iterator[tuple[Callable[[str], None], Callable[[], None]]]:
    """What steps a trace (by its file) and a point: a bar of each on a terminal; on a
    pipe nothing (the run's start and end lines say enough there)."""
    if not console.is_terminal:
        yield (lambda name: None), (lambda: None)
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=console, transient=True) as bar:
        t = bar.add_task("traces", total=traces)
        p = bar.add_task("points", total=points)

        def trace(name: str) -> None:
            bar.update(t, description=f"trace {name}")
            bar.advance(t)
        yield trace, (lambda: bar.advance(p))


# what the replay holds per VM (simpy process, stream cursor, scheduler record): 4.3 KB
# measured at 4,096 and 16,384 fv VMs (ru_maxrss), taken with room to spare
MODEL_BYTES_PER_VM = 16 * 1024


def _check_room(vms: int) -> None:
    """Refuse, before anything is recorded or replayed, a VM count whose replay the host
    cannot hold in memory."""
    need = vms * MODEL_BYTES_PER_VM
    have = available_bytes()
    if have is not None and need > have:
        raise UserError(f"--vms {vms:,}: the model holds about {MODEL_BYTES_PER_VM >> 10} KiB "
                        f"a VM, {need / (1 << 30):,.1f} GiB for {vms:,} VMs, more than the "
                        f"{have / (1 << 30):,.1f} GiB this host has available")


def _ms(ns: int) -> str:
    """ns as ms: two decimals while short, whole ms past 10 s (a column stays narrow)."""
    return f"{ns / 1e6:,.2f}" if ns < 10_000_000_000 else f"{ns / 1e6:,.0f}"


def _table(exp_name: str, rows: list[dict]) -> Table:
    """The rows, at most 80 columns wide: a profile that every row shares is said once
    in the title instead of a column of its own."""
    profiles = sorted({r["profile"] for r in rows})
    one = len(profiles) == 1
    table = Table(title=f"{exp_name}: the model" + (f" (profile {profiles[0]})" if one else ""),
                  box=box.SIMPLE_HEAD)
    columns = ["scenario", "mode", "policy"] + ([] if one else ["profile"]) \
        + ["VMs", "VM alone\nms", "makespan\nms", "x alone"]
    for col in columns:
        table.add_column(col, justify="left" if col in ("scenario", "mode", "policy",
                                                        "profile") else "right")
    for r in rows:
        table.add_row(r["scenario"], r["mode"], r["policy"], *([] if one else [r["profile"]]),
                      f"{r['vms']:,}", _ms(r["alone_ns"]), _ms(r["makespan_ns"]),
                      f"{r['makespan_ns'] / r['alone_ns']:.2f}" if r["alone_ns"] else "-")
    return table


def main(args: argparse.Namespace) -> int:
    try:
        exp = load(resolve(args.config))
        profiles = (args.profile or exp.cost_profile).split(",")
        for name in profiles:
            load_costs(name)
    except (ConfigError, NoSuchExperiment, ValueError) as exc:
        raise UserError(str(exc)) from None
    if not exp.scenarios:
        raise UserError(f"{args.config}: has no scenarios of its own (a suite? give one of "
                        "its files)")
    counts = parse_counts(args.vms) if args.vms else [0]
    _check_room(max(counts))
    points, same_as = distinct_points(exp, points_for(exp, counts, profiles))
    err = Console(stderr=True)
    for first in dict.fromkeys(same_as.values()):
        repeats = [s for s, f in same_as.items() if f == first]
        err.print(f"model: {', '.join(repeats)} {'is' if len(repeats) == 1 else 'are'} "
                  f"{first}'s VMs at --vms N: shown once, as {first}")
    if args.dask:
        _quiet_dask(args.verbose)
    keys = {k for p in points for k in traces_for(exp, p)}
    err.print(f"model: {len(points)} point(s) of {exp.name}, {len(keys)} trace(s)"
              + (f" on Dask ({args.dask})" if args.dask else ""))
    with _progress(err, len(keys), len(points)) as (trace, point):
        traces = traces_needed(exp, points, args.backend, args.refresh, progress=trace)
        rows = run_sweep(exp, points, traces, args.dask, done=point,
                         progress=lambda line: err.print(f"model: {line}"))
    Console().print(_table(exp.name, rows))
    if args.csv:
        try:
            with open(args.csv, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        except OSError as exc:
            raise UserError(f"--csv {args.csv}: {exc.strerror or exc}") from None
        err.print(f"model: rows written to {args.csv}")
    return 0
