"""Experiments whose VMs are libvirt domain files: the shipped example is the default
experiment, VM for VM, and a small one runs end to end from domain files."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from gpuvm.experiment.config import load, parse
from gpuvm.experiment.execute import execute
from gpuvm.experiment.rundir import RunDir
from gpuvm.mdevctl import MdevStore
from tests.test_libvirt_domains import domain_text, validates

REPO = Path(__file__).resolve().parents[1]


def test_the_example_is_the_default_experiment_from_domain_files(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path))  # no vGPU defined: the files say
    default = load(REPO / "experiments" / "default.toml")
    domains = load(REPO / "experiments" / "default-domains.toml")
    assert domains.modes == default.modes and domains.policies == default.policies
    eight_q = MdevStore().parent.types()["gpuvm-Q6000-8Q"]
    assert [s.name for s in domains.scenarios] == [s.name for s in default.scenarios]
    for mine, theirs in zip(domains.scenarios, default.scenarios):
        assert [(v.name, v.benchmark, v.params, v.ram_mib, v.inject) for v in mine.vms] == \
            [(v.name, v.benchmark, v.params, v.ram_mib, v.inject) for v in theirs.vms]
        for vm in mine.vms:
            assert vm.partition == asdict(eight_q.partition) and vm.share == eight_q.weight
    for path in sorted((REPO / "experiments" / "domains").glob("*.xml")):
        validates(path, "domain")


SMALL = """
[experiment]
name = "small-domains"
modes = ["pv", "fv-opt"]
backend = "inproc"
time_scale = 1000.0
output = "{out}"

[[scenario]]
name = "two-vgpus"
domains = ["a.xml", "b.xml"]
"""


def test_a_small_experiment_runs_from_domain_files(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
    (tmp_path / "a.xml").write_text(domain_text(
        "a", "0a000000-0000-4000-8000-000000000001", "vecadd", "2048", memory_mib=128,
        vgpu_type="gpuvm-Q6000-2Q"))
    (tmp_path / "b.xml").write_text(domain_text(
        "b", "0b000000-0000-4000-8000-000000000002", "madd", "16", vgpu_type="gpuvm-Q6000-8Q"))
    exp = parse(SMALL.format(out=tmp_path / "out"), str(tmp_path / "small.toml"))
    a, b = exp.scenarios[0].vms
    assert (a.ram_mib, b.ram_mib) == (128, 64)
    assert a.share == 4 * b.share  # a 2Q has four times the weight of an 8Q
    rows = execute(exp, RunDir.create(exp))
    assert sorted((r.vm, r.mode, r.passed) for r in rows) == \
        [("a", "fv-opt", True), ("a", "pv", True), ("b", "fv-opt", True), ("b", "pv", True)]
