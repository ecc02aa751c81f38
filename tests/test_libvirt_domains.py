"""Four libvirt domains with vGPU hostdevs of two types, defined and started through
libvirt-python's test driver: each guest runs on gpuvm's VMM in its vGPU's mode, libvirt
shows it running and then shut off with the guest's result in its metadata, and `virsh`
on the same driver file sees the GPU, its types with the instances left, the vGPUs and
the domains.  Every XML gpuvm wrote validates against libvirt's own schemas."""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import libvirt
import pytest

from gpuvm.device.profile import load_profile
from gpuvm.libvirt import domain_xml, nodedev
from gpuvm.libvirt.host import Host, RunSettings
from gpuvm.mdevctl import PARENT_ADDRESS, MdevStore, ParentGpu, format_list
from tests.conftest import FAST_CLOCK, TEST_VRAM

NS = domain_xml.NS
GPU = nodedev.pci_name(PARENT_ADDRESS)


def domain_text(name: str, uuid: str, benchmark: str, params: str, memory_mib: int = 64,
                vgpu_type: str | None = None, extra_devices: str = "") -> str:
    vgpu = f'\n      <gpuvm:vgpu type="{vgpu_type}"/>' if vgpu_type else ""
    return f"""<domain type='kvm'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64'>hvm</type></os>
  <devices>
    <hostdev mode='subsystem' type='mdev' model='vfio-pci' managed='no'>
      <source><address uuid='{uuid}'/></source>
    </hostdev>{extra_devices}
  </devices>
  <metadata>
    <gpuvm:vm xmlns:gpuvm="{NS}">
      <gpuvm:benchmark name="{benchmark}" params="{params}"/>{vgpu}
    </gpuvm:vm>
  </metadata>
</domain>
"""


def virsh(uri: str, *args: str) -> str:
    out = subprocess.run(["virsh", "-c", uri, *args], capture_output=True, text=True)
    assert out.returncode == 0, f"virsh {' '.join(args)}: {out.stderr}"
    return out.stdout


def validates(path: Path, kind: str) -> None:
    out = subprocess.run(["virt-xml-validate", str(path), kind], capture_output=True,
                         text=True)
    assert out.returncode == 0 and f"{path} validates" in out.stdout + out.stderr, \
        f"{path} ({kind}): {out.stdout}{out.stderr}"


def small_store(root: Path) -> MdevStore:
    """The mdev store of a GPU with the tests' small VRAM: types shrink with it."""
    return MdevStore(root, ParentGpu(PARENT_ADDRESS, load_profile().with_vram(TEST_VRAM)))


# (domain, benchmark, params, the vGPU: instances-per-GPU of its type, its mode)
DOMAINS = [("big-pv", "vecadd", (4096,), 8, "pv"),
           ("big-fv", "madd", (16,), 8, "fv"),
           ("wide-fvopt", "vecadd", (2048, 1), 4, "fv-opt"),
           ("wide-pv", "madd", (32,), 4, "pv")]


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    mp = pytest.MonkeyPatch()
    mp.setenv("GPUVM_STATE_DIR", str(root))
    store = small_store(root)
    by_count = {t.max_instances: t for t in store.parent.types().values()
                if not t.partition.oversubscribed}
    host = Host(store)
    conn = host.connect()
    mdevs, seen_running, fresh_running, virsh_running = {}, {}, {}, {}
    for name, bench, params, count, mode in DOMAINS:
        mdev = store.create(by_count[count].type_id, mode=mode)
        mdevs[name] = mdev
        path = root / f"{name}.xml"
        path.write_text(domain_text(name, mdev.uuid, bench, " ".join(map(str, params)),
                                    vgpu_type=mdev.type_id))
        host.define(conn, domain_xml.load(path))

    def on_running(dom, mdev):
        seen_running[dom.name()] = dom.state()[0]
        # what another process sees while the guest runs: a new connection, and virsh
        other = libvirt.open(host.uri)
        fresh_running[dom.name()] = other.lookupByName(dom.name()).state()[0]
        other.close()
        virsh_running[dom.name()] = virsh(host.uri, "domstate", dom.name()).strip()

    results = {}
    for name, *_ in DOMAINS:
        dom, result = host.start(conn, name, RunSettings(backend="auto",
                                                         time_scale=FAST_CLOCK, timeout=120),
                                 on_running)
        results[name] = (dom.state(), result)
    yield host, store, mdevs, results, seen_running, fresh_running, virsh_running, root
    conn.close()
    mp.undo()


def test_four_domains_run_on_their_vgpus(started):
    host, store, mdevs, results, seen_running, fresh_running, virsh_running, _ = started
    for name, bench, params, count, mode in DOMAINS:
        (state, reason), result = results[name]
        assert seen_running[name] == libvirt.VIR_DOMAIN_RUNNING
        assert fresh_running[name] == libvirt.VIR_DOMAIN_RUNNING
        assert virsh_running[name] == "running"
        assert (state, reason) == (libvirt.VIR_DOMAIN_SHUTOFF,
                                   libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN), name
        assert result.passed, f"{name}: {result.error}"
        assert result.mode == mode == mdevs[name].mode
        assert result.record["bench"] == bench and result.record["check"] == "PASS"
        assert int(result.record["n"]) == params[0]
        if mode.startswith("pv"):
            assert int(result.record["hypercalls"]) > 0, name
        else:
            assert int(result.record["hypercalls"]) == 0, name


def test_state_and_results_outlive_the_connection(started):
    """A new connection (another gpuvm command, or virsh) starts from the driver file:
    the domains are there, shut off, with the guests' results in their metadata."""
    host, store, mdevs, results, *_ = started
    conn = Host(store).connect()
    names = sorted(d.name() for d in conn.listAllDomains(0))
    assert names == sorted(n for n, *_ in DOMAINS)
    for name, bench, params, count, mode in DOMAINS:
        dom = conn.lookupByName(name)
        assert dom.state()[0] == libvirt.VIR_DOMAIN_SHUTOFF
        vm = ET.fromstring(dom.metadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT, NS))
        assert vm.find("benchmark").get("name") == bench
        res = vm.find("result")
        assert res.get("passed") == "yes" and res.get("mode") == mode
        fields = {f.get("name"): f.text for f in res.findall("field")}
        assert int(fields["n"]) == params[0]
        spec = host.spec_of(dom)
        assert spec.mdev_uuid == mdevs[name].uuid and spec.result.passed
    conn.close()


def test_virsh_sees_the_gpu_its_types_and_vgpus(started):
    host, store, mdevs, _, _, _, _, root = started
    # two 8Q (16 channels, a 32+4 MiB slice each) and two 4Q (32 channels, 64+4 MiB) are
    # placed on 368 MiB and 128 channels: 32 channels and BAR3 for two more 8Q or one 4Q;
    # the 2Q (64 channels) and 1Q (a 256 MiB slice) no longer fit
    # (the oversubscribed types' shared pool, 75% of the VRAM, no longer fits either)
    expected = {"gpuvm-Q6000-1Q": 0, "gpuvm-Q6000-2Q": 0, "gpuvm-Q6000-4Q": 1,
                "gpuvm-Q6000-8Q": 2, "gpuvm-Q6000-75-OS": 0, "gpuvm-Q6000-150-OS": 0}
    assert store.available() == expected
    gpu = ET.fromstring(virsh(host.uri, "nodedev-dumpxml", GPU))
    pci = gpu.find("capability[@type='pci']")
    assert pci.find("vendor").get("id") == "0x10de"
    assert pci.find("product").get("id") == "0x06d8"
    types = {t.get("id"): t for t in pci.findall("capability[@type='mdev_types']/type")}
    assert {k: int(t.findtext("availableInstances")) for k, t in types.items()} == expected
    assert all(t.findtext("deviceAPI") == "vfio-pci" for t in types.values())
    assert {k: t.findtext("name") for k, t in types.items()} == \
        {t.type_id: t.name for t in store.parent.types().values()}

    # the vGPUs: what `gpuvm mdev list` prints, one child of the GPU each
    listed = {line.split()[0]: line.split()[2] for line in format_list(store).splitlines()}
    assert listed == {m.uuid: m.type_id for m in mdevs.values()}
    conn = libvirt.open(host.uri)
    by_cap = sorted(d.name() for d in
                    conn.listAllDevices(libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV))
    assert by_cap == sorted(nodedev.mdev_name(d) for d in store.list())
    assert [d.name() for d in conn.listAllDevices(
        libvirt.VIR_CONNECT_LIST_NODE_DEVICES_CAP_MDEV_TYPES)] == [GPU]
    conn.close()
    for d in store.list():
        name = nodedev.mdev_name(d)
        dev = ET.fromstring(virsh(host.uri, "nodedev-dumpxml", name))
        assert dev.findtext("parent") == GPU
        cap = dev.find("capability[@type='mdev']")
        assert cap.find("type").get("id") == listed[d.uuid]
        assert cap.findtext("uuid") == d.uuid
        assert re.search(rf"Parent:\s+{GPU}", virsh(host.uri, "nodedev-info", name))
    listing = virsh(host.uri, "list", "--all")
    for name, *_ in DOMAINS:
        assert re.search(rf"-\s+{name}\s+shut off", listing), listing


def test_every_xml_gpuvm_wrote_validates(started, tmp_path):
    host, store, *_ , root = started
    written = sorted((root / "libvirt" / "domains").glob("*.xml"))
    assert len(written) == len(DOMAINS)
    for path in written:
        validates(path, "domain")
    node = ET.parse(host.driver_path).getroot()
    devices = node.findall("device")
    assert len(devices) == 2 + len(DOMAINS)  # computer, the GPU, the vGPUs
    for i, dev in enumerate(devices):
        path = tmp_path / f"device{i}.xml"
        path.write_text(ET.tostring(dev, encoding="unicode"))
        validates(path, "nodedev")
    for i, dom in enumerate(node.findall("domain")):
        dom.remove(dom.find(f"{{{nodedev.TEST_NS}}}runstate"))  # the test driver's own
        path = tmp_path / f"domain{i}.xml"
        path.write_text(ET.tostring(dom, encoding="unicode"))
        validates(path, "domain")
    # and what libvirt hands back for each
    conn = libvirt.open(host.uri)
    for i, dev in enumerate(conn.listAllDevices(0)):
        path = tmp_path / f"libvirt-device{i}.xml"
        path.write_text(dev.XMLDesc(0))
        validates(path, "nodedev")
    conn.close()
