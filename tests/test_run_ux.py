"""What a user of `gpuvm run` sees: a summary that stays whole when piped and at 80
columns, counts that depend only on (benchmark, size, mode, type), one-line errors,
`gpuvm smi` during a run, and a trace Perfetto opens."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from gpuvm.experiment.execute import row_from_dict, without_wall_clock
from gpuvm.run.tables import render_summary
from gpuvm.trace import rules

REPO = Path(__file__).resolve().parents[1]
HEADERS = ("VM/mode/phase", "Model ms", "xNat", "Dev ms", "Wall ms", "Traps", "Syncs",
           "Hcalls")


def gpuvm(*argv: str, env: dict[str, str] | None = None, timeout: float = 600
          ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuvm", *argv], cwd=REPO, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# ------------------------------------------------------------------ one-line errors
@pytest.mark.parametrize("argv, culprit", [
    (["run", "-b", "mmul", "--timeout", "0"], "--timeout"),
    (["run", "-b", "mmul", "--timeout", "-1"], "--timeout"),
    (["run", "-b", "mmul", "--size", "1e6"], "write 1000000"),
    (["run", "-b", "mmul", "--size", "0"], "size 0"),
    (["run", "-b", "mmul", "--time-scale", "0"], "--time-scale"),
    (["run", "-b", "mmul", "--vram-mib", "0"], "--vram-mib"),
    (["run", "--vm", "bench=mmul,colour=red"], "no VM key 'colour'"),
    (["run", "--config", "experiments/default.toml", "-b", "mmul"], "-benchmark"),
    (["run", "-b", "nope"], "no benchmark 'nope'"),
])
def test_a_bad_value_gets_one_line_naming_it(argv: list[str], culprit: str) -> None:
    p = gpuvm(*argv)
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuvm: error:"), p.stderr
    assert culprit in lines[0]


def test_version_help_and_verbose_after_the_subcommand() -> None:
    v = gpuvm("--version")
    assert v.returncode == 0 and v.stdout.startswith("gpuvm ")
    h = gpuvm("--help")
    assert "smi" in h.stdout and "vms" in h.stdout
    rh = gpuvm("run", "--help")
    for flag in ("--backend", "--time-scale", "--vram-mib", "--vm", "--trace"):
        assert flag in rh.stdout
    # -v after the subcommand parses (it would be "unrecognized arguments" otherwise)
    p = gpuvm("run", "-v", "-b", "nope")
    assert "unrecognized" not in p.stderr and "no benchmark 'nope'" in p.stderr


# ------------------------------------------------------------------ exit status
def test_help_states_the_exit_statuses() -> None:
    for argv in (["--help"], ["run", "--help"], ["experiment", "--help"]):
        out = " ".join(gpuvm(*argv).stdout.split())
        assert "1 a VM failed" in out and "2 bad input" in out and "130 / 143" in out, argv


@pytest.mark.kvm
def test_sigterm_stops_a_run_with_143(tmp_path) -> None:
    env = {**os.environ, "GPUVM_STATE_DIR": str(tmp_path)}
    run = subprocess.Popen([sys.executable, "-m", "gpuvm", "run", "--mode", "fv-opt",
                            "--vm", "bench=loop,params=10000000:100000"], cwd=REPO, env=env,
                           text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob("runs/*.json")) and time.monotonic() < deadline:
        assert run.poll() is None, run.communicate()
        time.sleep(0.05)  # until the guest runs (its status is published)
    run.terminate()
    _, err = run.communicate(timeout=60)
    assert run.returncode == 143, err
    assert err.strip().splitlines()[-1] == "gpuvm: interrupted by SIGTERM"


# ------------------------------------------------------------------ the summary
@pytest.mark.kvm
@pytest.mark.slow
def test_mode_all_piped_and_at_80_columns_is_whole_and_native_counts_equal(tmp_path) -> None:
    # --detail too: every table of `gpuvm run` is whole at 80 columns with all seven modes
    piped = gpuvm("run", "-b", "mmul", "--size", "64", "--mode", "all", "--detail", "--out",
                  str(tmp_path), env={"COLUMNS": "80"})
    assert piped.returncode == 0, piped.stderr
    assert "…" not in piped.stdout
    assert max(len(line) for line in piped.stdout.splitlines()) <= 80, piped.stdout
    for words in (*HEADERS, "Guest says", "maxerr=", "(fv-opt, kvm) PASS", "PTEs scanned",
                  "Copied bytes", "bar0.pramin", "modes compared", "Remap maps",
                  "driver: pte_writes="):
        assert words in piped.stdout
    rows = [row_from_dict(json.loads(line))
            for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r.mode for r in rows] == ["native", "fv", "fv+remap", "fv+lazy", "fv-opt",
                                      "pv-naive", "pv"]

    from rich.console import Console
    console = Console(width=80, record=True, file=open(os.devnull, "w"))
    for renderable in render_summary(rows, "xen-2014"):
        console.print(renderable)
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    assert all(h in text for h in HEADERS)
    for r in rows:
        assert f"{r.vm} {r.mode}" in text

    # native alone gets the same GPU (the default type's), so the same counts
    alone = gpuvm("run", "-b", "mmul", "--size", "64", "--mode", "native", "--json")
    assert alone.returncode == 0, alone.stderr
    [row] = [row_from_dict(d) for d in json.loads(alone.stdout)]
    assert without_wall_clock(row) == without_wall_clock(rows[0])


# ------------------------------------------------------------------ smi
@pytest.mark.kvm
@pytest.mark.slow
def test_smi_during_a_four_vm_run_shows_four_vgpus_summing_to_the_engine(tmp_path) -> None:
    env = {"GPUVM_STATE_DIR": str(tmp_path)}
    argv = [sys.executable, "-m", "gpuvm", "run", "--mode", "fv-opt",
            *(a for _ in range(4) for a in ("--vm", "bench=loop,params=10000000:300"))]
    run = subprocess.Popen(argv, cwd=REPO, env={**os.environ, **env},
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        deadline = time.monotonic() + 300
        while run.poll() is None and time.monotonic() < deadline:
            p = gpuvm("smi", "--json", env=env)
            assert p.returncode == 0, p.stderr
            for status in json.loads(p.stdout):
                if len(status["vgpus"]) == 4 and (status["engine_utilisation"] or 0) > 0.2:
                    seen.append(status)
            if len(seen) >= 2:
                break
            time.sleep(0.3)
    finally:
        run.wait(300)
    assert run.returncode == 0, run.stderr
    assert seen, "no status with four vGPUs and a busy engine"
    for status in seen:
        vgpus = status["vgpus"]
        assert len({v["uuid"] for v in vgpus}) == 4
        assert {v["type"] for v in vgpus} == {vgpus[0]["type"]}
        assert all(0 < v["vram_used"] < v["vram_total"] for v in vgpus)  # resident pages
        total = sum(v["utilisation"] for v in vgpus)
        # the engine's own count vs its vGPUs' channels' counts, read under the GPU's lock
        # at one moment (the slack only covers float rounding and a VM's first window)
        assert total == pytest.approx(status["engine_utilisation"], abs=0.05)
    table = gpuvm("smi", env=env)
    assert table.returncode == 0 and "no gpuvm run" in table.stdout  # the file is gone


def test_smi_removes_the_status_of_a_process_that_is_gone(tmp_path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    p = subprocess.Popen(["true"])
    p.wait()
    (runs / f"{p.pid}-1.json").write_text(json.dumps({"pid": p.pid, "started": 0,
                                                       "vgpus": []}))
    out = gpuvm("smi", "--json", env={"GPUVM_STATE_DIR": str(tmp_path)})
    assert json.loads(out.stdout) == []
    assert not list(runs.iterdir())


# ------------------------------------------------------------------ trace
def _trace_processor_binary() -> str | None:
    """A trace_processor_shell already on this machine (GPUVM_TRACE_PROCESSOR, else on
    PATH), or None.  Never the perfetto package's own: it downloads its prebuilt on first
    use, and tests never reach the network."""
    return os.environ.get("GPUVM_TRACE_PROCESSOR") or shutil.which("trace_processor_shell")


@pytest.fixture(scope="module")
def band_trace(tmp_path_factory) -> tuple[Path, dict]:
    """Two mmul VMs under BAND, traced: the trace file and the run's rows by VM."""
    trace = tmp_path_factory.mktemp("trace") / "t.json"
    p = gpuvm("run", "--vm", "bench=mmul,size=64", "--vm", "bench=mmul,size=64",
              "--mode", "fv-opt", "--policy", "band", "--trace", str(trace), "--json")
    assert p.returncode == 0, p.stderr
    assert f"trace: {trace} (open it in ui.perfetto.dev)" in p.stderr.splitlines()
    rows = {r.vm: r for r in (row_from_dict(d) for d in json.loads(p.stdout))}
    return trace, rows


def _tracks(events: list[dict]) -> tuple[dict[int, str], dict[tuple[int, int], str]]:
    processes = {e["pid"]: e["args"]["name"] for e in events
                 if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    return processes, threads


@pytest.mark.kvm
@pytest.mark.slow
def test_a_two_vm_band_trace_has_a_process_per_vm_and_the_runs_counts(band_trace) -> None:
    trace, rows = band_trace
    loaded = json.loads(trace.read_text())
    assert rules.problems(loaded) == []  # what Perfetto's importer needs, checked offline
    events = loaded["traceEvents"]
    processes, threads = _tracks(events)
    assert sorted(processes.values())[0] == "GPU" and len(processes) == 3
    slices = Counter((e["pid"], e["tid"]) for e in events if e["ph"] == "X")
    dispatches = Counter(e["args"]["dispatch"] for e in events if e["ph"] == "i")
    for pid, name in processes.items():
        if name == "GPU":
            continue
        vm = name.split()[0]
        row = rows[vm]
        assert threads[(pid, 1)] == "vCPU" and threads[(pid, 2)] == "engine"
        assert slices[(pid, 1)] == len(row.wall_ns)  # one slice per phase
        assert slices[(pid, 2)] == len(row.busy)  # one per submission the engine ran
        assert dispatches[vm] == len(row.busy)
        last = {e["name"]: e["args"]["value"] for e in events
                if e["ph"] == "C" and e["pid"] == pid}
        assert last["shadow syncs"] == row.counters.get("shadow.syncs", 0)
        assert last["hypercalls"] == row.counters.get("hcall.calls", 0)
        assert {"utilisation", "credit ms", "channels"} <= set(last)


@pytest.mark.kvm
@pytest.mark.slow
def test_perfetto_reads_the_trace_back_where_its_shell_is_installed(band_trace) -> None:
    binary = _trace_processor_binary()
    if binary is None:
        pytest.skip("trace_processor_shell is not on this machine (set "
                    "GPUVM_TRACE_PROCESSOR or put it on PATH); the format's rules were "
                    "checked without it")
    trace, rows = band_trace
    processes, threads = _tracks(json.loads(trace.read_text())["traceEvents"])
    _read_back_with_trace_processor(trace, binary, rows, processes, threads)


def _read_back_with_trace_processor(trace: Path, binary: str, rows: dict,
                                    processes: dict[int, str],
                                    threads: dict[tuple[int, int], str]) -> None:
    """Perfetto's own importer reads the trace: it must see the same processes and
    tracks, put every slice on its thread's own track (one that does not nest is moved
    to a "thread_overlapping_slice" track and counted as an error in `stats`), keep the
    counters' last values, and record no import error -- so what the UI shows is what the
    run counted."""
    from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig

    tp = TraceProcessor(trace=str(trace), config=TraceProcessorConfig(bin_path=binary))
    try:
        def query(sql: str) -> list:
            return list(tp.query(sql))

        errors = query("select name, idx, value from stats where value > 0 "
                       "and severity in ('error', 'data_loss')")
        assert not errors, [(r.name, r.idx, r.value) for r in errors]
        seen = {r.pid: r.name for r in query(
            "select pid, name from process where name is not null")}
        assert seen == processes
        seen_threads = {(r.pid, r.tid): r.name for r in query(
            "select p.pid, t.tid, t.name from thread t join process p using (upid) "
            "where t.name is not null")}
        assert seen_threads == threads
        per_track = {(r.pid, r.tid): r.n for r in query(
            "select p.pid, t.tid, count(*) as n from slice s "
            "join thread_track tt on s.track_id = tt.id join thread t using (utid) "
            "join process p using (upid) where tt.type = 'thread_execution' "
            "group by p.pid, t.tid")}
        expected: dict[tuple[int, int], int] = {}
        for pid, name in processes.items():
            if name == "GPU":
                expected[(pid, 1)] = sum(len(r.busy) for r in rows.values())
                continue
            row = rows[name.split()[0]]
            expected[(pid, 1)] = len(row.wall_ns)
            expected[(pid, 2)] = len(row.busy)
        assert per_track == expected
        assert query("select count(*) as n from slice")[0].n == sum(expected.values())
        last: dict[tuple[int, str], float] = {}
        for r in query("select p.pid, ct.name, c.value from counter c "
                       "join process_counter_track ct on c.track_id = ct.id "
                       "join process p using (upid) order by c.ts"):
            last[(r.pid, r.name)] = r.value
        for pid, name in processes.items():
            if name == "GPU":
                continue
            row = rows[name.split()[0]]
            # Chrome JSON counters become one track per argument: "<name> <arg>"
            assert last[(pid, "shadow syncs value")] == row.counters.get("shadow.syncs", 0)
            assert last[(pid, "hypercalls value")] == row.counters.get("hcall.calls", 0)
            assert {"utilisation value", "credit ms value", "channels value"} <= {
                n for (p_, n) in last if p_ == pid}
    finally:
        tp.close()
