"""`pip install .` (not editable) into a fresh venv, offline, gives a whole gpuvm: the
guest sources, the experiments (with their domain XML and cost profiles) travel inside
the package, the guest is built where the user can write, experiments run by name or
path from any directory, and their results go under that directory."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

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


def _build_backend_without_network() -> str | None:
    """Why this environment cannot build gpuvm's wheel offline, or None when it can:
    without build isolation (which downloads setuptools) the build uses this
    environment's setuptools, whose bdist_wheel needs setuptools >= 70.1 or `wheel`."""
    if importlib.util.find_spec("wheel") is not None:
        return None
    version = importlib.metadata.version("setuptools")
    if tuple(int(x) for x in version.split(".")[:2]) >= (70, 1):
        return None
    return (f"setuptools {version} without the wheel package cannot build a wheel "
            f"offline; `make install` puts setuptools>=70.1 in the venv")


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, Path, dict[str, str]]:
    """gpuvm installed (not editable) into a fresh venv, offline: the venv's bin, its
    site-packages, and an environment for a user whose home is elsewhere."""
    why = _build_backend_without_network()
    if why:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("install")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig."
                                "get_paths()['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    # pip, setuptools and gpuvm's dependencies come from this environment (paths, not
    # site dirs: its editable gpuvm finder is not loaded), so nothing is downloaded:
    # --no-index, and no build isolation (which would fetch setuptools)
    deps = dict.fromkeys(Path(importlib.util.find_spec(m).origin).resolve().parents[1]
                         for m in ("setuptools", "pip", "numpy"))
    (site / "deps.pth").write_text("".join(f"{d}\n" for d in deps))
    p = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index",
                        "--no-build-isolation", "--no-deps", str(REPO)],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    home = tmp / "home"
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
    return venv / "bin", site, env


@pytest.mark.slow
@pytest.mark.kvm
def test_pip_install_into_a_fresh_venv_gives_a_working_gpuvm_run(installed) -> None:
    bin_, site, env = installed
    run = subprocess.run([str(bin_ / "gpuvm"), "run", "-b", "vecadd", "--mode", "fv-opt"],
                         cwd=env["HOME"], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    assert "vm0 fv-opt" in run.stdout and "1/1" in run.stdout
    assert (site / "gpuvm" / "guest_tools" / "driver").is_dir()


@pytest.mark.slow
@pytest.mark.kvm
def test_an_installed_gpuvm_lists_and_runs_its_experiments_by_name_and_path(installed
                                                                            ) -> None:
    bin_, site, env = installed
    home = Path(env["HOME"])

    def gpuvm(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(bin_ / "gpuvm"), *argv], cwd=home, env=env,
                              capture_output=True, text=True, timeout=600)

    listed = gpuvm("experiment", "--list")
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines()[2:] if line.strip()
             and not line.startswith(" ")}
    assert {"paper", "isolation", "overhead", "scaling", "quick"} <= names, listed.stdout
    shipped = site / "gpuvm" / "experiment" / "files"
    assert (shipped / "domains" / "madd.xml").is_file()
    assert (shipped / "costs" / "xen-2014.toml").is_file()

    by_name = gpuvm("experiment", "quick")
    assert by_name.returncode == 0, by_name.stderr
    assert (home / "results" / "quick" / "latest" / "report.md").is_file()

    mine = home / "mine.toml"
    mine.write_text((shipped / "quick.toml").read_text())
    by_path = gpuvm("experiment", str(mine), "--out", "elsewhere")
    assert by_path.returncode == 0, by_path.stderr
    assert (home / "elsewhere" / "quick" / "latest" / "report.md").is_file()
    assert not any(site.rglob("runs.jsonl")), "results written into the installation"
    assert not (site / "results").exists()

    missing = gpuvm("experiment", "nope")
    assert missing.returncode == 2 and "quick" in missing.stderr
