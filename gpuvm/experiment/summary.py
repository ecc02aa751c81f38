"""What `gpuvm experiment` prints when it ends: one compact table within 80 columns, a
row per scenario, mode and policy; the report (report.md, its figures and CSV) holds
the rest, and its path is the last line printed.

Why not the report itself: its Markdown tables run to 13 columns, unreadable on a
terminal, and the report is a file to open anyway.
"""

from __future__ import annotations

from rich import box
from rich.table import Table

from gpuvm.experiment.execute import VmRow


def _ms(ns: float) -> str:
    ms = ns / 1e6
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:,.2f}"


def summary_table(name: str, profile: str, rows: list[VmRow]) -> Table:
    """Per scenario x mode x policy: runs, VMs passed, the mean modelled time of a VM
    run, and that over native's in the same scenario (where native ran)."""
    groups: dict[tuple[str, str, str], list[VmRow]] = {}
    for r in rows:
        groups.setdefault((r.scenario, r.mode, r.policy), []).append(r)

    def mean_ns(rs: list[VmRow]) -> float:
        done = [r.total_modelled_ns for r in rs if r.passed]
        return sum(done) / len(done) if done else 0.0

    native = {s: mean_ns(rs) for (s, m, _), rs in groups.items() if m == "native"}
    policies = len({p for _, _, p in groups}) > 1
    t = Table(title=f"{name}: modelled time ({profile} prices)",
              title_justify="left", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, collapse_padding=True)
    for col in ["scenario", "mode"] + (["policy"] if policies else []) + \
            ["runs", "VMs pass", "ms per VM", "x native"]:
        t.add_column(col, justify="left" if col in ("scenario", "mode", "policy")
                     else "right", overflow="fold")
    last = None
    for (scenario, mode, policy), rs in groups.items():
        runs = len({r.rep for r in rs})
        passed = sum(r.passed for r in rs)
        model = mean_ns(rs)
        base = native.get(scenario)
        ratio = f"{model / base:.2f}" if base and model and mode != "native" else \
            ("1.00" if base and mode == "native" else "-")
        t.add_row(scenario if scenario != last else "", mode,
                  *([policy] if policies else []), str(runs), f"{passed}/{len(rs)}",
                  _ms(model) if model else "-", ratio)
        last = scenario
    return t
