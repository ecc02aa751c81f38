"""Every screen fits 80 columns and stays whole when piped: each command runs with its
output to a pipe and COLUMNS=80, and no line may be longer or cut ('…')."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from dataclasses import asdict
from pathlib import Path

import pytest

from gpuvm import cli
from gpuvm.bench.cli import BENCHES
from gpuvm.run.observe import RunStatus, VgpuStatus

REPO = Path(__file__).resolve().parents[1]
MiB = 1 << 20


def piped(*argv: str, cwd: Path = REPO, env: dict[str, str] | None = None,
          module: str = "gpuvm") -> str:
    """stdout of `python -m MODULE ARGV` through a pipe at 80 columns, checked whole."""
    p = subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, text=True,
                       capture_output=True, timeout=600,
                       env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "80",
                            **(env or {})})
    assert p.returncode == 0, p.stderr
    too_long = [line for line in p.stdout.splitlines() if len(line) > 80]
    assert not too_long and "…" not in p.stdout, p.stdout
    return p.stdout


@pytest.mark.kvm
@pytest.mark.slow
def test_a_probe_without_parameters_prints_its_verdict_within_80_columns() -> None:
    # (every table of `gpuvm run`, --detail's too, in all seven modes at 80 columns:
    # tests/test_run_ux.py's test_mode_all_piped_and_at_80_columns...)
    probe = piped("run", "--vm", "bench=probe", "--mode", "fv-opt")
    assert "faulted=" in probe and "vector=channel_pt" in probe


@pytest.mark.kvm
@pytest.mark.slow
def test_an_experiment_ends_with_a_compact_summary_and_the_reports_path(tmp_path) -> None:
    out = piped("experiment", "quick", cwd=tmp_path)
    lines = out.strip().splitlines()
    report = tmp_path / "results" / "quick" / "latest" / "report.md"
    assert lines[-1].startswith("full report: ") and report.is_file()
    assert (tmp_path / lines[-1].removeprefix("full report: ")).resolve() == report.resolve()
    assert "vecadd" in out and "fv-opt" in out and "x native" in out
    assert "|---" not in out  # the Markdown stays in the report


def test_smi_fits_80_columns_with_an_experiment_run_shown(tmp_path) -> None:
    vgpus = [VgpuStatus(f"vm{i}", str(uuid.uuid4()), "gpuvm-Q6000-8Q", "fv-opt", "mmul",
                        123 * MiB, 512 * MiB, 16, 0.42, 0.25, 12.5e6, 12345.0, 1234, "Launch")
             for i in range(4)]
    status = RunStatus(os.getpid(), 0.0, 0.0, "fv-opt", "band", 0.5, 0.97, vgpus,
                       label="experiment scaling: 4vm rep 2")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / f"{os.getpid()}-1.json").write_text(json.dumps(asdict(status)))
    out = piped("smi", env={"GPUVM_STATE_DIR": str(tmp_path)})
    assert "experiment scaling: 4vm rep 2" in " ".join(out.split())
    for v in vgpus:
        assert f"{v.vm} " in out
    assert "123/512" in out and "12.5" in out and "12,345" in out and "Launch" in out


def test_mdev_types_and_list_fit_80_columns(tmp_path) -> None:
    env = {"GPUVM_STATE_DIR": str(tmp_path)}
    out = piped("mdev", "types", env=env)
    assert "gpuvm-Q6000-8Q" in out and "max_instance=8" in out
    # the longest line: the longest type id, the longest mode
    piped("mdev", "create", "gpuvm-Q6000-150-OS", "--mode", "pv-naive", env=env)
    assert "gpuvm-Q6000-150-OS pv-naive" in piped("mdev", "list", env=env)


def test_the_isolation_model_fits_80_columns(tmp_path) -> None:
    # the widest of the model's tables (a table per scenario): the longest scenario and VM
    # names, every policy; tests/test_sim_model.py runs every scenario
    out = piped("--scenario", "staggered-4vm", "--out", str(tmp_path), module="gpuvm.sim")
    for words in ("staggered-4vm", "quantum", "VM3-medium", "waits/"):
        assert words in out


@pytest.mark.kvm
@pytest.mark.slow
def test_domain_list_fits_80_columns(state, gpuvm_cli) -> None:
    # the host made in this process (mdevs, domains, a finished start); the screen piped
    for name, uid in (("madd", "9284dd17-6194-58a0-866a-2c207a7de3a6"),
                      ("mmul", "80bfa6c6-bae3-548f-9693-6f50791b76bc")):
        assert gpuvm_cli("mdev", "create", "gpuvm-Q6000-8Q", "--uuid", uid, "--mode",
                         "fv-opt")[0] == 0
        domain = REPO / "experiments" / "domains" / f"{name}.xml"
        assert gpuvm_cli("domain", "define", str(domain))[0] == 0
    rc, _, err = gpuvm_cli("domain", "start", "madd")
    assert rc == 0, err
    out = piped("domain", "list", env={"GPUVM_STATE_DIR": str(state)})
    words = " ".join(out.split())
    for w in ("Name", "Last result", "madd", "mmul", "gpuvm-Q6000-8Q", "PASS n=256"):
        assert w in words, out


@pytest.mark.slow
def test_smi_shows_the_runs_of_an_experiment(tmp_path) -> None:
    (tmp_path / "busy.toml").write_text("""
[experiment]
name = "busy"
modes = ["fv-opt"]
backend = "inproc"
[[scenario]]
name = "pair"
[[scenario.vm]]
name = "vm"
benchmark = "loop"
params = [10000000, 1000]
count = 2
""")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUVM_STATE_DIR": str(tmp_path / "s")}
    run = subprocess.Popen([sys.executable, "-m", "gpuvm", "experiment", "busy.toml"],
                           cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    seen = []
    try:
        while run.poll() is None and not seen:
            p = subprocess.run([sys.executable, "-m", "gpuvm", "smi", "--json"], env=env,
                               capture_output=True, text=True, timeout=60)
            seen = [s for s in json.loads(p.stdout) if len(s["vgpus"]) == 2]
    finally:
        run.terminate()
        run.wait(60)
    assert seen, "smi never showed the experiment's run"
    assert seen[0]["label"] == "experiment busy: pair rep 0"
    assert {v["vm"] for v in seen[0]["vgpus"]} == {"vm0", "vm1"}


@pytest.mark.parametrize("argv, words", [
    (["bench", "sim", "--vms", "4,8", "--seconds", "2"], ["events/s", "target <= 2x"]),
])
def test_bench_tables_fit_80_columns(argv: list[str], words: list[str]) -> None:
    out = piped(*argv)
    for w in words:
        assert w in " ".join(out.split())


def test_the_list_of_shipped_experiments_fits_80_columns(tmp_path) -> None:
    out = piped("experiment", "--list", cwd=tmp_path)
    names = {line.split()[0] for line in out.splitlines()[2:] if line[:1].strip()}
    assert {"default", "paper", "isolation", "quick"} <= names


@pytest.mark.parametrize("argv, words", [
    # (not built: its widest verdict, and no cross-check, which test_pt_footprint runs)
    (["calibrate", "--pt-footprint", "--no-cross-check"], ["2,097,152", "16.0005",
                                                           "not", "built"]),
    (["calibrate", "--show", "experiments/costs/gpu-h200.toml"],
     ["copy bandwidth", "chunked pin/unpin", "50.98 [50.26–51.15]"]),
])
def test_calibrate_tables_fold_within_80_columns(argv: list[str], words: list[str]) -> None:
    out = piped(*argv)
    for w in words:
        assert w in " ".join(out.split())


def test_every_help_fits_80_columns(monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # what argparse wraps to
    helps = [[], *([c] for c in cli.COMMANDS), *(["bench", b] for b in BENCHES)]
    for argv in helps:
        with pytest.raises(SystemExit):
            cli.main([*argv, "--help"])
        out = capsys.readouterr().out
        assert "usage: gpuvm" in out and max(map(len, out.splitlines())) <= 80, (argv, out)
