"""The hostmem report (issue 16): the emulator's host-memory counts priced with measured
profiles, beside what was measured on the real GPU.

Every modelled number here is exact counts (hostmem.* counters from the guest's reports)
times a profile's prices (costs.HostMemCosts); the measured numbers are read from the
profile file itself (gpuvm/calibrate/profile.py), with their spread.
"""

from __future__ import annotations

from pathlib import Path

from gpuvm.calibrate import profile as gpu_profile
from gpuvm.calibrate.footprint import footprint_table
from gpuvm.device import regs
from gpuvm.experiment.config import Experiment
from gpuvm.experiment.costs import COSTS_DIR, HostMemCosts, load_hostmem_costs
from gpuvm.experiment.execute import VmRow

TOLERANCE = 0.10  # the "within 10%"
MEASURED = "gpu-h100"


def _gib_s(nbytes: int, ns: float) -> float:
    return nbytes / (1 << 30) / (ns / 1e9) if ns > 0 else float("nan")


def _phase_gib_s(row: VmRow, phase: str, direction: str, costs: HostMemCosts) -> float:
    counters = row.phase_counters.get(phase, {})
    moved = sum(v for k, v in counters.items()
                if k.startswith(f"hostmem.xfer.{direction}.") and k.endswith(".bytes"))
    return _gib_s(moved, costs.modelled_ns(counters))


def _find(rows: list[VmRow], scenario: str, vm: str) -> VmRow | None:
    return next((r for r in rows if r.scenario == scenario and r.vm == vm and r.passed), None)


def _spread(s) -> str:
    return f"{s.median:.2f} [{s.min:.2f}–{s.max:.2f}]"


def _bandwidth(rows: list[VmRow], measured: gpu_profile.GpuProfile,
               costs: HostMemCosts) -> list[str]:
    md = ["## Pinned and pageable bandwidth: measured vs modelled", "",
          f"Measured: `{MEASURED}.toml` ({measured.device.gpu}, {measured.device.date}), "
          f"median [min–max] of {measured.device.reps} runs, GiB/s.  Modelled: the emulator's "
          "64 MiB memcpy (counts of bytes per path) priced with that profile.  The profile's "
          "bandwidths are the 1 GiB medians, so the 1 GiB column is the fit and the 64 MiB "
          "column is the check.", "",
          "| copy | measured 64 MiB | measured 1 GiB | modelled | vs 64 MiB | vs 1 GiB | within 10% |",
          "|---|---|---|---|---|---|---|"]
    by = {(b.direction, b.host, b.nbytes): b.gib_s for b in measured.bandwidth}
    cases = [("pinned", "h2d", "HtoD"), ("pinned", "d2h", "DtoH"),
             ("pageable", "h2d", "HtoD"), ("pageable", "d2h", "DtoH")]
    for host, direction, phase in cases:
        row = _find(rows, "bandwidth", host)
        small, large = by.get((direction, host, 64 * regs.MiB)), by.get((direction, host, regs.GiB))
        if row is None or small is None or large is None:
            md.append(f"| {direction} {host} | missing | | | | | |")
            continue
        model = _phase_gib_s(row, phase, "htod" if direction == "h2d" else "dtoh", costs)
        e_small, e_large = model / small.median - 1, model / large.median - 1
        ok = abs(e_small) <= TOLERANCE and abs(e_large) <= TOLERANCE
        md.append(f"| {direction} {host} | {_spread(small)} | {_spread(large)} | {model:.2f} | "
                  f"{e_small:+.1%} | {e_large:+.1%} | {'yes' if ok else 'NO'} |")
    md += ["", "Pageable memory pinned 4 MiB chunk by chunk (pin, copy, unpin per chunk), "
           "against the measured chunk-pinned D2H into a 1 GiB memfd (`[[d2h_into]]`, "
           "mode chunk-pinned).  Not one of the issue's targets; shown as it comes out:", "",
           "| guest RAM | measured D2H | modelled D2H | error |", "|---|---|---|---|"]
    into = {(c.memory, c.mode): c.gib_s for c in measured.d2h_into}
    for backing, memory in (("4k", "memfd-4k"), ("thp", "memfd-thp")):
        row = _find(rows, "bandwidth", f"chunk-pinned-{backing}")
        meas = into.get((memory, "chunk-pinned"))
        if row is None or meas is None:
            md.append(f"| {memory} | missing | | |")
            continue
        model = _phase_gib_s(row, "DtoH", "dtoh", costs)
        md.append(f"| {memory} | {_spread(meas)} | {model:.2f} | {model / meas.median - 1:+.1%} |")
    return md + [""]


def _thp(rows: list[VmRow], profiles: list[HostMemCosts]) -> list[str]:
    md = ["## Huge-page splits of chunked pinning", "",
          "64 MiB pageable memcpy pinned in 4 MiB chunks starting 1 MiB into the buffer, so "
          "every chunk cuts two 2 MiB huge pages.  The emulator counts a split only for pins "
          "the device writes (D2H) of THP-backed guest RAM not advised MADV_NOHUGEPAGE. "
          "`gpu-h100` prices a split at 0 -- what we measured; `hostmem-field-split` at "
          "215.2 us -- derived from the field report (A10G, 10.7 -> 5.1 GB/s), not from our "
          "measurement.  huge kB: what /proc/self/smaps says really backed guest RAM "
          "(first report / end) on the host that ran this.  thp-pinned copies from pinned "
          "buffers (cuMemAllocHost; their pins, and splits, happen at allocation, not in the "
          "copies).", "",
          "| guest RAM | splits | pins | huge kB | " +
          " | ".join(f"H2D {p.name} | D2H {p.name}" for p in profiles) + " |",
          "|---|---|---|---|" + "---|---|" * len(profiles)]
    for vm in ("4k", "thp", "thp-nohugepage", "thp-pinned"):
        row = _find(rows, "thp", vm)
        if row is None:
            md.append(f"| {vm} | missing |")
            continue
        cells = []
        for p in profiles:
            cells += [f"{_phase_gib_s(row, 'HtoD', 'htod', p):.2f}",
                      f"{_phase_gib_s(row, 'DtoH', 'dtoh', p):.2f}"]
        h = row.hostmem
        md.append(f"| {vm} | {row.counters.get('hostmem.huge_splits', 0)} | "
                  f"{row.counters.get('hostmem.pins', 0)} | {h.get('huge_kib_first')} / "
                  f"{h.get('huge_kib_end')} | " + " | ".join(cells) + " |")
    md += ["", "What the real H100 showed (`gpuvm calibrate --gpu`, 1 GiB D2H into a memfd; "
           "huge kB from smaps before and after):", "",
           "| profile | memory | mode | huge kB before | after | GiB/s |", "|---|---|---|---|---|---|"]
    for name in ("gpu-h100", "gpu-h100-offset1m"):
        path = COSTS_DIR / f"{name}.toml"
        if not path.exists():
            continue
        prof = gpu_profile.load(path)
        for c in prof.d2h_into:
            md.append(f"| {name} | {c.memory} | {c.mode} | {c.huge_kib_before} | "
                      f"{c.huge_kib_after} | {_spread(c.gib_s)} |")
    md += ["", "On that machine (kernel 6.18) the THP-split slowdown did not reproduce: the "
           "memfd stayed huge-page mapped after chunked pinning and pageable D2H into THP "
           "memory was not slower than into 4 KiB pages.  The slowdown above exists only "
           "under the field-report profile.", ""]
    return md


def _footprint(rows: list[VmRow]) -> list[str]:
    md = ["## GPU page-table footprint of pinned guest memory", "",
          "1 GiB of pinned guest memory mapped in 4 KiB vs 128 KiB GPU pages, in 1 and 8 VMs, "
          "each VM with its own tables or through one shared mapping (exact counts; entry "
          "bytes = (PTEs + PDEs) x 8; table bytes = whole tables as allocated).", "",
          "| page | VMs | shared | PTEs | PDEs | tables | entry bytes | table bytes |",
          "|---|---|---|---|---|---|---|---|"]
    for f in footprint_table(regs.GiB, [1, 8]):
        md.append(f"| {f.page} | {f.spaces} | {'yes' if f.shared else 'no'} | {f.ptes} | "
                  f"{f.pdes} | {f.pts} | {f.entry_bytes} | {f.pt_bytes} |")
    md += ["", "Per VM of this experiment (peak pinned guest memory, one process each):", "",
           "| scenario/vm | pinned peak | 4 KiB: PTEs / table bytes | 128 KiB: PTEs / table bytes |",
           "|---|---|---|---|"]
    for r in rows:
        fp = r.hostmem.get("pt_footprint")
        if not fp or not r.hostmem.get("pinned_peak_bytes"):
            continue
        md.append(f"| {r.scenario}/{r.vm} | {r.hostmem['pinned_peak_bytes']} | "
                  f"{fp['4k']['ptes']} / {fp['4k']['pt_bytes']} | "
                  f"{fp['128k']['ptes']} / {fp['128k']['pt_bytes']} |")
    return md + [""]


def _smart(rows: list[VmRow], costs: HostMemCosts) -> list[str]:
    md = ["## Smart pinning vs none vs all", "",
          "8 allocations per size; every 4th is copied to the GPU and back in each of 8 "
          "rounds, the others once.  none = the profile run (its history picks the hot "
          "mask: allocations copied more than twice, i.e. more than one round trip); smart = pins only those; all = "
          f"pins every allocation.  Time: all phases, modelled with `{costs.name}` (pins, "
          "copies, unpins).", "",
          "| size | policy | hot mask | modelled ms | pinned peak MiB | vs none | vs all |",
          "|---|---|---|---|---|---|---|"]
    for size in ("256k", "1m", "4m", "16m"):
        found = {"none": _find(rows, "profile", f"none-{size}"),
                 "all": _find(rows, "use", f"all-{size}"),
                 "smart": _find(rows, "use", f"smart-{size}")}
        if any(r is None for r in found.values()):
            md.append(f"| {size} | missing | | | | | |")
            continue
        ms = {k: costs.modelled_ns(r.counters) / 1e6 for k, r in found.items()}
        for policy, r in found.items():
            md.append(f"| {size} | {policy} | {r.record.get('hot_mask', '')} | {ms[policy]:.3f} | "
                      f"{r.hostmem.get('pinned_peak_bytes', 0) / regs.MiB:.2f} | "
                      f"{ms[policy] / ms['none']:.2f} | {ms[policy] / ms['all']:.2f} |")
    return md + ["", "The prices are per byte (bandwidths, pin cost per chunk-sized piece) with "
                 "no fixed cost per copy or per pin, so the ratios come out the same at every "
                 "size.  The measured profile hints at such a cost (pinned copies are 1-2% "
                 "slower at 64 MiB than at 1 GiB: some 15-30 us per copy); it is not priced, "
                 "which flatters small allocations under every policy alike.", ""]


def hostmem_report(exp: Experiment, rows: list[VmRow], out: Path) -> list[str]:
    profiles = [load_hostmem_costs(p) for p in exp.hostmem_profiles]
    measured = gpu_profile.load(COSTS_DIR / f"{MEASURED}.toml")
    base = next((p for p in profiles if p.name == MEASURED), profiles[0])
    md = [f"Host-memory profiles: {', '.join(p.name for p in profiles)}.  Transfer "
          "histories (JSON): `history/`.", ""]
    md += _bandwidth(rows, measured, base)
    md += _thp(rows, profiles)
    md += _footprint(rows)
    md += _smart(rows, base)
    return md
