"""Utilisation-over-time figures: one panel per policy, one line per VM, shares dashed.

This is the shape of Gdev's isolation figure: FIFO lets the long-kernel VM take the GPU,
CREDIT barely helps, BAND holds each VM near its share.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from gpuvm.sim.results import SimResult
from scheduler.metrics import VmMetrics
from scheduler.params import MS


def pyplot():
    """matplotlib.pyplot, drawing to files only (the Agg backend, never a display).

    Imported here, when the first figure is drawn, not at the top of a module: matplotlib
    takes about a second to import, which every `gpuvm` command that only may draw (run,
    experiment, model, their --help) would otherwise pay before doing anything."""
    import matplotlib  # heavy: see above
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: see above
    return plt


@dataclass
class UtilisationPanel:
    """One panel: the VMs of one run, their shares, and the window where all were active.

    Both the simpy model and the emulator's isolation runs draw through this, so their
    figures are the same shape and can be compared side by side."""

    title: str
    metrics: dict[str, VmMetrics]
    shares: dict[str, float]  # normalised
    window: tuple[int, int]  # ns, all VMs active
    end_ns: int


def render_panels(panels: Sequence[UtilisationPanel], path: str | Path, clock: str,
                  step_ns: int = 50 * MS, window_ns: int = 1000 * MS) -> Path:
    """Write a PNG of sliding-window utilisation per VM, one panel per run; `clock` names
    the time its x axis is in (the model's or the emulated device's, both virtual)."""
    if not panels:
        raise ValueError("results: nothing to plot")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    plt = pyplot()
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 2.6 * len(panels)),
                             sharex=True, squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        times = np.arange(step_ns, panel.end_ns + 1, step_ns, dtype=np.int64)
        for i, (name, metrics) in enumerate(panel.metrics.items()):
            colour = f"C{i}"
            ax.plot(times / 1e9, 100 * metrics.utilisation_series(times, window_ns),
                    color=colour, label=name)
            if name in panel.shares:
                ax.axhline(100 * panel.shares[name], color=colour, linestyle="--",
                           linewidth=0.8)
        t0, t1 = panel.window
        ax.axvspan(t0 / 1e9, t1 / 1e9, color="0.93", zorder=0)
        ax.set_ylim(0, 105)
        ax.set_ylabel("GPU util %")
        ax.set_title(panel.title, fontsize=10)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)  # off the lines
    axes[-1, 0].set_xlabel(f"{clock} (s); each VM's utilisation over a sliding "
                           f"{window_ns / 1e9:g} s window; shaded: all VMs active; "
                           "dashed: share")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render_utilisation(results: Sequence[SimResult], path: str | Path,
                       step_ns: int = 50 * MS, window_ns: int = 1000 * MS) -> Path:
    """Write a PNG of sliding-window utilisation per VM, one panel per simulation."""
    panels = []
    for result in results:
        order = [spec.name for spec in result.scenario.vms if spec.name in result.metrics]
        panels.append(UtilisationPanel(
            f"{result.scenario.name} — {result.policy.upper()} "
            f"(max error {result.max_error_pp():.1f} pp)",
            {name: result.metrics[name] for name in order}, result.scenario.nominal_shares(),
            result.scenario.measure_window, result.end_ns))
    return render_panels(panels, path, "modelled (virtual) time", step_ns, window_ns)
