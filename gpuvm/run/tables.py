"""Tables of what a run did: per-VM phases and a comparison of modes."""

from __future__ import annotations

from typing import Callable

from rich import box
from rich.table import Table
from rich.text import Text

from gpuvm.mediator import mdev_types
from gpuvm.run.mediated import gpu_types, machine_profile
from gpuvm.run.result import VmResult
from gpuvm.run.spec import RunOptions
from gpuvm.vmm.guest_session import PhaseRecord


# ------------------------------------------------------------------------------ table
def _sum(counters: dict[str, int], *names: str) -> int:
    return sum(counters.get(n, 0) for n in names)


def _prefix_sum(counters: dict[str, int], prefix: str) -> int:
    return sum(v for k, v in counters.items() if k.startswith(prefix))


PHASE_COLUMNS: list[tuple[str, Callable[[dict[str, int]], int]]] = [
    ("Exits BAR0", lambda c: _sum(c, "exits.mmio.bar0.read", "exits.mmio.bar0.write")),
    ("Exits BAR1", lambda c: _sum(c, "exits.mmio.bar1.read", "exits.mmio.bar1.write")),
    ("Exits BAR3", lambda c: _sum(c, "exits.mmio.bar3.read", "exits.mmio.bar3.write")),
    ("Exits I/O", lambda c: c.get("exits.io", 0)),
    # the device counts these in native mode; the vGPU counts the guest's own in mediated ones
    ("PRAMIN", lambda c: _prefix_sum(c, "mmio.bar0.pramin.") + _prefix_sum(c, "trap.bar0.pramin.")),
    ("TLB flush", lambda c: c.get("tlb.guest_flushes", c.get("tlb.flushes", 0))),
    ("Doorbell", lambda c: c.get("pfifo.doorbells", 0)),
    ("Copied bytes", lambda c: c.get("copy.bytes", 0)),
    ("Kernels", lambda c: c.get("compute.kernels", 0)),
]
MEDIATED_COLUMNS: list[tuple[str, Callable[[dict[str, int]], int]]] = [
    ("Traps", lambda c: _prefix_sum(c, "trap.bar")),
    ("Shadow syncs", lambda c: c.get("shadow.syncs", 0)),
    ("PTEs scanned", lambda c: c.get("shadow.ptes_scanned", 0)),
    ("Refused", lambda c: c.get("shadow.ptes_refused", 0) + _prefix_sum(c, "trap.refused.")),
    ("Hypercalls", lambda c: c.get("hcall.calls", 0)),
]
# oversubscribed vGPUs (mediator/residency.py): pages moved at scheduling boundaries
RESIDENCY_COLUMNS: list[tuple[str, Callable[[dict[str, int]], int]]] = [
    ("Pages in", lambda c: c.get("residency_pages_in", 0)),
    ("Pages out", lambda c: c.get("residency_pages_out", 0)),
    ("Bytes moved", lambda c: c.get("residency_bytes", 0)),
    ("Switches", lambda c: c.get("residency_switches", 0)),
    ("Switch µs", lambda c: c.get("residency_switch_ns", 0) // 1000),
]

DRIVER_COUNTS = ("pte_writes", "pde_writes", "pt_zero_words", "tlb_flushes", "doorbells",
                 "hypercalls", "hc_entries", "copies", "launches", "waits")


def _total(phases: list[PhaseRecord]) -> PhaseRecord:
    total = PhaseRecord("Total")
    for p in phases:
        total.wall_ns += p.wall_ns
        total.device_ns += p.device_ns
        for k, v in p.counters.items():
            total.counters[k] = total.counters.get(k, 0) + v
    return total


def _by_phase(title: object, rows: list[PhaseRecord],
              counts: list[tuple[str, Callable[[dict[str, int]], int]]],
              times: bool = False) -> object:
    """Phases across, counts down: at most six columns of numbers, so the table fits 80
    columns however many counts a mode adds (a wide number folds, it is never cut)."""
    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("", no_wrap=True)
    for p in rows:
        table.add_column(p.name, justify="right", overflow="fold")
    if times:
        table.add_row("Wall ms", *(f"{p.wall_ns / 1e6:.2f}" for p in rows))
        table.add_row("Device ms", *(f"{p.device_ns / 1e6:.2f}" for p in rows),
                      end_section=True)
    for name, fn in counts:
        table.add_row(name, *(f"{fn(p.counters):,}" for p in rows))
    return table


def render(result: VmResult, backend: str, mode: str) -> list[object]:
    """rich renderables describing one VM's run: phases, MMIO by block, driver counts."""
    s = result.session
    rec = result.record
    status = Text("PASS", style="bold green") if result.passed else Text("FAIL", style="bold red")
    sizes = " ".join(f"{k}={v}" for k, v in rec.items()
                     if k in ("n", "bytes", "iterations", "pinned", "vector", "addr", "len"))
    title = Text.assemble(f"{result.spec.name}: {result.spec.benchmark} {sizes} "
                          f"({mode}, {backend}) ", status)
    if "maxerr" in rec:
        title.append(f"  maxerr={rec['maxerr']} tol={rec.get('tol', '?')}")
    rows = s.phases + ([_total(s.phases)] if s.phases else [])
    out: list[object] = [_by_phase(title, rows, PHASE_COLUMNS + (
        MEDIATED_COLUMNS if mode != "native" else []), times=True)]

    total = rows[-1].counters if rows else {}
    names = sorted({k.rsplit(".", 1)[0] for k in total
                    if k.startswith("mmio.") and k.endswith((".read", ".write"))})
    if names:  # counted where the device sees the VM's own MMIO (native)
        blocks = Table(title="MMIO reaching the device, by block (all phases)",
                       title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
        blocks.add_column("Block")
        blocks.add_column("Reads", justify="right")
        blocks.add_column("Writes", justify="right")
        for n in names:
            blocks.add_row(n.removeprefix("mmio."), f"{total.get(n + '.read', 0):,}",
                           f"{total.get(n + '.write', 0):,}")
        out.append(blocks)
    if "residency_switches" in total:  # an oversubscribed vGPU
        out.append(_by_phase("Residency: pages moved between the VRAM pool and the backing "
                             "store (copy engine)", rows, RESIDENCY_COLUMNS))
    driver = "  ".join(f"{k}={rec[k]}" for k in DRIVER_COUNTS if k in rec)
    if driver:
        out.append(Text(f"driver: {driver}"))
    return out


def totals(result: VmResult) -> PhaseRecord:
    return _total(result.session.phases)


COMPARED_COUNTS: list[tuple[str, Callable[[dict[str, int]], int]]] = [
    ("Exits", lambda c: _prefix_sum(c, "exits.")),
    ("Traps", lambda c: _prefix_sum(c, "trap.bar")),
    ("Shadow syncs", lambda c: c.get("shadow.syncs", 0)),
    ("PTEs scanned", lambda c: c.get("shadow.ptes_scanned", 0)),
    ("Refused", lambda c: c.get("shadow.ptes_refused", 0) + _prefix_sum(c, "trap.refused.")),
    ("Hypercalls", lambda c: c.get("hcall.calls", 0)),
    ("HC entries", lambda c: c.get("hcall.entries", 0)),
    ("Remap maps", lambda c: c.get("remap.maps", 0)),
]


def _compared(results: list[VmResult]) -> list[str]:
    """One mode's column: its VMs' phases summed."""
    phases = [p for r in results for p in r.session.phases]
    total = _total(phases)
    init_close = sum(p.wall_ns for p in phases if p.name in ("Init", "Close"))
    return [f"{sum(r.passed for r in results)}/{len(results)}",
            f"{total.wall_ns / 1e6:,.1f}",
            f"{100 * init_close / total.wall_ns:.0f}" if total.wall_ns else "-",
            *(f"{fn(total.counters):,}" for _, fn in COMPARED_COUNTS)]


def render_comparison(runs: dict[str, list[VmResult]], benchmark: str) -> object:
    """One column per mode (summed over its VMs): where the time and the traps went.
    Modes across, so all seven fit 80 columns (a header or a wide number folds)."""
    table = Table(title=f"{benchmark}: modes compared (sums over each mode's VMs)",
                  title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False,
                  padding=(0, 1, 0, 0))
    table.add_column("", no_wrap=True)
    for mode in runs:
        table.add_column(mode, justify="right", overflow="fold")
    columns = [_compared(results) for results in runs.values()]
    names = ["VMs pass", "Wall ms", "Init+Close %", *(n for n, _ in COMPARED_COUNTS)]
    for i, name in enumerate(names):
        table.add_row(name, *(c[i] for c in columns), end_section=name == "Init+Close %")
    return table


# ------------------------------------------------------------------------ summary
def _ms(ns: float) -> str:
    ms = ns / 1e6
    return f"{ms:,.0f}" if ms >= 1000 else f"{ms:.1f}" if ms >= 100 else f"{ms:.2f}"


def _vram_of(spec: object) -> str:
    try:
        t = mdev_types.lookup(gpu_types(machine_profile(RunOptions())), spec.mdev_type)
    except Exception:  # a custom partition or a type of another GPU size
        return "-"
    return f"{t.partition.vram_size >> 20:,} MiB"


RESULT_KEYS = ("maxerr", "faulted", "refused", "vector", "n", "bytes", "iterations")


def render_vms(runs: dict[str, list[VmResult]], rows: list) -> list[object]:
    """What each VM ran and the GPU it saw (one line per VM; modes share it)."""
    first = next(iter(runs.values()))
    t = Table(title="VMs (each sees the GPU of its vGPU type, native ones too)",
              title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # within 80 columns: the short columns never wrap, the long ones wrap whole words
    # (a probe's parameters, what the guest says) rather than being cut
    for col in ("VM", "Benchmark", "GPU (mdev type)", "VRAM", "Pass", "Guest says"):
        t.add_column(col, no_wrap=col in ("VM", "VRAM", "Pass"), overflow="fold",
                     justify="right" if col in ("VRAM", "Pass") else "left")
    for i, r in enumerate(first):
        passed = [rs[i].passed for rs in runs.values()]
        rec = r.record
        says = " ".join(f"{k}={rec[k]}" for k in RESULT_KEYS if k in rec)
        params = ",".join(str(p) for p in r.spec.params) or "default"
        t.add_row(r.spec.name, f"{r.spec.benchmark} {params}"
                  + (f" inject={r.spec.inject}" if r.spec.inject else ""),
                  r.spec.mdev_type or "custom", _vram_of(r.spec),
                  f"{sum(passed)}/{len(passed)}", says or "-")
    return [t]


SUMMARY_NOTES = (
    "Model ms: engine time + every counted event priced by the cost profile {profile} "
    "(experiments/costs/{profile}.toml), the time to compare with the paper; "
    "xNat: Model ms over native's for the same VM and phase (when native ran); "
    "Dev ms: the emulated device's clock (--clock virtual: the VM's own virtual time); "
    "Wall ms: this machine's; "
    "Traps: guest MMIO the mediator trapped; Syncs: shadow page-table syncs; "
    "Hcalls: PV hypercalls.  Rows are per VM and mode; 'all' sums the VM's phases.")


def render_summary(rows: list, profile: str) -> list[object]:
    """One table, VM x mode x phase: modelled, device and wall time, xnative, traps,
    syncs, hypercalls.  Narrow on purpose (about 75 columns), so a pipe or an 80-column
    terminal shows every column whole."""
    native = {(r.vm, p): ns for r in rows if r.mode == "native"
              for p, ns in [*r.modelled_ns.items(), ("all", r.total_modelled_ns)]}
    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, title="Summary", title_justify="left")
    for col in ("VM/mode/phase", "Model ms", "xNat", "Dev ms", "Wall ms", "Traps", "Syncs",
                "Hcalls"):
        t.add_column(col, no_wrap=True, justify="left" if col == "VM/mode/phase" else "right")
    several_modes = len({r.mode for r in rows}) > 1
    for r in rows:
        verdict = "" if r.passed else " FAIL"
        t.add_row(Text(f"{r.vm} {r.mode}{verdict}", style="bold"), *[""] * 7)
        phases = list(r.wall_ns) + ["all"]
        for i, p in enumerate(phases):
            c = r.counters if p == "all" else r.phase_counters.get(p, {})
            model = r.total_modelled_ns if p == "all" else r.modelled_ns.get(p, 0.0)
            base = native.get((r.vm, p))
            ratio = f"{model / base:.2f}" if base and r.mode != "native" else \
                ("1.00" if base else "-")
            wall = r.total_wall_ns if p == "all" else r.wall_ns[p]
            dev = sum(r.device_ns.values()) if p == "all" else r.device_ns.get(p, 0)
            t.add_row(f"  {p}", _ms(model), ratio, _ms(dev), _ms(wall),
                      f"{_prefix_sum(c, 'trap.bar'):,}", f"{c.get('shadow.syncs', 0):,}",
                      f"{c.get('hcall.calls', 0):,}",
                      end_section=i == len(phases) - 1 and several_modes)
    return [t, Text(SUMMARY_NOTES.format(profile=profile), style="dim")]
