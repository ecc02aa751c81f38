"""`pip install .` (not editable) into a fresh venv gives a working `gpuvm run`: the guest
sources and cost profiles travel inside the package, and the guest is built where the
user can write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from gpuvm.vmm import guest_build

REPO = Path(__file__).resolve().parents[1]


def test_guest_builds_go_to_a_user_cache_when_the_sources_are_read_only(tmp_path,
                                                                        monkeypatch) -> None:
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert guest_build._build_dir(tmp_path / "src") == tmp_path / "gpuvm" / "guest-build"
    monkeypatch.setattr(os, "access", lambda path, mode: True)
    assert guest_build._build_dir(tmp_path / "src") == tmp_path / "src" / "build"


@pytest.mark.slow
@pytest.mark.kvm
def test_pip_install_into_a_fresh_venv_gives_a_working_gpuvm_run(tmp_path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # The dependencies come from this environment (a path, not a site dir: its editable
    # gpuvm finder is not loaded), so the test installs only gpuvm itself -- fast.
    deps = Path(numpy.__file__).resolve().parents[1]
    (site / "deps.pth").write_text(f"{deps}\n")
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    home = tmp_path / "home"
    home.mkdir()
    # without PYTHONPATH: one naming a checkout (as a developer's shell may) would import
    # gpuvm from there, and the test would check the checkout, not what pip installed
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
           "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
           "GPUVM_STATE_DIR": str(home / "state")}
    where = subprocess.run([str(py), "-c", "import gpuvm, shadow, scheduler; "
                            "print(gpuvm.__file__, shadow.__file__, scheduler.__file__)"],
                           cwd=home, env=env, capture_output=True, text=True, check=True)
    assert all(f.startswith(str(site)) for f in where.stdout.split()), where.stdout
    run = subprocess.run([str(venv / "bin" / "gpuvm"), "run", "-b", "vecadd", "--mode",
                          "fv-opt"], cwd=home, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert "vm0 fv-opt" in run.stdout and "1/1" in run.stdout
    assert (site / "gpuvm" / "guest_tools" / "driver").is_dir()
