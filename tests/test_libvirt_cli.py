"""`gpuvm domain` and `gpuvm nodedev` from the command line: a domain's whole life, and one
line naming the file and the element for every kind of bad domain file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gpuvm import cli
from gpuvm.experiment.config import ConfigError, parse
from tests.test_libvirt_domains import domain_text, validates

UUID = "c2177883-f1bb-47f0-914d-32a22e3a8804"


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUVM_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def gpuvm(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_a_domain_from_define_to_undefine(state, capsys):
    assert gpuvm(capsys, "mdev", "create", "gpuvm-Q6000-8Q", "--uuid", UUID,
                 "--mode", "fv-opt")[0] == 0
    path = state / "vm.xml"
    path.write_text(domain_text("vm", UUID, "madd", "16"))
    rc, out, err = gpuvm(capsys, "domain", "define", str(path))
    assert (rc, err) == (0, "") and "Domain 'vm' defined" in out
    rc, out, _ = gpuvm(capsys, "domain", "list")
    assert re.search(r"vm\s+shut off.*gpuvm-Q6000-8Q.*madd 16", out), out

    rc, out, err = gpuvm(capsys, "domain", "start", "vm", "--backend", "inproc",
                         "--time-scale", "1000")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0] == "Domain 'vm' started: running"
    assert lines[1] == f"  vGPU {UUID} (gpuvm-Q6000-8Q, fv-opt)"
    assert re.match(r"Domain 'vm' shut off \(shutdown\): madd PASS n=16 \(fv-opt, inproc",
                    lines[2]), lines
    rc, out, _ = gpuvm(capsys, "domain", "dumpxml", "vm")
    assert f"<address uuid='{UUID}'/>" in out and 'passed="yes"' in out
    (state / "dump.xml").write_text(out)
    validates(state / "dump.xml", "domain")

    rc, out, err = gpuvm(capsys, "domain", "destroy", "vm")
    assert rc == 2 and err == "gpuvm: error: domain 'vm' is not running\n"
    rc, out, _ = gpuvm(capsys, "nodedev", "list", "--cap", "mdev")
    assert out.split() == [f"mdev_{UUID.replace('-', '_')}_0000_01_00_0"]
    rc, out, _ = gpuvm(capsys, "nodedev", "dumpxml", "pci_0000_01_00_0")
    assert "<availableInstances>7</availableInstances>" in out  # 8Q: one of eight taken
    rc, out, err = gpuvm(capsys, "domain", "undefine", "vm")
    assert rc == 0 and "undefined" in out
    assert gpuvm(capsys, "domain", "dumpxml", "vm")[2].startswith("gpuvm: error: no domain")
    assert not list((state / "state" / "libvirt" / "domains").iterdir())


BAD_DOMAINS = [
    # (what is wrong, the domain text, the element the error must name)
    ("not XML", "<domain><name>x</name>", r"not well-formed XML"),
    ("unknown vGPU", domain_text("vm", "11111111-2222-3333-4444-555555555555", "madd", "16"),
     r":7: <hostdev>: names mdev 11111111-2222-3333-4444-555555555555, which is not "
     r"defined on 0000:01:00\.0"),
    ("two vGPUs", domain_text("vm", UUID, "madd", "16", extra_devices=f"""
    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
      <source><address uuid='{UUID}'/></source>
    </hostdev>"""), r":10: <hostdev>: needs exactly one"),
    ("no workload", domain_text("vm", UUID, "madd", "16").replace("gpuvm:vm", "gpuvm:vvm"),
     r":11: <metadata>: needs one <gpuvm:vm"),
    ("unknown benchmark", domain_text("vm", UUID, "sgemm", "16"),
     r":13: <gpuvm:benchmark>: unknown benchmark 'sgemm'"),
    ("bad params", domain_text("vm", UUID, "madd", "sixteen"),
     r":13: <gpuvm:benchmark>: params must be whole numbers"),
    ("wrong type", domain_text("vm", UUID, "madd", "16", vgpu_type="gpuvm-Q6000-1Q"),
     r":14: <gpuvm:vgpu>: expects a gpuvm-Q6000-1Q vGPU but mdev .* is a gpuvm-Q6000-8Q"),
    ("two vCPUs", domain_text("vm", UUID, "madd", "16").replace("<vcpu>1", "<vcpu>2"),
     r":4: <vcpu>: gpuvm's guests run on one vCPU"),
    ("allocation", domain_text("vm", UUID, "madd", "16").replace(
        "<vcpu>", "<memoryBacking><allocation mode='lazy'/></memoryBacking>\n  <vcpu>"),
     r":4: <allocation>: allocation mode 'lazy' is not one of immediate, ondemand"),
    ("schema", domain_text("vm", UUID, "madd", "16", extra_devices="\n    <gpu/>"),
     r": libvirt refused the domain: .*Extra element devices"),
]


@pytest.mark.parametrize("what,text,message", BAD_DOMAINS, ids=[b[0] for b in BAD_DOMAINS])
def test_a_bad_domain_file_is_one_line_naming_it(state, capsys, what, text, message):
    gpuvm(capsys, "mdev", "create", "gpuvm-Q6000-8Q", "--uuid", UUID)
    path = state / "bad.xml"
    path.write_text(text)
    rc, out, err = gpuvm(capsys, "domain", "define", str(path))
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"gpuvm: error: {path}"), err
    assert re.search(message, err), err
    assert not (state / "state" / "libvirt" / "domains").exists()


EXPERIMENT = """
[experiment]
name = "d"
[[scenario]]
name = "s"
domains = [{files}]
"""


def test_experiment_domains_that_do_not_fit_name_the_file_and_hostdev(state):
    # the 1Q type takes the whole GPU: a second one has no instance left
    files = []
    for i in range(2):
        path = state / f"big{i}.xml"
        path.write_text(domain_text(f"big{i}", f"{i}1111111-2222-3333-4444-555555555555",
                                    "madd", "16", vgpu_type="gpuvm-Q6000-1Q"))
        files.append(f'"{path.name}"')
    source = str(state / "exp.toml")
    with pytest.raises(ConfigError) as err:
        parse(EXPERIMENT.format(files=", ".join(files)), source)
    assert re.fullmatch(rf"{source}: scenario\[0\]\.domains: {state}/big1\.xml:7: <hostdev>: "
                        rf"type gpuvm-Q6000-1Q has no instances left on 0000:01:00\.0 .*",
                        str(err.value)), err.value
    # one fits; without a <gpuvm:vgpu> an undefined UUID cannot be run
    exp = parse(EXPERIMENT.format(files=files[0]), source)
    assert [v.name for v in exp.scenarios[0].vms] == ["big0"]
    (state / "big0.xml").write_text(domain_text("big0", UUID, "madd", "16"))
    with pytest.raises(ConfigError, match=r"big0\.xml:7: <hostdev>: names mdev .* no "
                                          r"<gpuvm:vgpu"):
        parse(EXPERIMENT.format(files=files[0]), source)


def test_a_domain_says_when_its_ram_is_allocated(monkeypatch):
    """libvirt's <memoryBacking><allocation mode>; absent, gpuvm allocates up front."""
    from gpuvm.libvirt.domain_xml import parse as parse_domain
    monkeypatch.delenv("GPUVM_RAM_ALLOC", raising=False)
    text = domain_text("vm", UUID, "madd", "16")
    assert parse_domain(text, "d.xml").memory_alloc == "immediate"
    ondemand = text.replace("<vcpu>", "<memoryBacking><allocation mode='ondemand'/>"
                                      "</memoryBacking>\n  <vcpu>")
    assert parse_domain(ondemand, "d.xml").memory_alloc == "ondemand"


def test_a_real_hypervisors_connection_is_told_what_works_there(state, capsys):
    """gpuvm's host and any test-driver connection are the test driver: no note; a
    hypervisor's (QEMU, ...) gets one line: start is refused there (it cannot open
    gpuvm's vGPUs), the rest works.  (No libvirtd here: the wording and the check of the
    driver are tested; a QEMU connection only changes what real_driver returns.)"""
    import libvirt

    from gpuvm.libvirt.host import Host, real_driver, what_works_on

    own = Host()
    assert real_driver(own.connect()) is None
    assert real_driver(libvirt.open("test:///default")) is None
    rc, out, err = gpuvm(capsys, "domain", "--connect", "test:///default", "list")
    assert rc == 0 and err == "" and "test:///default" in out
    line = what_works_on("qemu:///system", "QEMU")
    assert "\n" not in line and line.startswith("qemu:///system is a QEMU connection: ")
    assert "define, list, dumpxml, destroy and undefine work there, start does not" in line
