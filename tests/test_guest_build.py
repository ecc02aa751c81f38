"""The guest programs build both ways, warning-clean, and a build failure is one line."""

from __future__ import annotations

import ctypes
import subprocess

import pytest

from gpuvm import cli
from gpuvm.vmm import guest_build, guest_programs
from gpuvm.vmm.guest_build import BuildError, GuestTarget


@pytest.fixture(scope="module")
def programs():
    return guest_programs.build_all()


@pytest.mark.parametrize("name", sorted(guest_programs.TARGETS))
@pytest.mark.parametrize("platform", ["GPUVM_GUEST_KVM", "GPUVM_GUEST_HOST"])
def test_sources_compile_warning_clean(name, platform):
    target = guest_programs.TARGETS[name]
    inc = guest_build.generate_headers()
    defines = [f"-D{k}={v}" if v else f"-D{k}" for k, v in target.defines.items()]
    for src in target.source_paths():
        proc = subprocess.run(
            ["gcc", *guest_build.COMMON_FLAGS, "-Werror", "-fsyntax-only", f"-D{platform}",
             *defines, f"-I{inc}", f"-I{guest_build.GUEST_TOOLS / 'include'}", str(src)],
            capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", sorted(guest_programs.TARGETS))
def test_shared_library_loads_and_resolves(programs, name):
    so = programs[name].shared
    undefined = subprocess.run(["nm", "-u", str(so)], capture_output=True, text=True).stdout
    assert undefined.split() == []
    lib = ctypes.CDLL(str(so))
    assert lib.gpuvm_guest_entry
    assert ctypes.c_int.in_dll(lib, "gpuvm_host_abort").value == 0


@pytest.mark.parametrize("name", sorted(guest_programs.TARGETS))
def test_flat_image_fits_the_layout(programs, name):
    from gpuvm.vmm import abi

    image = programs[name].flat.read_bytes()
    assert 0 < len(image) <= abi.GUEST_IMAGE_MAX


def test_pv_build_differs_only_in_the_page_table_path():
    direct = set(guest_programs.DRIVER.sources)
    pv = set(guest_programs.DRIVER_PV.sources)
    assert direct ^ pv == {"driver/pt_direct.c", "driver/pt_pv.c"}
    assert guest_programs.DRIVER_PV.defines == {"GPUVM_PV": ""}


def test_rebuild_is_skipped_when_nothing_changed(programs):
    so = programs["driver"].shared
    before = so.stat().st_mtime_ns
    again = guest_programs.build_all(["driver"], kinds=("shared",))
    assert again["driver"].shared.stat().st_mtime_ns == before


def broken_target(tmp_path) -> GuestTarget:
    src = tmp_path / "broken.c"
    src.write_text("int guest_main(void *bp) { return undeclared_thing; }\n")
    return GuestTarget("broken_for_test", [str(src)])


def test_build_failure_is_one_line(tmp_path):
    with pytest.raises(BuildError) as exc:
        guest_build.build_shared(broken_target(tmp_path))
    message = str(exc.value)
    assert "\n" not in message
    assert "broken_for_test" in message and "undeclared_thing" in message


def test_unknown_target_is_one_line():
    with pytest.raises(BuildError, match="no guest target 'nope'"):
        guest_programs.build_all(["nope"])


def importable_commands() -> dict:
    """cli.COMMANDS without subcommands whose module is not written yet."""
    import importlib

    out = {}
    for name, (module, help_text) in cli.COMMANDS.items():
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        out[name] = (module, help_text)
    return out


def test_build_guest_cli_failure_exits_nonzero_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", importable_commands())
    monkeypatch.setitem(guest_programs.TARGETS, "driver", broken_target(tmp_path))
    rc = cli.main(["build-guest", "--target", "driver", "--kind", "shared"])
    err = capsys.readouterr().err
    assert rc != 0
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("gpuvm: error: guest build of broken_for_test")


def test_build_guest_cli_prints_outputs(monkeypatch, capsys):
    monkeypatch.setattr(cli, "COMMANDS", importable_commands())
    assert cli.main(["build-guest"]) == 0
    out = capsys.readouterr().out.split()
    assert any(p.endswith("libdriver_pv.so") for p in out)
    assert any(p.endswith("driver.bin") for p in out)
