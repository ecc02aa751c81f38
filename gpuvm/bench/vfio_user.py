"""`gpuvm bench vfio-user`: one trapped access over a vfio-user socket against the same
call in-process, with no KVM, so the socket's own cost can be measured on any host.

Each measurement (gpuvm/bench/vfio_user_probe.py, a process of its own) makes N
`write(0, PMC_INTR_EN, 4, v)` and N `read`s on a bench target (`bench_target` of
gpuvm/bench/exits.py: the dict-backed register file, or the fv vGPU that `gpuvm bench
exits` traps into) directly, then on a VfioUserDevice talking to the same kind of device
served by a child process (`serve_target`: one DeviceServer thread, as `bench exits
--transport vfio-user` serves it).  The difference is what the socket adds to every
trapped access; on KVM the in-process trap also pays the exit itself, so the ratio of
`bench exits` is (exit + in-process + added) / (exit + in-process).

`--baseline DIR` measures another checkout's vfio-user code in the same run (e.g. the
main branch beside a change), alternating the two round by round so that both see the
same host load; every figure is the minimum over the rounds, with the spread (max/min - 1)
of the socket figures beside it.

Both sides poll for the peer's message before sleeping only on hosts with >= 4 cores
(protocol.SPIN_S); `--poll-us` sets it for this run (as GPUVM_VFIO_USER_POLL_US does for
any gpuvm process), so a 2-core host can measure the polling path that a 16-core host
takes -- while nothing else runs, as two pollers then hold both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

import gpuvm
from gpuvm.errors import UserError
from gpuvm.vfio.user import protocol

DEVICE_KINDS = ("registers", "vgpu")
DEFAULT_ACCESSES = 20_000
DEFAULT_ROUNDS = 3
PROBE = Path(__file__).with_name("vfio_user_probe.py")
THIS_CHECKOUT = Path(gpuvm.__file__).resolve().parents[1]
FIGURES = ("inproc_write_us", "inproc_read_us", "socket_write_us", "socket_read_us")


def _probe(root: Path, kind: str, accesses: int, poll_us: float) -> dict:
    """One measurement with `root`'s gpuvm (the probe runs with `root` as its first
    import path; see the probe's docstring)."""
    env = dict(os.environ, PYTHONPATH=str(root))
    env[protocol.POLL_ENV] = repr(poll_us)
    code = f"import runpy; runpy.run_path({str(PROBE)!r}, run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code, kind, str(accesses), repr(poll_us)],
                          cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"vfio-user probe of {kind} in {root} failed: {last}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    used = Path(result["gpuvm"]).resolve().parents[1]
    if used != root:
        raise UserError(f"vfio-user probe meant for {root} imported gpuvm from {used}")
    return result


def run_vfio_user_bench(accesses: int = DEFAULT_ACCESSES, rounds: int = DEFAULT_ROUNDS,
                        poll_us: float | None = None, kinds: tuple[str, ...] = DEVICE_KINDS,
                        baseline: Path | None = None) -> dict:
    """{accesses, rounds, poll_us, load_before, load_after, rows: [{checkout ("this" or
    "baseline"), path, kind,
    <FIGURES as minima>, socket_{write,read}_spread (max/min - 1 over the rounds),
    added_{write,read}_us (socket - in-process), {write,read}_ratio (socket /
    in-process)}]}; rows of the baseline (when given) come first."""
    if accesses < 1 or rounds < 1:
        raise UserError("--accesses and --rounds must be at least 1")
    poll_us = protocol.SPIN_S * 1e6 if poll_us is None else poll_us
    if not 0 <= poll_us <= 1e6:
        raise UserError(f"--poll-us {poll_us}: expected 0 to 1000000")
    roots = {"this": THIS_CHECKOUT}
    if baseline is not None:
        base = baseline.resolve()
        if not (base / "gpuvm" / "vfio" / "user" / "client.py").is_file():
            raise UserError(f"--baseline {baseline}: not a gpuvm checkout with vfio-user")
        roots = {"baseline": base, **roots}
    load_before = os.getloadavg()[0]
    samples: dict[tuple[str, str], list[dict]] = {}
    for _ in range(rounds):
        for label, root in roots.items():
            for kind in kinds:
                samples.setdefault((label, kind), []).append(
                    _probe(root, kind, accesses, poll_us))
    rows = []
    for (label, kind), runs in samples.items():
        row: dict = {"checkout": label, "path": str(roots[label]), "kind": kind}
        for figure in FIGURES:
            row[figure] = min(r[figure] for r in runs)
        for way in ("write", "read"):
            row[f"socket_{way}_spread"] = max(r[f"socket_{way}_us"] for r in runs) / \
                row[f"socket_{way}_us"] - 1
            row[f"added_{way}_us"] = row[f"socket_{way}_us"] - row[f"inproc_{way}_us"]
            row[f"{way}_ratio"] = row[f"socket_{way}_us"] / row[f"inproc_{way}_us"]
        rows.append(row)
    return {"accesses": accesses, "rounds": rounds, "poll_us": poll_us,
            "load_before": load_before, "load_after": os.getloadavg()[0], "rows": rows}


def print_vfio_user_bench(r: dict) -> None:
    table = Table(title=f"a BAR0 access over vfio-user vs in-process (µs, min of "
                        f"{r['rounds']} rounds of {r['accesses']:,})")
    paths = {row["checkout"]: row["path"] for row in r["rows"]}
    table.caption = (f"poll {r['poll_us']:g} µs; load {r['load_before']:.2f} -> "
                     f"{r['load_after']:.2f}; spread = max/min - 1 over the rounds; " +
                     "; ".join(f"{label} = {path}" for label, path in paths.items()))
    for name in ("checkout", "target", "access", "in-process", "socket", "socket adds",
                 "× in-process", "spread"):
        table.add_column(name, justify="left" if name in ("checkout", "target", "access")
                         else "right")
    for row in r["rows"]:
        for way in ("write", "read"):
            table.add_row(row["checkout"], row["kind"], way,
                          f"{row[f'inproc_{way}_us']:.2f}", f"{row[f'socket_{way}_us']:.2f}",
                          f"{row[f'added_{way}_us']:.2f}", f"{row[f'{way}_ratio']:.0f}",
                          f"{row[f'socket_{way}_spread']:.0%}")
    Console().print(table)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--accesses", type=int, default=DEFAULT_ACCESSES,
                        help="writes, then reads, per measurement (default %(default)s)")
    parser.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS,
                        help="measurements per checkout and target; figures are the "
                             "minimum (default %(default)s)")
    parser.add_argument("--target", choices=("all",) + DEVICE_KINDS, default="all",
                        help="registers (a dict-backed register file), vgpu (the fv vGPU "
                             "of `bench exits`), or all")
    parser.add_argument("--poll-us", type=float, default=None,
                        help="µs each side polls before sleeping (default: "
                             "GPUVM_VFIO_USER_POLL_US, else 50 with >= 4 cores, else 0)")
    parser.add_argument("--baseline", type=Path, default=None,
                        help="another gpuvm checkout to measure alternately in the same run")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def main_vfio_user(args: argparse.Namespace) -> int:
    """Entry point for `gpuvm bench vfio-user`."""
    kinds = DEVICE_KINDS if args.target == "all" else (args.target,)
    result = run_vfio_user_bench(args.accesses, args.rounds, args.poll_us, kinds,
                                 args.baseline)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_vfio_user_bench(result)
    return 0
