"""A host with several GPUs: `gpuvm mdev gpus N`, each parent's types and available
instances, `create --parent` and placement by availability, libvirt's node devices of
every parent, and `gpuvm run --mdev` / `gpuvm domain start` on the mdev's own parent."""

from __future__ import annotations

import argparse
import re
import xml.etree.ElementTree as ET

import pytest

from gpuvm.libvirt import nodedev
from gpuvm.mdevctl import MdevStore, parent_address, parent_index
from gpuvm.run import RunOptions, run_vms
from gpuvm.run import cli as run_cli
from gpuvm.run.cli import machine_gpus, specs_from_args

FIRST, SECOND = "0000:01:00.0", "0000:02:00.0"
ONE_Q = "gpuvm-Q6000-1Q"  # one instance per GPU
UUID = "c2177883-f1bb-47f0-914d-32a22e3a8804"
PLAIN_TYPES = ("gpuvm-Q6000-1Q", "gpuvm-Q6000-2Q", "gpuvm-Q6000-4Q", "gpuvm-Q6000-8Q")


def types_by_parent(out: str) -> dict[str, dict[str, int]]:
    """`gpuvm mdev types` as {parent: {type: available instances}} (mdevctl's layout)."""
    parents: dict[str, dict[str, int]] = {}
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if re.fullmatch(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-9]", line):
            current = parents.setdefault(line, {})
        elif line.strip() in PLAIN_TYPES:  # oversubscribed types may be listed too
            current[line.strip()] = int(lines[i + 1].split(":")[1])
    return parents


def test_addresses_count_buses_from_the_first():
    assert [parent_address(i) for i in range(3)] == [FIRST, SECOND, "0000:03:00.0"]
    assert parent_index("0000:0c:00.0") == 11


def test_the_host_has_one_gpu_until_told_otherwise(state, gpuvm_cli):
    rc, out, _ = gpuvm_cli("mdev", "gpus")
    assert rc == 0 and out.splitlines() == [f"{FIRST} Quadro 6000 GPU 0 (0 mdev(s))"]
    rc, out, _ = gpuvm_cli("mdev", "gpus", "2")
    assert out.splitlines()[1] == f"{SECOND} Quadro 6000 GPU 1 (0 mdev(s))"
    assert MdevStore().gpu_count == 2  # kept for every later command
    rc, out, _ = gpuvm_cli("mdev", "types")
    parents = types_by_parent(out)
    assert list(parents) == [FIRST, SECOND]
    assert parents[FIRST] == parents[SECOND] == {
        "gpuvm-Q6000-1Q": 1, "gpuvm-Q6000-2Q": 2, "gpuvm-Q6000-4Q": 4, "gpuvm-Q6000-8Q": 8}
    rc, out, _ = gpuvm_cli("mdev", "types", "--parent", SECOND)
    assert list(types_by_parent(out)) == [SECOND]


def test_placement_by_availability_and_by_parent(state, gpuvm_cli):
    assert gpuvm_cli("mdev", "gpus", "2")[0] == 0
    first = gpuvm_cli("mdev", "create", ONE_Q)[1].strip()
    second = gpuvm_cli("mdev", "create", ONE_Q)[1].strip()  # the first GPU is full
    rc, out, err = gpuvm_cli("mdev", "create", ONE_Q)
    assert rc == 2 and err == (f"gpuvm: error: {ONE_Q}: no instance available on any of 2 "
                               "parent GPU(s) (available_instances is 0)\n")
    rows = [line.split() for line in gpuvm_cli("mdev", "list")[1].splitlines()]
    assert [(r[0], r[1]) for r in rows] == [(first, FIRST), (second, SECOND)]
    assert gpuvm_cli("mdev", "list", "--parent", SECOND)[1].split()[0] == second
    parents = types_by_parent(gpuvm_cli("mdev", "types")[1])
    assert parents[FIRST]["gpuvm-Q6000-8Q"] == parents[SECOND]["gpuvm-Q6000-8Q"] == 0

    gpuvm_cli("mdev", "remove", first)
    rc, out, _ = gpuvm_cli("mdev", "create", "gpuvm-Q6000-8Q", "--parent", SECOND,
                       "--uuid", UUID)
    assert rc == 2  # SECOND is full (its 1Q holds all of it)
    rc, out, _ = gpuvm_cli("mdev", "create", "gpuvm-Q6000-8Q", "--parent", FIRST,
                       "--uuid", UUID)
    assert rc == 0 and MdevStore().get(UUID).parent == FIRST
    for argv, message in [
        (("create", ONE_Q, "--parent", "0000:07:00.0"),
         f"no parent GPU 0000:07:00.0 (have {FIRST}, {SECOND})"),
        (("gpus", "1"), f"{SECOND} still has 1 mdev(s); remove them before taking its GPU "
                        "away"),
        (("gpus", "0"), "gpus must be 1-16, got 0"),
    ]:
        rc, out, err = gpuvm_cli("mdev", *argv)
        assert rc == 2 and err == f"gpuvm: error: {message}\n"


def test_a_bad_host_file_is_one_line(state, gpuvm_cli):
    (state / "host.json").write_text('{"gpus": 99}')
    rc, _, err = gpuvm_cli("mdev", "types")
    assert rc == 2 and err == f"gpuvm: error: {state / 'host.json'}: gpus must be 1-16, got 99\n"


def test_libvirt_lists_every_parent_and_its_mdevs(state, gpuvm_cli):
    store = MdevStore(gpus=3)
    store.set_gpu_count(3)
    a = store.create(ONE_Q)
    b = store.create("gpuvm-Q6000-2Q", parent="0000:03:00.0")
    rc, out, err = gpuvm_cli("nodedev", "list", "--cap", "mdev_types")
    assert rc == 0, err
    assert out.split() == ["pci_0000_01_00_0", "pci_0000_02_00_0", "pci_0000_03_00_0"]
    groups = set()
    for i, name in enumerate(out.split()):
        dev = ET.fromstring(gpuvm_cli("nodedev", "dumpxml", name)[1])
        avail = {t.get("id"): int(t.findtext("availableInstances"))
                 for t in dev.iter("type")}
        assert avail[ONE_Q] == (0 if i in (0, 2) else 1)
        groups.add(dev.find(".//iommuGroup").get("number"))
    assert len(groups) == 3
    for d, parent in ((a, FIRST), (b, "0000:03:00.0")):
        dev = ET.fromstring(gpuvm_cli("nodedev", "dumpxml", nodedev.mdev_name(d))[1])
        assert dev.findtext("parent") == nodedev.pci_name(parent)


def test_run_mdev_runs_on_the_mdevs_parent_gpu(state, gpuvm_cli, placement_watch):
    store = MdevStore()
    store.set_gpu_count(2)
    store.create(ONE_Q)  # fills the first GPU
    on_second = store.create(ONE_Q).uuid
    parser = argparse.ArgumentParser()
    run_cli.add_arguments(parser)
    args = parser.parse_args(["-b", "madd", "--size", "16", "--mdev", on_second])
    [spec] = specs_from_args(args)
    assert spec.gpu == 1 and machine_gpus(args.gpus, [spec]) == 2
    Watched, placed = placement_watch

    opts = RunOptions(mode="fv-opt", backend="inproc", gpus=2, time_scale=1000.0)
    [result] = run_vms([spec], opts, machine=Watched)
    assert result.passed, result.error()
    assert placed == {"vm0": 1}
    rc, out, err = gpuvm_cli("run", "-b", "madd", "--size", "16", "--mdev", on_second,
                         "--backend", "inproc", "--time-scale", "1000")
    assert rc == 0, err


def test_a_domain_starts_on_its_mdevs_parent(state, monkeypatch):
    from gpuvm.libvirt import domain_xml
    from gpuvm.libvirt.host import RunSettings, run_on_vgpu
    from gpuvm.run import RunError
    from tests.test_libvirt_domains import domain_text

    store = MdevStore()
    store.set_gpu_count(2)
    d = store.create("gpuvm-Q6000-8Q", parent=SECOND)
    seen = {}

    def run_nothing(specs, options):
        seen["spec"], seen["options"] = specs[0], options
        raise RunError("stopped before running")

    monkeypatch.setattr("gpuvm.libvirt.host.run_vms", run_nothing)
    spec = domain_xml.parse(domain_text("vm", d.uuid, "madd", "16"), "vm.xml")
    parent = store.parent_of(d.parent)
    result, _ = run_on_vgpu(spec, d, parent.types()[d.type_id], parent,
                            RunSettings(backend="inproc"))
    assert not result.passed and result.error == "stopped before running"
    assert seen["spec"].gpu == 1 and seen["options"].gpus == 2


def test_serve_puts_each_mdev_on_its_parents_gpu(state):
    from gpuvm.serve import MdevServer

    store = MdevStore()
    store.set_gpu_count(2)
    first = store.create(ONE_Q)
    second = store.create(ONE_Q)
    server = MdevServer(store.list())
    try:
        machine = server.machine
        assert len(machine.gpus) == 2
        assert {server.specs[d.uuid].gpu for d in (first, second)} == {0, 1}
    finally:
        server.machine.close()
