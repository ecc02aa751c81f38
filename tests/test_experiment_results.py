"""Results you can trust: rows on disk are whole, a run directory says whether it is
complete, `latest` only ever names a complete run, an interrupted experiment resumes to
the rows an uninterrupted one has, `--report` never replaces a report by a worse one, and
failures and bad paths are visible in the exit status and one line.

The interruption is real: the CLI runs in a subprocess with in-process guests and gets
SIGTERM (or SIGINT) after its first rows are on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuvm.cli import main as gpuvm
from gpuvm.experiment.config import load
from gpuvm.experiment.execute import execute, without_wall_clock
from gpuvm.experiment.interrupt import StopSignals
from gpuvm.experiment.rundir import COMPLETE, MANIFEST, ROWS, RunDir, RunDirError, plan

REPO = Path(__file__).resolve().parents[1]

# An idle run per mode (fast: the first rows appear early), then two VMs running short
# kernels for about half a second, so a signal lands while guests are running.
INTERRUPTIBLE = """
[experiment]
name = "trust"
modes = ["native", "fv", "pv"]
backend = "inproc"
output = "{out}"

[[scenario]]
name = "idle"
[[scenario.vm]]
name = "vm"
benchmark = "idle"

[[scenario]]
name = "pair"
[[scenario.vm]]
name = "loop"
benchmark = "loop"
params = [2000000, 250]
[[scenario.vm]]
name = "vecadd"
benchmark = "vecadd"
params = [1024]
"""

# Two quick runs, the second of two VMs; pv, whose guests set up their page tables in a
# few hypercalls, where fv would rescan them for seconds: these tests are about rows,
# reports and run directories, which every mode writes alike.
QUICK = """
[experiment]
name = "quick"
modes = ["pv"]
backend = "inproc"
output = "{out}"

[[scenario]]
name = "one"
[[scenario.vm]]
name = "vm"
benchmark = "idle"

[[scenario]]
name = "two"
[[scenario.vm]]
name = "a"
benchmark = "idle"
[[scenario.vm]]
name = "b"
benchmark = "vecadd"
params = [256]
"""


def write_config(tmp: Path, text: str, name: str = "exp.toml", **changes: str) -> Path:
    for old, new in changes.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp / name
    path.write_text(text.replace("{out}", str(tmp / "results")))
    return path


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gpuvm", "experiment", *map(str, args)],
                          capture_output=True, text=True, cwd=REPO, timeout=120)


def rows_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / ROWS).read_text().splitlines()]


def run_dirs(base: Path) -> list[Path]:
    return sorted(p for p in base.iterdir() if not p.is_symlink() and not p.name.startswith("."))


def error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuvm: error: "), stderr
    return lines[0]


def interrupt(config: Path, sig: int) -> tuple[subprocess.CompletedProcess, Path, float]:
    """Start the experiment, send `sig` once its first row is on disk; returns the
    finished process, its run directory and how long it took to stop after the signal."""
    base = config.parent / "results"
    before = set(run_dirs(base)) if base.exists() else set()
    proc = subprocess.Popen([sys.executable, "-m", "gpuvm", "experiment", str(config)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    deadline = time.monotonic() + 60
    run = None
    while time.monotonic() < deadline:
        new = set(run_dirs(base)) - before if base.exists() else set()
        if new:
            run = new.pop()
            if (run / ROWS).exists() and (run / ROWS).read_bytes().count(b"\n") >= 1:
                break
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail("no row appeared within 60 s")
    proc.send_signal(sig)
    t0 = time.monotonic()
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), run, \
        time.monotonic() - t0


# --------------------------------------------------------------------- the whole story
def test_sigterm_then_resume_gives_the_rows_of_an_uninterrupted_run(tmp_path):
    config = write_config(tmp_path, INTERRUPTIBLE)
    base = tmp_path / "results"
    planned = len(plan(load(config)))

    whole = cli(config)
    assert whole.returncode == 0, whole.stderr
    [uninterrupted] = run_dirs(base)
    assert (uninterrupted / COMPLETE).is_file()
    assert (base / "latest").resolve() == uninterrupted.resolve()

    proc, run, stop_s = interrupt(config, signal.SIGTERM)
    assert proc.returncode == 143, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("gpuvm: interrupted by SIGTERM: ") and \
        f"--resume {run}" in last, proc.stderr
    assert "Traceback" not in proc.stderr
    assert stop_s < 15  # the running guests were stopped, not waited for
    # incomplete, marked so, and `latest` still names the complete run
    assert not (run / COMPLETE).exists() and (run / MANIFEST).is_file()
    assert (base / "latest").resolve() == uninterrupted.resolve()
    partial = (run / ROWS).read_bytes()
    assert partial.endswith(b"\n")
    recorded = rows_of(run)
    assert recorded and len({(r["scenario"], r["mode"]) for r in recorded}) < planned

    # its report, rebuilt now, says it is incomplete (and the command fails)
    rebuilt = cli(config, "--report", run)
    assert rebuilt.returncode == 1
    assert "**INCOMPLETE**" in (run / "report.md").read_text()
    assert f"--resume {run}" in rebuilt.stderr

    resumed = cli(config, "--resume", run)
    assert resumed.returncode == 0, resumed.stderr
    assert (run / COMPLETE).is_file()
    assert (base / "latest").resolve() == run.resolve()
    after = (run / ROWS).read_bytes()
    assert after.startswith(partial)  # finished runs kept byte for byte: not run again
    assert [without_wall_clock(r) for r in rows_of(run)] == \
        [without_wall_clock(r) for r in rows_of(uninterrupted)]
    report = (run / "report.md").read_text()
    assert "INCOMPLETE" not in report and "Runs: 9 of 9 planned VM runs, 9 passed" in report


def test_sigint_stops_the_same_way(tmp_path):
    config = write_config(tmp_path, QUICK, **{'modes = ["pv"]': 'modes = ["fv", "pv"]\n'
                                                                'repetitions = 3'})
    proc, run, _ = interrupt(config, signal.SIGINT)
    if proc.returncode == 0:
        pytest.skip("the experiment finished before the signal arrived")
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("gpuvm: interrupted by SIGINT: ")
    assert not (run / COMPLETE).exists()
    assert not (run.parent / "latest").exists()
    rows = rows_of(run)  # whole runs only: every VM of each recorded run is there
    runs = {(r["scenario"], r["mode"], r["rep"]) for r in rows}
    assert len(rows) == sum(1 if s == "one" else 2 for s, _, _ in runs)


# ------------------------------------------------------------------- rows on disk
def test_a_torn_last_row_and_a_cut_run_are_dropped_on_resume(tmp_path, capsys):
    config = write_config(tmp_path, QUICK)
    exp = load(config)
    run = RunDir.create(exp)
    execute(exp, run)  # both runs; now pretend a crash cut the file
    lines = run.rows_path.read_bytes().splitlines(keepends=True)
    reference = [without_wall_clock(json.loads(line)) for line in lines]
    assert len(lines) == 3
    run.rows_path.write_bytes(lines[0] + lines[1] + lines[2][:40])

    loaded = run.read_rows()
    assert len(loaded.rows) == 2 and "torn last row" in loaded.warnings[0]

    run.release()  # the writer is gone, as after a crash
    assert gpuvm(["experiment", str(config), "--resume", str(run.path)]) == 0
    err = capsys.readouterr().err
    assert "gpuvm: warning: " in err and "torn last row" in err
    assert "dropped 1 row(s) of a run that did not finish" in err
    assert [without_wall_clock(r) for r in rows_of(run.path)] == reference
    assert run.complete


def test_a_damaged_row_in_the_middle_is_an_error(tmp_path):
    exp = load(write_config(tmp_path, QUICK))
    run = RunDir.create(exp)
    run.rows_path.write_bytes(b'{"not": "a row"}\n{"scenario": "one"}\n')
    with pytest.raises(RunDirError, match=r"runs.jsonl:1: not a row"):
        run.read_rows()


def test_every_row_is_one_whole_line_as_it_is_written(tmp_path):
    exp = load(write_config(tmp_path, QUICK))
    run = RunDir.create(exp)
    seen: list[int] = []

    def progress(line: str) -> None:  # called after each run's rows are appended
        data = run.rows_path.read_bytes()
        assert data.endswith(b"\n")
        seen.append(len(data.splitlines()))
    execute(exp, run, progress=progress)
    assert seen == [1, 3]


# ------------------------------------------------------------------- exit status
def test_an_experiment_whose_every_run_fails_exits_non_zero(tmp_path, capsys):
    # 1000 channels: the mediator refuses the partition, so no run can be made at all
    refused = 'partition = { channels = 1000 }\n'
    config = write_config(tmp_path, QUICK, **{'name = "vm"\n': 'name = "vm"\n' + refused,
                                              'name = "a"\n': 'name = "a"\n' + refused})
    assert gpuvm(["experiment", str(config)]) == 1
    err = capsys.readouterr().err
    assert "NOT RUN" in err and "3 of 3 VM run(s) failed" in err
    [run] = run_dirs(tmp_path / "results")
    report = (run / "report.md").read_text()
    assert "Runs: 3 of 3 planned VM runs, 0 passed" in report
    assert "not run: " in report and "channels must be" in report
    assert (run / COMPLETE).is_file()  # every planned run was tried


def test_one_failing_vm_makes_the_command_fail_after_writing_everything(tmp_path, capsys):
    config = write_config(tmp_path, QUICK, **{'name = "b"': 'name = "b"\ninject = "bad-method"'})
    assert gpuvm(["experiment", str(config)]) == 1
    assert "1 of 3 VM run(s) failed" in capsys.readouterr().err
    [run] = run_dirs(tmp_path / "results")
    assert len(rows_of(run)) == 3 and (run / COMPLETE).is_file()
    assert (tmp_path / "results" / "latest").resolve() == run.resolve()


def test_run_with_config_records_a_complete_run(tmp_path, capsys):
    config = write_config(tmp_path, QUICK)
    assert gpuvm(["run", "--config", str(config)]) == 0
    [run] = run_dirs(tmp_path / "results")
    assert (run / COMPLETE).is_file() and len(rows_of(run)) == 3


# ------------------------------------------------------------------- --report
@pytest.fixture()
def finished(tmp_path, capsys):
    config = write_config(tmp_path, QUICK)
    assert gpuvm(["experiment", str(config)]) == 0
    capsys.readouterr()
    [run] = run_dirs(tmp_path / "results")
    return config, run


def test_report_with_another_config_is_refused_and_keeps_the_report(finished, tmp_path, capsys):
    config, run = finished
    before = (run / "report.md").read_bytes()
    changed = write_config(tmp_path, QUICK, "changed.toml", **{"[256]": "[512]"})
    other = write_config(tmp_path, QUICK, "other.toml", **{'name = "quick"': 'name = "slow"'})
    assert gpuvm(["experiment", str(changed), "--report", str(run)]) == 2
    line = error_line(capsys.readouterr().err)
    assert "another configuration of 'quick'" in line and "changed.toml" in line
    assert gpuvm(["experiment", str(other), "--report", str(run)]) == 2
    assert "holds experiment 'quick', not 'slow'" in error_line(capsys.readouterr().err)
    assert (run / "report.md").read_bytes() == before
    # the description and the cost profile are not part of the configuration's identity
    worded = write_config(tmp_path, QUICK, "worded.toml",
                          **{'name = "quick"': 'name = "quick"\ndescription = "new words"'})
    assert gpuvm(["experiment", str(worded), "--report", str(run)]) == 0
    assert "new words" in (run / "report.md").read_text()


def test_report_never_replaces_one_built_from_more_rows(finished, capsys):
    config, run = finished
    before = (run / "report.md").read_bytes()
    lines = (run / ROWS).read_bytes().splitlines(keepends=True)
    (run / ROWS).write_bytes(b"".join(lines[:-1]))
    assert gpuvm(["experiment", str(config), "--report", str(run)]) == 2
    line = error_line(capsys.readouterr().err)
    assert "was built from 3 rows but runs.jsonl has 2; not overwritten" in line
    assert (run / "report.md").read_bytes() == before
    (run / ROWS).write_bytes(b"".join(lines))
    assert gpuvm(["experiment", str(config), "--report", str(run)]) == 0
    assert (run / "report.md").read_bytes() == before


def test_resume_refuses_a_complete_run_and_another_backend(finished, capsys):
    config, run = finished
    assert gpuvm(["experiment", str(config), "--resume", str(run)]) == 2
    assert "already complete; nothing to resume" in error_line(capsys.readouterr().err)
    (run / COMPLETE).unlink()
    assert gpuvm(["experiment", str(config), "--backend", "kvm", "--resume", str(run)]) == 2
    assert "was run with backend 'inproc'" in error_line(capsys.readouterr().err)
    # nothing left to run: resuming only writes the report and marks it complete
    assert gpuvm(["experiment", str(config), "--resume"]) == 0
    assert (run / COMPLETE).is_file() and len(rows_of(run)) == 3


# ------------------------------------------------------------------- one writer
def test_a_second_writer_of_a_run_directory_is_refused(finished, capsys):
    config, run = finished
    (run / COMPLETE).unlink()
    writer = RunDir.open(run).hold()  # as a first `--resume` of it does, while it runs
    try:
        # another process (a second resume, a report's rebuild) gets one line, and the
        # rows stay as they were: no run is appended twice
        second = cli(config, "--resume", run)
        assert second.returncode == 2
        line = error_line(second.stderr)
        assert f"pid {os.getpid()}" in line and "is writing it" in line
        report = cli(config, "--report", run)
        assert report.returncode == 2 and "is writing it" in error_line(report.stderr)
        assert len(rows_of(run)) == 3
    finally:
        writer.release()
    assert gpuvm(["experiment", str(config), "--resume", str(run)]) == 0  # free again
    assert (run / COMPLETE).is_file() and len(rows_of(run)) == 3


def test_report_refuses_rows_that_repeat_a_run(finished, capsys):
    config, run = finished
    before = (run / "report.md").read_bytes()
    lines = (run / ROWS).read_bytes().splitlines(keepends=True)
    (run / ROWS).write_bytes(b"".join(lines + lines[1:2]))  # two writers appended run 2
    assert gpuvm(["experiment", str(config), "--report", str(run)]) == 2
    line = error_line(capsys.readouterr().err)
    assert "row 4 repeats the run of VM a in scenario two, mode pv" in line
    assert (run / "report.md").read_bytes() == before
    (run / COMPLETE).unlink()
    assert gpuvm(["experiment", str(config), "--resume", str(run)]) == 2
    assert "row 4 repeats" in error_line(capsys.readouterr().err)


# ------------------------------------------------------------------- bad paths
def test_missing_or_wrong_paths_are_one_line(tmp_path, capsys):
    config = write_config(tmp_path, QUICK)
    plain = tmp_path / "plain"
    plain.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("x")
    cases = [
        (["--report", str(tmp_path / "absent")], "absent: no such run directory"),
        (["--report", str(afile)], "afile: not a directory"),
        (["--report", str(plain)], "plain: not a run directory of `gpuvm experiment`"),
        (["--resume", str(tmp_path / "absent")], "absent: no such run directory"),
        (["--resume"], "no interrupted run of 'quick' with this configuration"),
    ]
    for args, message in cases:
        assert gpuvm(["experiment", str(config), *args]) == 2, args
        assert message in error_line(capsys.readouterr().err), args
    assert gpuvm(["experiment", str(tmp_path / "absent.toml")]) == 2
    assert "absent.toml: cannot read" in error_line(capsys.readouterr().err)
    # an output path that is a file
    blocked = write_config(tmp_path, QUICK, "blocked.toml",
                           **{'output = "{out}"': f'output = "{afile}/results"'})
    assert gpuvm(["experiment", str(blocked)]) == 2
    assert "cannot create a run directory" in error_line(capsys.readouterr().err)


# ------------------------------------------------------------------- signals
def test_a_stop_signal_waits_for_the_rows_being_written():
    previous = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        with pytest.raises(KeyboardInterrupt):
            with stop.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)
                written = True  # reached: the signal did not cut the block
        assert written and stop.exit_status == 143
    assert signal.getsignal(signal.SIGTERM) is previous


def test_a_stop_python_ignored_is_raised_again_before_the_next_rows(monkeypatch):
    """A signal's KeyboardInterrupt raised inside a weakref callback is ignored by Python:
    the stop still comes, at the next rows, and Python's "Exception ignored" report of
    it is not passed on (any other is)."""
    import weakref
    from types import SimpleNamespace

    reported = []
    monkeypatch.setattr(sys, "unraisablehook", lambda info: reported.append(info.exc_type))

    class Guest:
        pass

    with StopSignals() as stop:
        guest = Guest()
        ref = weakref.ref(guest, lambda ref: os.kill(os.getpid(), signal.SIGTERM) or
                          time.sleep(0.05))
        del guest  # the callback runs here; the KeyboardInterrupt raised in it is ignored
        assert ref() is None and stop.received == signal.SIGTERM
        written = False
        with pytest.raises(KeyboardInterrupt):
            with stop.deferred():
                written = True
        assert not written and stop.exit_status == 143
        sys.unraisablehook(SimpleNamespace(exc_type=ValueError))
    assert reported == [ValueError]  # the ignored stop was not reported; the other was
    reported.clear()
    sys.unraisablehook(SimpleNamespace(exc_type=KeyboardInterrupt))
    assert reported == [KeyboardInterrupt]  # the hook before it is back


@pytest.mark.kvm
def test_sigterm_stops_running_kvm_guests(tmp_path):
    from gpuvm.vmm.backends import kvm_usable
    ok, why = kvm_usable()
    if not ok:
        pytest.skip(why)
    # after the idle run, a guest with about 4 s of kernels: the signal lands while it runs
    config = write_config(tmp_path, QUICK, **{'backend = "inproc"': 'backend = "kvm"',
                                              'name = "b"\nbenchmark = "vecadd"\nparams = [256]':
                                              'name = "b"\nbenchmark = "loop"\n'
                                              'params = [2000000, 2000]'})
    proc, run, stop_s = interrupt(config, signal.SIGTERM)
    assert proc.returncode == 143, proc.stderr
    assert stop_s < 10 and "Traceback" not in proc.stderr
    assert [r["scenario"] for r in rows_of(run)] == ["one"]
    assert not (run / COMPLETE).exists() and not (run.parent / "latest").exists()
