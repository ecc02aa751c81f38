"""README.md's shell blocks run as written: every command of every ```sh block, in order,
as a user would type it (`gpuvm` on the PATH, one shell per line, `CMD &` left running
in the background), from an empty directory with a state directory of its own, so
nothing in the repository or on the host changes; what each prints, piped at 80 columns,
is whole.  The long commands are listed below,
each with why and with what runs the same code in the suite; a command that is neither
run nor listed fails the test, and so does a listed command the README no longer has."""

from __future__ import annotations

import os
import re
import signal
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

LONG = {
    "make run": "installs, then the default experiment (minutes); the experiment tests "
                "run experiments, tests/test_packaging.py the install",
    "make test": "the suite itself",
    "gpuvm experiment paper": "the paper's evaluation, about 3 minutes "
                              "(= make paper); tests/test_experiment_suite.py",
    "gpuvm run -b mmul --mode all": "the seven modes of one VM, ~40 s; "
                                    "tests/test_mediated_modes.py runs each mode",
    "gpuvm run -b mmul --mode fv --vms 4": "four fv VMs rescanning on one lock, ~100 s; "
                                           "tests/test_mediated_modes.py runs four VMs "
                                           "in each mode, test_virtual_time.py the lock",
    "gpuvm model scaling --vms 1,8,1024 --dask": "replays 1,024-VM points, ~70 s; "
                                                 "tests/test_model_cli.py (--dask too)",
    "gpuvm bench exits": "times each trap path for ~35 s; "
                         "tests/test_kvm_bench_exits.py",
}
EXIT_CODES = {  # what the README says the command exits with, where it is not 0
    "gpuvm run -b madd --inject bad-method": 1,  # a VM failed
}
TIMEOUT = 300  # seconds for one command


def readme_commands() -> list[str]:
    """Each command line of README.md's ```sh blocks, its trailing comment dropped."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", README.read_text(), re.S | re.M):
        for line in block.splitlines():
            command = re.sub(r"\s+#.*$", "", line).strip()
            if command:
                commands.append(command)
    return commands


def test_every_readme_command_is_run_or_listed_long() -> None:
    commands = readme_commands()
    assert len(commands) >= 10, commands
    assert not set(LONG) - set(commands), "listed long, gone from the README"
    assert not set(EXIT_CODES) - set(commands), "an exit code of a command the README lost"


@pytest.fixture
def user_shell() -> Iterator[tuple[Path, dict[str, str]]]:
    """(an empty working directory, the environment of a user with `gpuvm` on PATH)."""
    tmp_path = Path(tempfile.mkdtemp(prefix="gpuvm-", dir="/tmp"))  # socket paths are short
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    gpuvm = bin_dir / "gpuvm"
    gpuvm.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpuvm "$@"\n')
    gpuvm.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHONPATH": str(REPO), "GPUVM_STATE_DIR": str(tmp_path / "state"),
           "COLUMNS": "80"}
    yield work, env
    shutil.rmtree(tmp_path)


@pytest.mark.kvm
@pytest.mark.slow
def test_readme_commands_run_as_written(user_shell) -> None:
    work, env = user_shell
    background: list[tuple[str, subprocess.Popen]] = []
    failed = []
    try:
        for command in readme_commands():
            if command in LONG:
                continue
            if command.endswith("&"):  # a server: on once it has said its first line
                p = subprocess.Popen(["bash", "-c", f"exec {command.removesuffix('&')}"],
                                     cwd=work, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                background.append((command, p))
                if not p.stdout.readline():
                    failed.append(f"{command}: ended before saying it is up: "
                                  f"{p.stderr.read()}")
                continue
            p = subprocess.run(["bash", "-c", command], cwd=work, env=env, text=True,
                               capture_output=True, timeout=TIMEOUT)
            if p.returncode != EXIT_CODES.get(command, 0):
                failed.append(f"{command}: exit {p.returncode}: {p.stderr[-2000:]}")
            wide = [line for line in p.stdout.splitlines() if len(line) > 80]
            if wide or "…" in p.stdout:  # every screen whole at 80 columns, piped
                failed.append(f"{command}: cut or wider than 80 columns: {wide[:3]}")
    finally:
        for command, p in background:
            p.send_signal(signal.SIGTERM)
            if p.wait(60) != 0:
                failed.append(f"{command}: exit {p.returncode} on SIGTERM")
    assert not failed, "\n".join(failed)
    # what the README says an experiment writes, under the directory it ran in
    assert (work / "results" / "quick" / "latest" / "report.md").is_file()
