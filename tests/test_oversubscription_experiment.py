"""The oversubscription experiment (issue 17): its file, the model's side of its report
(QUANTUM against BAND on two VMs given 75% of the VRAM each) and the emulator's side read
from rows by the mediator's residency counter names."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gpuvm.device import regs
from gpuvm.experiment.config import REPO, ConfigError, load, parse
from gpuvm.experiment.execute import VmRow
from gpuvm.experiment.oversub_report import (EMULATOR, MODEL, oversubscription_report,
                                             points_for, row_residency, working_set_bytes)
from gpuvm.experiment.costs import load_costs
from gpuvm.experiment.report import write_report
from gpuvm.sim.residency import COUNTER_NAMES
from gpuvm.sim.stream_replay import VmStream

CONFIG = REPO / "experiments" / "oversubscription.toml"
# a loop-like VM: a short Init, then 200 doorbells of 2 ms kernels, each waited for
TRACE = VmStream("vm", (("x", 200, 12_000, 200), *(
    (("x", 2, 12_000, 200), ("d", 2_000_000), ("w", 2_000_000)) * 200)))


def loader(vm, mode, policy):
    return TRACE


def emulator_row(policy: str, vm: str, counts: dict[str, int] | None, passed: bool = True,
                 virtual_ms: float = 1000.0) -> VmRow:
    counters = {"engine.busy_ns": 400_000_000, **(counts or {})}
    ns = int(virtual_ms * 1e6)
    return VmRow("oversubscription", "2vm-75pct", "fv-opt", policy, 0, vm, "loop", "kvm",
                 passed, None if passed else "not run: no room", 0.5, 0.0,
                 {"Launch": ns // 1000}, {"Launch": ns}, {"Launch": ns}, counters,
                 {"Launch": counters}, {})


def test_the_experiment_file_gives_each_vm_75_percent_of_the_vgpu_vram():
    exp = load(CONFIG)
    assert exp.kind == "oversubscription" and set(exp.policies) == {"quantum", "band"}
    usable = exp.vram_mib * regs.MiB - 16 * regs.MiB
    for vm in exp.scenarios[0].vms:
        assert vm.mdev_type == "gpuvm-Q6000-75-OS" and not vm.partition
        # the 32 MiB buffer the VM copies, and the rest of what its page tables map
        assert working_set_bytes(vm, exp) == 33 * regs.MiB > vm.params[0]
    assert sum(working_set_bytes(vm, exp) for vm in exp.scenarios[0].vms) > usable


def test_the_runs_ask_for_the_vms_type_and_the_experiments_gpu():
    from gpuvm.experiment.execute import specs_for
    exp = load(CONFIG)
    assert [s.mdev_type for s in specs_for(exp.scenarios[0])] == ["gpuvm-Q6000-75-OS"] * 2
    with pytest.raises(ConfigError, match=r"vm\[0\]\.type: give a type or a partition"):
        parse(CONFIG.read_text().replace('working_set_mib = 33    # the model',
                                         'partition = { vram_mib = 16 }\n# the model', 1),
              "x.toml")


@pytest.mark.parametrize("text, message", [
    ('vram_mib = 0', "experiment.vram_mib: must be > 0"),
    ('vram_mib = "big"', "experiment.vram_mib: must be a int"),
])
def test_a_bad_vram_size_is_one_line(text, message):
    base = CONFIG.read_text().replace("vram_mib = 64", text)
    with pytest.raises(ConfigError, match=message):
        parse(base, "x.toml")


def test_working_set_is_a_checked_per_vm_key_defaulting_to_the_framebuffer():
    text = CONFIG.read_text()
    exp = parse(text.replace("working_set_mib = 33", "working_set_mib = 16"), "x.toml")
    assert working_set_bytes(exp.scenarios[0].vms[1], exp) == 16 * regs.MiB
    with pytest.raises(ConfigError, match=r"scenario\[0\]\.vm\[0\]\.working_set_mib: "
                                          r"must be > 0"):
        parse(text.replace("working_set_mib = 33", "working_set_mib = -1"), "x.toml")
    exp = parse(text.replace("working_set_mib = 33", "").replace(
        'type = "gpuvm-Q6000-75-OS"', 'type = "gpuvm-Q6000-2Q"'), "x.toml")
    two_q = 16 * regs.MiB  # of the 48 MiB for vGPUs, with shadow reserves
    assert working_set_bytes(exp.scenarios[0].vms[0], exp) == two_q


def model(points):
    return {p.policy: p for p in points if p.source == MODEL}


def test_in_the_model_quantum_moves_fewer_pages_than_band_and_finishes_first():
    exp = load(CONFIG)
    points = points_for(exp, exp.scenarios[0], [], load_costs(exp.cost_profile), loader)
    m = model(points)
    band, quantum = m["band"], m["quantum"]
    assert quantum.pages_moved < band.pages_moved
    assert quantum.counts["residency_switches"] < band.counts["residency_switches"]
    assert quantum.makespan_ms < band.makespan_ms
    for p in (band, quantum):
        assert p.counts["residency_bytes"] == p.pages_moved * regs.SMALL_PAGE
    # no emulator rows: the emulator's points say so
    assert all(p.makespan_ms is None for p in points if p.source == EMULATOR)


def test_with_room_for_both_working_sets_the_model_moves_nothing():
    exp = load(CONFIG)
    exp = replace(exp, scenarios=(replace(exp.scenarios[0], vms=tuple(
        replace(vm, working_set_mib=20) for vm in exp.scenarios[0].vms)),))
    for p in model(points_for(exp, exp.scenarios[0], [], load_costs(exp.cost_profile),
                              loader)).values():
        assert p.pages_moved == 0 and p.counts["residency_switches"] == 0


def test_emulator_counters_are_read_by_the_mediator_names():
    counts = {"residency_pages_in": 10, "residency_pages_out": 6,
              "residency_bytes": 16 * regs.SMALL_PAGE, "residency_switches": 2,
              "residency_switch_ns": 5000}
    assert row_residency(emulator_row("band", "A", counts)) == counts
    prefixed = {f"mediator.{k}": v for k, v in counts.items()}
    assert row_residency(emulator_row("band", "A", prefixed)) == counts
    assert row_residency(emulator_row("band", "A", None)) is None


def test_the_report_tables_both_sources_and_draws_the_figure(tmp_path: Path):
    exp = load(CONFIG)
    heavy = {"residency_pages_in": 9000, "residency_pages_out": 9000,
             "residency_bytes": 18000 * regs.SMALL_PAGE, "residency_switches": 150,
             "residency_switch_ns": 900_000_000}
    light = {k: v // 50 for k, v in heavy.items()}
    rows = [emulator_row("band", vm, heavy, virtual_ms=3000) for vm in "AB"] + \
        [emulator_row("quantum", vm, light, virtual_ms=1200) for vm in "AB"]
    md = "\n".join(oversubscription_report(exp, rows, tmp_path, load=loader))
    assert (tmp_path / "oversubscription-2vm-75pct.png").stat().st_size > 10_000
    assert "| BAND | fv-opt | emulator | 2/2 | 3,000.0 | 18,000 | 18,000 |" in md
    assert "**emulator**: BAND moved more pages than QUANTUM" in md
    assert "**model**: BAND moved more pages than QUANTUM" in md
    assert "and its makespan is longer" in md


def test_rows_without_residency_counters_say_the_emulator_does_not_switch(tmp_path):
    exp = load(CONFIG)
    rows = [emulator_row(p, vm, None) for p in ("band", "quantum") for vm in "AB"]
    md = "\n".join(oversubscription_report(exp, rows, tmp_path, load=loader))
    assert "no residency counters: this emulator build does not switch residency" in md
    assert "**emulator**" not in md and "**model**: BAND moved more" in md
    failed = [emulator_row("band", vm, None, passed=False) for vm in "AB"]
    md = "\n".join(oversubscription_report(exp, failed, tmp_path, load=loader))
    assert "| BAND | fv-opt | emulator | 0/2 | - |" in md and "not run: no room" in md


def test_write_report_dispatches_to_the_oversubscription_report(tmp_path, monkeypatch):
    import gpuvm.experiment.oversub_report as report_module
    monkeypatch.setattr(report_module, "default_trace_loader", lambda backend, profile: loader)
    exp = load(CONFIG)
    rows = [emulator_row(p, vm, None) for p in ("band", "quantum") for vm in "AB"]
    text = write_report(exp, rows, tmp_path).read_text()
    assert "## 2vm-75pct" in text and "| QUANTUM | fv-opt | model |" in text
    assert set(COUNTER_NAMES) <= set(row_residency(emulator_row(
        "band", "A", dict.fromkeys(COUNTER_NAMES, 1))))


def test_keys_left_unset_leave_an_experiments_fingerprint_as_it_was():
    """Run directories made before these keys existed still match their config."""
    from gpuvm.experiment.rundir import fingerprint

    old = fingerprint(load(REPO / "experiments" / "isolation.toml"))
    assert "vram_mib" not in old
    assert all(not {"working_set_mib", "mdev_type"} & set(vm)
               for s in old["scenarios"] for vm in s["vms"])
    new = fingerprint(load(CONFIG))
    assert new["vram_mib"] == 64
    assert new["scenarios"][0]["vms"][0]["mdev_type"] == "gpuvm-Q6000-75-OS"
