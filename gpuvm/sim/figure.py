"""Utilisation-over-time figures: one panel per policy, one line per VM, shares dashed.

This is the shape of Gdev's isolation figure: FIFO lets the long-kernel VM take the GPU,
CREDIT barely helps, BAND holds each VM near its share.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; never a display
import matplotlib.pyplot as plt  # noqa: E402

from gpuvm.sim.results import SimResult  # noqa: E402
from scheduler.params import MS  # noqa: E402


def render_utilisation(results: Sequence[SimResult], path: str | Path,
                       step_ns: int = 50 * MS, window_ns: int = 1000 * MS) -> Path:
    """Write a PNG of sliding-window utilisation per VM, one panel per result."""
    if not results:
        raise ValueError("results: nothing to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(len(results), 1, figsize=(9, 2.6 * len(results)),
                             sharex=True, squeeze=False)
    for ax, result in zip(axes[:, 0], results):
        times, series = result.utilisation_series(step_ns, window_ns)
        shares = result.scenario.nominal_shares()
        for i, spec in enumerate(result.scenario.vms):
            if spec.name not in series:
                continue
            colour = f"C{i}"
            ax.plot(times / 1e9, 100 * series[spec.name], color=colour, label=spec.name)
            ax.axhline(100 * shares[spec.name], color=colour, linestyle="--", linewidth=0.8)
        t0, t1 = result.scenario.measure_window
        ax.axvspan(t0 / 1e9, t1 / 1e9, color="0.93", zorder=0)
        ax.set_ylim(0, 105)
        ax.set_ylabel("GPU util %")
        ax.set_title(f"{result.scenario.name} — {result.policy.upper()} "
                     f"(max error {result.max_error_pp():.1f} pp)", fontsize=10)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1, 0].set_xlabel(f"time (s); utilisation over a sliding {window_ns / 1e9:g} s window; "
                           "shaded: all VMs active; dashed: share")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
