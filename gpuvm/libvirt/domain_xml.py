"""A gpuvm VM written as a libvirt domain: what gpuvm reads from the XML and writes back.

gpuvm takes from a domain its name, `<memory>` (and `<memoryBacking><allocation mode>`:
"immediate", gpuvm's default, or "ondemand"), `<vcpu>`, the one mediated-device hostdev
(`<hostdev mode='subsystem' type='mdev' model='vfio-pci'>` naming a vGPU's UUID) and the
workload, which lives in `<metadata>` under gpuvm's own namespace (libvirt keeps
application data there untouched):

    <metadata>
      <gpuvm:vm xmlns:gpuvm="https://gpuvm.example/xmlns/domain/1.0">
        <gpuvm:benchmark name="vecadd" params="4096"/>
        <gpuvm:inject>bad-method</gpuvm:inject>         optional: a driver fault
        <gpuvm:vgpu type="gpuvm-Q6000-8Q"/>             optional: the vGPU type expected
        <gpuvm:result passed="yes" .../>                written by `gpuvm domain start`
      </gpuvm:vm>
    </metadata>

`<gpuvm:vgpu>` lets a domain file say which vGPU type it was written for: an experiment
uses it when the UUID is not defined on this host, and a defined mdev of another type is
an error.  Which mode the vGPU runs in is the mdev's own attribute (`gpuvm mdev create
--mode`), as a vGPU's profile is on a real host.

Every problem is one line naming the file, the line and the element.
"""

from __future__ import annotations

import uuid as uuidlib
import xml.etree.ElementTree as ET
from xml.parsers import expat
from dataclasses import dataclass, field
from pathlib import Path

from gpuvm.device import regs
from gpuvm.errors import UserError
from gpuvm.vmm import abi, guest_programs
from gpuvm.vmm.guest_ram import ALLOCATIONS, default_allocation

NS = "https://gpuvm.example/xmlns/domain/1.0"  # stable: domain files in the wild name it
PREFIX = "gpuvm"
ROOT = "vm"  # <gpuvm:vm>: the one metadata element libvirt keeps for the namespace
MDEV_MODEL = "vfio-pci"
# libvirt's memory units (docs: formatdomain "Memory Allocation"); no unit means KiB
MEMORY_UNITS = {"b": 1, "bytes": 1, "KB": 1000, "k": 1024, "KiB": 1024, "MB": 1000**2,
                "M": 1024**2, "MiB": 1024**2, "GB": 1000**3, "G": 1024**3, "GiB": 1024**3,
                "TB": 1000**4, "T": 1024**4, "TiB": 1024**4}

ET.register_namespace(PREFIX, NS)


class DomainXmlError(UserError):
    """A domain file gpuvm cannot use; one line naming the file and the element."""


def q(tag: str) -> str:
    """A tag of gpuvm's namespace, as ElementTree spells it."""
    return f"{{{NS}}}{tag}"


@dataclass(frozen=True)
class Workload:
    """What the guest of a domain runs."""

    benchmark: str
    params: tuple[int, ...] = ()
    inject: str | None = None
    vgpu_type: str | None = None  # <gpuvm:vgpu type=...>, when the file names one


@dataclass(frozen=True)
class RunResult:
    """What `gpuvm domain start` found when the guest ended (<gpuvm:result>)."""

    passed: bool
    mode: str
    backend: str
    wall_ms: float
    error: str | None = None
    record: dict[str, str] = field(default_factory=dict)  # the guest's last result record


@dataclass(frozen=True)
class DomainSpec:
    """The parts of a domain gpuvm uses."""

    source: str
    name: str
    memory: int  # bytes
    vcpus: int
    mdev_uuid: str
    workload: Workload
    result: RunResult | None
    xml: str  # the whole document, as read (errors found later re-read it for lines)
    # when the host allocates the RAM (gpuvm.vmm.guest_ram): libvirt leaves an absent
    # <allocation> to the hypervisor, and gpuvm's allocates up front, as Xen does
    # (guest_ram.default_allocation)
    memory_alloc: str = "immediate"


def _tag(name: str) -> str:
    """expat's 'URI local' -> ElementTree's '{URI}local'."""
    uri, _, local = name.rpartition(" ")
    return f"{{{uri}}}{local}" if uri else local


class _Located:
    """An element tree that remembers the line each element started on (ElementTree's
    parsers do not say), built with expat directly."""

    def __init__(self, text: str, source: str) -> None:
        self.source = source
        self.lines: dict[int, int] = {}
        stack: list[ET.Element] = []
        roots: list[ET.Element] = []
        parser = expat.ParserCreate(namespace_separator=" ")

        def start(name: str, attrs: dict[str, str]) -> None:
            el = ET.Element(_tag(name), {_tag(k): v for k, v in attrs.items()})
            (stack[-1].append(el) if stack else roots.append(el))
            self.lines[id(el)] = parser.CurrentLineNumber
            stack.append(el)

        def data(chars: str) -> None:
            if not stack:
                return
            top = stack[-1]
            if len(top):
                top[-1].tail = (top[-1].tail or "") + chars
            else:
                top.text = (top.text or "") + chars

        parser.StartElementHandler = start
        parser.EndElementHandler = lambda name: stack.pop()
        parser.CharacterDataHandler = data
        try:
            parser.Parse(text, True)
        except expat.ExpatError as exc:
            raise DomainXmlError(f"{source}: not well-formed XML: {exc}") from None
        self.root = roots[0]

    def fail(self, el: ET.Element | None, message: str) -> DomainXmlError:
        if el is None:
            return DomainXmlError(f"{self.source}: {message}")
        line = self.lines.get(id(el))
        return DomainXmlError(f"{self.source}:{line}: <{_short(el.tag)}>: {message}")


def _short(tag: str) -> str:
    return tag.replace(f"{{{NS}}}", f"{PREFIX}:")


def parse_memory(el: ET.Element, doc: _Located) -> int:
    unit = el.get("unit", "KiB")
    if unit not in MEMORY_UNITS:
        raise doc.fail(el, f"unknown unit {unit!r} (have {', '.join(MEMORY_UNITS)})")
    try:
        size = int((el.text or "").strip()) * MEMORY_UNITS[unit]
    except ValueError:
        raise doc.fail(el, f"{el.text!r} is not a whole number") from None
    if size % regs.MiB or not regs.MiB <= size <= abi.GUEST_RAM_MAX:
        raise doc.fail(el, f"guest RAM must be a whole number of MiB from 1 MiB to "
                           f"{abi.GUEST_RAM_MAX >> 20} MiB, got {size} bytes")
    return size


def _mdev_hostdev(devices: ET.Element | None, doc: _Located) -> str:
    hostdevs = [] if devices is None else devices.findall("hostdev")
    mdevs = [h for h in hostdevs if h.get("type") == "mdev"]
    others = [h for h in hostdevs if h.get("type") != "mdev"]
    if others:
        raise doc.fail(others[0], "gpuvm gives a domain only its vGPU: a hostdev of "
                                  "type='mdev'")
    if len(mdevs) != 1:
        where = devices if devices is not None else doc.root
        raise doc.fail(mdevs[1] if mdevs else where,
                       "needs exactly one <hostdev mode='subsystem' type='mdev' "
                       f"model='{MDEV_MODEL}'> naming a vGPU, found {len(mdevs)}")
    h = mdevs[0]
    if h.get("mode") != "subsystem" or h.get("model") != MDEV_MODEL:
        raise doc.fail(h, f"a vGPU hostdev is mode='subsystem' model='{MDEV_MODEL}', got "
                          f"mode={h.get('mode')!r} model={h.get('model')!r}")
    address = h.find("source/address")
    if address is None or not address.get("uuid"):
        raise doc.fail(h, "needs <source><address uuid='...'/></source>")
    try:
        return str(uuidlib.UUID(address.get("uuid")))
    except ValueError:
        raise doc.fail(address, f"{address.get('uuid')!r} is not a UUID") from None


def _params(el: ET.Element, doc: _Located) -> tuple[int, ...]:
    words = el.get("params", "").split()
    try:
        params = tuple(int(w, 0) for w in words)
    except ValueError:
        raise doc.fail(el, f"params must be whole numbers, got {el.get('params')!r}") from None
    if len(params) > guest_programs.BENCH_NUM_PARAMS or any(not 0 <= p < 1 << 64
                                                          for p in params):
        raise doc.fail(el, f"params: at most {guest_programs.BENCH_NUM_PARAMS} unsigned "
                           f"64-bit integers")
    return params


def _workload(vm: ET.Element, doc: _Located) -> tuple[Workload, RunResult | None]:
    known = {q("benchmark"), q("inject"), q("vgpu"), q("result")}
    for child in vm:
        if child.tag not in known:
            raise doc.fail(child, f"unknown element (have "
                                  f"{', '.join(_short(k) for k in sorted(known))})")
    bench = vm.find(q("benchmark"))
    if bench is None:
        raise doc.fail(vm, "needs a <gpuvm:benchmark name='...' params='...'/>")
    name = bench.get("name", "")
    if name not in guest_programs.BENCHMARKS:
        raise doc.fail(bench, f"unknown benchmark {name!r} (have "
                              f"{', '.join(guest_programs.BENCHMARKS)})")
    inject_el = vm.find(q("inject"))
    inject = None
    if inject_el is not None:
        inject = (inject_el.text or "").strip()
        if inject not in abi.FI_NAMES:
            raise doc.fail(inject_el, f"unknown fault injection {inject!r} (have "
                                      f"{', '.join(sorted(abi.FI_NAMES))})")
    vgpu = vm.find(q("vgpu"))
    if vgpu is not None and not vgpu.get("type"):
        raise doc.fail(vgpu, "needs type='...' (a vGPU type id, see `gpuvm mdev types`)")
    workload = Workload(name, _params(bench, doc), inject,
                        vgpu.get("type") if vgpu is not None else None)
    res = vm.find(q("result"))
    result = None
    if res is not None:
        try:
            result = RunResult(res.get("passed") == "yes", res.get("mode", ""),
                               res.get("backend", ""), float(res.get("wall_ms", "0")),
                               (res.findtext(q("error")) or None),
                               {f.get("name", ""): f.text or "" for f in res.findall(q("field"))})
        except ValueError:
            raise doc.fail(res, f"wall_ms {res.get('wall_ms')!r} is not a number") from None
    return workload, result


def parse(text: str, source: str) -> DomainSpec:
    """The domain in `text` (from `source`, for messages), checked as gpuvm needs it."""
    doc = _Located(text, source)
    root = doc.root
    if root.tag != "domain":
        raise doc.fail(root, "not a libvirt domain (the root element must be <domain>)")
    name_el = root.find("name")
    name = (name_el.text or "").strip() if name_el is not None else ""
    if not name or "/" in name:
        raise doc.fail(name_el if name_el is not None else root,
                       "needs a <name> without '/'")
    memory_el = root.find("memory")
    if memory_el is None:
        raise doc.fail(root, "needs a <memory> (the guest's RAM)")
    memory = parse_memory(memory_el, doc)
    memory_alloc = default_allocation()
    alloc_el = root.find("memoryBacking/allocation")
    if alloc_el is not None:
        memory_alloc = alloc_el.get("mode", memory_alloc)
        if memory_alloc not in ALLOCATIONS:
            raise doc.fail(alloc_el, f"allocation mode {memory_alloc!r} is not one of "
                                     f"{', '.join(ALLOCATIONS)}")
    vcpu_el = root.find("vcpu")
    vcpus = 1
    if vcpu_el is not None:
        try:
            vcpus = int((vcpu_el.text or "").strip())
        except ValueError:
            raise doc.fail(vcpu_el, f"{vcpu_el.text!r} is not a whole number") from None
        if vcpus != 1:
            raise doc.fail(vcpu_el, f"gpuvm's guests run on one vCPU, got {vcpus}")
    mdev_uuid = _mdev_hostdev(root.find("devices"), doc)
    vms = [] if root.find("metadata") is None else root.find("metadata").findall(q(ROOT))
    if len(vms) != 1:
        where = root.find("metadata") if root.find("metadata") is not None else root
        raise doc.fail(where, f"needs one <{PREFIX}:{ROOT} xmlns:{PREFIX}='{NS}'> in "
                              f"<metadata> saying what the guest runs, found {len(vms)}")
    workload, result = _workload(vms[0], doc)
    return DomainSpec(source, name, memory, vcpus, mdev_uuid, workload, result, text,
                      memory_alloc)


def load(path: str | Path) -> DomainSpec:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise DomainXmlError(f"{path}: cannot read: {exc.strerror}") from None
    return parse(text, str(path))


def hostdev_fail(spec: DomainSpec, message: str) -> DomainXmlError:
    """An error about a domain's vGPU hostdev (the UUID it names), located in its file."""
    doc = _Located(spec.xml, spec.source)
    h = next(h for h in doc.root.iter("hostdev") if h.get("type") == "mdev")
    return doc.fail(h, message)


def vgpu_fail(spec: DomainSpec, message: str) -> DomainXmlError:
    """An error about a domain's <gpuvm:vgpu> element, located in its file."""
    doc = _Located(spec.xml, spec.source)
    return doc.fail(doc.root.find(f"metadata/{q(ROOT)}/{q('vgpu')}"), message)


# ------------------------------------------------------------------------------ writing
def metadata_element(workload: Workload, result: RunResult | None) -> str:
    """The <gpuvm:vm> element for virDomainSetMetadata: the workload and, after a run, its
    result.  Written without a namespace: libvirt puts the element and its children in
    the namespace it is given (and refuses one declared in the text)."""
    vm = ET.Element(ROOT)
    bench = ET.SubElement(vm, "benchmark", name=workload.benchmark)
    if workload.params:
        bench.set("params", " ".join(str(p) for p in workload.params))
    if workload.inject:
        ET.SubElement(vm, "inject").text = workload.inject
    if workload.vgpu_type:
        ET.SubElement(vm, "vgpu", type=workload.vgpu_type)
    if result is not None:
        res = ET.SubElement(vm, "result", passed="yes" if result.passed else "no",
                            mode=result.mode, backend=result.backend,
                            wall_ms=f"{result.wall_ms:.3f}")
        if result.error:
            ET.SubElement(res, "error").text = result.error
        for k, v in result.record.items():
            ET.SubElement(res, "field", name=k).text = v
    return ET.tostring(vm, encoding="unicode")
