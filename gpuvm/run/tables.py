"""Tables of what a run did: per-VM phases and a comparison of modes."""

from __future__ import annotations

from typing import Callable

from gpuvm.run.execute import VmResult
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
TABLE_WIDTH = 150  # when stdout is not a terminal (rich would assume 80 columns)

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


def render(result: VmResult, backend: str, mode: str) -> list[object]:
    """rich renderables describing one VM's run: phases, MMIO by block, driver counts."""
    from rich.table import Table
    from rich.text import Text

    s = result.session
    rec = result.record
    status = Text("PASS", style="bold green") if result.passed else Text("FAIL", style="bold red")
    sizes = " ".join(f"{k}={v}" for k, v in rec.items()
                     if k in ("n", "bytes", "iterations", "pinned", "vector", "addr", "len"))
    title = Text.assemble(f"{result.spec.name}: {result.spec.benchmark} {sizes} "
                          f"({mode}, {backend}) ", status)
    if "maxerr" in rec:
        title.append(f"  maxerr={rec['maxerr']} tol={rec.get('tol', '?')}")

    table = Table(title=title, title_justify="left")
    columns = PHASE_COLUMNS + (MEDIATED_COLUMNS if mode != "native" else [])
    table.add_column("Phase")
    table.add_column("Wall ms", justify="right")
    table.add_column("Device ms", justify="right")
    for name, _ in columns:
        table.add_column(name, justify="right", no_wrap=True)
    rows = s.phases + ([_total(s.phases)] if s.phases else [])
    for i, p in enumerate(rows):
        table.add_row(p.name, f"{p.wall_ns / 1e6:.2f}", f"{p.device_ns / 1e6:.2f}",
                      *(f"{fn(p.counters):,}" for _, fn in columns),
                      end_section=i == len(rows) - 2)

    total = rows[-1].counters if rows else {}
    blocks = Table(title="MMIO reaching the device, by block (all phases)", title_justify="left")
    blocks.add_column("Block")
    blocks.add_column("Reads", justify="right")
    blocks.add_column("Writes", justify="right")
    names = sorted({k.rsplit(".", 1)[0] for k in total
                    if k.startswith("mmio.") and k.endswith((".read", ".write"))})
    for n in names:
        blocks.add_row(n.removeprefix("mmio."), f"{total.get(n + '.read', 0):,}",
                       f"{total.get(n + '.write', 0):,}")
    driver = "  ".join(f"{k}={rec[k]}" for k in DRIVER_COUNTS if k in rec)
    out: list[object] = [table, blocks]
    if driver:
        out.append(Text(f"driver: {driver}"))
    return out


def totals(result: VmResult) -> PhaseRecord:
    return _total(result.session.phases)


def render_comparison(runs: dict[str, list[VmResult]], benchmark: str) -> object:
    """One row per mode (summed over its VMs): where the time and the traps went."""
    from rich.table import Table

    table = Table(title=f"{benchmark}: modes compared (sums over each mode's VMs)",
                  title_justify="left")
    for col in ("Mode", "VMs pass", "Wall ms", "Init+Close %", "Exits", "Traps",
                "Shadow syncs", "PTEs scanned", "Refused", "Hypercalls", "HC entries",
                "Remap maps"):
        table.add_column(col, justify="left" if col == "Mode" else "right", no_wrap=True)
    for mode, results in runs.items():
        phases = [p for r in results for p in r.session.phases]
        total = _total(phases)
        c = total.counters
        init_close = sum(p.wall_ns for p in phases if p.name in ("Init", "Close"))
        table.add_row(
            mode, f"{sum(r.passed for r in results)}/{len(results)}",
            f"{total.wall_ns / 1e6:,.1f}",
            f"{100 * init_close / total.wall_ns:.0f}" if total.wall_ns else "-",
            f"{_prefix_sum(c, 'exits.'):,}", f"{_prefix_sum(c, 'trap.bar'):,}",
            f"{c.get('shadow.syncs', 0):,}", f"{c.get('shadow.ptes_scanned', 0):,}",
            f"{c.get('shadow.ptes_refused', 0) + _prefix_sum(c, 'trap.refused.'):,}",
            f"{c.get('hcall.calls', 0):,}", f"{c.get('hcall.entries', 0):,}",
            f"{c.get('remap.maps', 0):,}")
    return table


