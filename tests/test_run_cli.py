"""`gpuvm run`: a table on success, one error line and a non-zero exit on failure."""

from __future__ import annotations

import importlib

import pytest

from gpuvm import cli


@pytest.fixture
def gpuvm(monkeypatch, capsys):
    """Calls the real CLI; subcommands whose module is not written yet are left out."""
    commands = {}
    for name, (module, help_text) in cli.COMMANDS.items():
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        commands[name] = (module, help_text)
    monkeypatch.setattr(cli, "COMMANDS", commands)

    def run(*argv: str) -> tuple[int, str, str]:
        rc = cli.main(["run", "--backend", "inproc", "--vram-mib", "384", *argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def test_summary_for_a_passing_run(gpuvm):
    rc, out, err = gpuvm("--benchmark", "mmul", "--mode", "native", "--size", "32")
    assert rc == 0 and err == ""
    assert "mmul 32" in out and "1/1" in out and "n=32" in out and "vm0 native" in out
    for phase in ("Init", "HtoD", "Launch", "DtoH", "Close", "all"):
        assert phase in out
    for column in ("Model ms", "xNat", "Dev ms", "Wall ms", "Traps", "Syncs", "Hcalls"):
        assert column in out


def test_detail_tables_for_a_passing_run(gpuvm):
    rc, out, err = gpuvm("--benchmark", "mmul", "--mode", "native", "--size", "32",
                         "--detail")
    assert rc == 0 and err == ""
    assert "vm0: mmul n=32" in out and "PASS" in out
    for phase in ("Init", "HtoD", "Launch", "DtoH", "Close", "Total"):
        assert phase in out
    for column in ("Wall ms", "Device ms", "Exits BAR0", "TLB flush", "Doorbell", "Kernels"):
        assert column in out
    assert "bar0.pramin" in out and "driver: pte_writes=" in out


def test_pinned_flag_reaches_the_guest(gpuvm):
    rc, out, _ = gpuvm("-b", "memcpy", "--size", "65536", "--pinned", "--detail")
    assert rc == 0 and "pinned=1" in out


@pytest.mark.parametrize("inject,expect", [
    ("unmapped-copy", "gpuvm: error: vm0: channel 0 (PCOPY0): vm-fault: PDE not present at 0x1000"),
    ("bad-method", "gpuvm: error: vm0: channel 0 (PFIFO): bad method header"),
    ("bad-kernel", "gpuvm: error: vm0: channel 0 (PFIFO): bad kernel object"),
    ("unknown-class", "gpuvm: error: vm0: channel 0 (PFIFO): unknown class"),
])
def test_guest_failure_is_one_line_and_nonzero(gpuvm, inject, expect):
    rc, out, err = gpuvm("-b", "madd", "--size", "16", "--inject", inject)
    assert rc == 1  # a VM failed (bad input is 2)
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(expect)
    assert "FAIL" in out


def test_bad_arguments_are_one_line(gpuvm):
    rc, _, err = gpuvm("-b", "loop", "--pinned")
    assert rc == 2 and err.strip() == \
        "gpuvm: error: vm0: pinned buffers apply to vecadd, madd, mmul, fmadd, memcpy, not loop"
    with pytest.raises(SystemExit) as exc:
        gpuvm("-b", "idle", "--vms", "0")
    assert exc.value.code == 2
    rc, _, err = gpuvm("-b", "idle", "--mode", "nope")
    assert rc == 2 and "no mode 'nope'" in err


def test_one_bad_guest_beside_a_good_one(gpuvm):
    rc, out, err = gpuvm("--vm", "bench=madd,size=16,inject=bad-method",
                         "--vm", "bench=madd,size=16", "--mode", "fv-opt")
    assert rc == 1 and err.startswith("gpuvm: error: vm0: channel 0 (PFIFO): bad method")
    assert "vm1" not in err and "vm0 fv-opt FAIL" in out
    assert "vm1 fv-opt" in out and "vm1 fv-opt FAIL" not in out
