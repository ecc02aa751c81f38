"""`gpuvm smi`: the vGPUs of the `gpuvm run`s and `gpuvm experiment` runs going on now,
as nvidia-smi vgpu shows a host's.

A running system is another process, so the run loop publishes what it sees: every run
rewrites <state dir>/runs/<pid>-<n>.json atomically (gpuvm/run/observe.py StatusWriter)
and removes it at the end.  This command reads those files, and deletes one whose process
is gone (a run that was killed could not remove its own).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuvm.errors import UserError
from gpuvm.state import status_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-l", "--loop", type=_positive, metavar="SECONDS",
                        help="refresh every SECONDS until interrupted")
    parser.add_argument("--json", action="store_true",
                        help="print the runs' status as JSON (a list, one object per run)")


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 seconds")
    return value


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_status(state: Path | None = None) -> list[dict[str, Any]]:
    """Every live run's status, oldest first; stale files are removed."""
    runs = []
    directory = status_dir(state)
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            status = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue  # removed or replaced between the listing and the read
        if not _alive(int(status.get("pid", -1))):
            path.unlink(missing_ok=True)
            continue
        runs.append(status)
    return sorted(runs, key=lambda s: s["started"])


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.1f}" if n < 10 << 20 else f"{n / (1 << 20):,.0f}"


def render(runs: list[dict[str, Any]]) -> list[object]:
    """A table per run, within 80 columns (wrapped, never cut): the vGPUs by VM and type;
    their UUIDs are in --json."""
    if not runs:
        return [Text("no gpuvm run is going on")]
    out: list[object] = []
    for run in runs:
        engine = run.get("engine_utilisation")
        label = f"{run['label']}, " if run.get("label") else ""
        title = (f"pid {run['pid']}: {label}{run['mode']}, {run['policy']}; engine "
                 f"{'-' if engine is None else f'{100 * engine:.0f}%'} over the last "
                 f"{run['window_s']:.1f} s")
        t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
                  pad_edge=False, collapse_padding=True)
        for col, just in (("VM", "left"), ("Type", "left"), ("VRAM\nMiB", "right"),
                          ("Ch", "right"), ("Util\n%", "right"), ("Share\n%", "right"),
                          ("Credit\nms", "right"), ("Traps/s", "right"), ("Syncs", "right"),
                          ("Done", "left")):
            t.add_column(col, justify=just, overflow="fold")
        for v in run["vgpus"]:
            credit = v.get("credit")
            t.add_row(v["vm"], v["type"],
                      f"{_mib(v['vram_used'])}/{_mib(v['vram_total'])}", str(v["channels"]),
                      f"{100 * v['utilisation']:.0f}", f"{100 * v['share']:.0f}",
                      "-" if credit is None else f"{credit / 1e6:.1f}",
                      f"{v['traps_per_s']:,.0f}", f"{v['shadow_syncs']:,}", v["phase"])
        out.append(t)
    out.append(Text("VRAM: MiB written (resident) / the slice; Ch: channels bound; Util: "
                    "compute work given to the engine in the window; Share: scheduler "
                    "weight; Credit: CREDIT/BAND balance; Syncs: shadow page-table syncs; "
                    "Done: last finished phase; UUIDs: gpuvm smi --json", style="dim"))
    return out


def main(args: argparse.Namespace) -> int:
    console = Console()  # the terminal's width; piped, $COLUMNS or 80
    try:
        while True:
            runs = read_status()
            if args.json:
                print(json.dumps(runs), flush=True)
            else:
                if args.loop and sys.stdout.isatty():
                    console.clear()
                for r in render(runs):
                    console.print(r)
            if not args.loop:
                return 0
            time.sleep(args.loop)
    except OSError as exc:
        raise UserError(f"cannot read the run status: {exc}") from None
