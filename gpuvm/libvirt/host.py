"""One host as libvirt sees it: a connection, its domains kept across connections, and
starting a domain on gpuvm's VMM with its vGPU.

See gpuvm.libvirt for why the test driver's file holds the node devices and the domains.
Only the domains a command touched are written back, so two gpuvm commands at once (a
long `start` and a `define` beside it) do not undo each other.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import libvirt

from gpuvm.errors import UserError
from gpuvm.libvirt import domain_xml, nodedev
from gpuvm.libvirt.domain_xml import DomainSpec, DomainXmlError, RunResult
from gpuvm.mdevctl import MdevDefinition, MdevStore, ParentGpu
from gpuvm.mediator import mdev_types
from gpuvm.mediator.mdev_types import MdevType, MdevTypeError
from gpuvm.run import RunError, RunOptions, VmSpec, run_vms

STATE_NAMES = {
    libvirt.VIR_DOMAIN_NOSTATE: "no state", libvirt.VIR_DOMAIN_RUNNING: "running",
    libvirt.VIR_DOMAIN_BLOCKED: "idle", libvirt.VIR_DOMAIN_PAUSED: "paused",
    libvirt.VIR_DOMAIN_SHUTDOWN: "in shutdown", libvirt.VIR_DOMAIN_SHUTOFF: "shut off",
    libvirt.VIR_DOMAIN_CRASHED: "crashed", libvirt.VIR_DOMAIN_PMSUSPENDED: "pmsuspended",
}
SHUTOFF_REASONS = {
    libvirt.VIR_DOMAIN_SHUTOFF_UNKNOWN: "unknown", libvirt.VIR_DOMAIN_SHUTOFF_SHUTDOWN:
    "shutdown", libvirt.VIR_DOMAIN_SHUTOFF_DESTROYED: "destroyed",
    libvirt.VIR_DOMAIN_SHUTOFF_CRASHED: "crashed", libvirt.VIR_DOMAIN_SHUTOFF_FAILED:
    "failed",
}
BOTH = libvirt.VIR_DOMAIN_AFFECT_CONFIG | libvirt.VIR_DOMAIN_AFFECT_LIVE


def _quiet(_ctx, _err) -> None:
    """libvirt prints every error to stderr by default; gpuvm reports them itself."""


libvirt.registerErrorHandler(_quiet, None)


def state_name(dom: libvirt.virDomain) -> str:
    state, reason = dom.state()
    name = STATE_NAMES.get(state, str(state))
    if state == libvirt.VIR_DOMAIN_SHUTOFF and reason in SHUTOFF_REASONS:
        return f"{name} ({SHUTOFF_REASONS[reason]})"
    return name


def libvirt_message(exc: libvirt.libvirtError) -> str:
    """libvirt's message on one line (schema errors come on several)."""
    return "; ".join(line.strip() for line in str(exc).splitlines()
                     if line.strip() and line.strip() != "(null)")


def real_driver(conn: libvirt.virConnect) -> str | None:
    """The hypervisor driver of a connection that is not libvirt's test driver (QEMU,
    LXC, ...), or None for the test driver gpuvm's guests run beside."""
    driver = conn.getType()
    return None if driver.upper() == "TEST" else driver


def what_works_on(uri: str, driver: str) -> str:
    """One line: what `gpuvm domain` can and cannot do on a real hypervisor's connection.
    Why it cannot start there: gpuvm's vGPUs live in gpuvm's VMM, not as kernel mdevs
    under /sys/bus/mdev, so the hypervisor would be handed a <hostdev type='mdev'> it
    cannot open (and gpuvm's guests do not run under it)."""
    return (f"{uri} is a {driver} connection: define, list, dumpxml, destroy and undefine "
            f"work there, start does not ({driver} cannot open gpuvm's vGPUs, which are "
            f"not kernel mdevs); start runs on gpuvm's own host (leave out --connect)")


# ------------------------------------------------------------------------------ running
@dataclass(frozen=True)
class RunSettings:
    """How a libvirt domain's guest is run on gpuvm's VMM (backend, clock scale, timeout): what
    the domain XML does not say."""

    backend: str = "auto"  # kvm | inproc | auto
    time_scale: float = 1.0
    timeout: float = 600.0  # seconds for the guest


def run_on_vgpu(spec: DomainSpec, mdev: MdevDefinition, mdev_type: MdevType,
                parent: ParentGpu, settings: RunSettings) -> tuple[RunResult, bool]:
    """Run one domain's guest on gpuvm's VMM with its vGPU; (the result, whether the
    guest ended by itself).  The only place this package reaches the run API: the vGPU's
    mode and type become the run's mode, partition and scheduler weight."""
    # the machine has GPUs up to the mdev's parent, and the vGPU goes on that one
    vm = VmSpec(name=spec.name, benchmark=spec.workload.benchmark,
                params=list(spec.workload.params), inject=spec.workload.inject,
                ram_size=spec.memory, ram_alloc=spec.memory_alloc,
                mdev_type=mdev_type.type_id, mode=mdev.mode, mdev_uuid=mdev.uuid,
                gpu=parent.index)
    options = RunOptions(mode=mdev.mode, backend=settings.backend, timeout=settings.timeout,
                         time_scale=settings.time_scale, vram_size=parent.profile.vram_size,
                         gpus=parent.index + 1)
    t0 = time.monotonic()
    try:
        [r] = run_vms([vm], options)
    except RunError as exc:
        return RunResult(False, mdev.mode, settings.backend,
                         (time.monotonic() - t0) * 1e3, str(exc)), False
    return RunResult(r.passed, mdev.mode, r.outcome.backend, (time.monotonic() - t0) * 1e3,
                     r.error(), dict(r.record)), r.outcome.failure is None


# ------------------------------------------------------------------------------ the host
class DomainStore:
    """The domains gpuvm defined on its test-driver host, kept between connections."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "libvirt" / "domains"

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.dir.glob("*.xml")) if self.dir.is_dir() else []

    def entries(self) -> list[tuple[str, int]]:
        """(inactive XML, state at connect) of every kept domain."""
        out = []
        for name in self.names():
            state_file = self.dir / f"{name}.state"
            try:
                state = json.loads(state_file.read_text())["state"]
            except (OSError, ValueError, KeyError):
                state = libvirt.VIR_DOMAIN_SHUTOFF
            out.append(((self.dir / f"{name}.xml").read_text(), int(state)))
        return out

    def save(self, name: str, xml: str, state: int) -> None:
        nodedev.write_atomic(self.dir / f"{name}.xml", xml)
        nodedev.write_atomic(self.dir / f"{name}.state", json.dumps({"state": state}) + "\n")

    def remove(self, name: str) -> None:
        for suffix in (".xml", ".state"):
            (self.dir / f"{name}{suffix}").unlink(missing_ok=True)


class Host:
    """The mdev store's host through libvirt: `uri` None means gpuvm's own test-driver
    file (written from the stores), else any libvirt URI (nothing written for it)."""

    def __init__(self, mdevs: MdevStore | None = None, uri: str | None = None) -> None:
        self.mdevs = mdevs or MdevStore()
        self.domains = DomainStore(self.mdevs.root)
        self.driver_path = (self.mdevs.root / "libvirt" / "host.xml").resolve()
        self.own = uri is None
        self.uri = uri or f"test://{self.driver_path}"

    # -------------------------------------------------------------------- connection
    def write_driver_file(self) -> Path:
        nodedev.write_atomic(self.driver_path,
                             nodedev.driver_file(self.mdevs, self.domains.entries()))
        return self.driver_path

    def connect(self) -> libvirt.virConnect:
        if self.own:
            self.write_driver_file()
        try:
            return libvirt.open(self.uri)
        except libvirt.libvirtError as exc:
            raise UserError(f"cannot connect to {self.uri}: {libvirt_message(exc)}") from None

    def _keep(self, dom: libvirt.virDomain) -> None:
        """Write one domain back (its config as libvirt holds it, and its state)."""
        if self.own:
            self.domains.save(dom.name(), dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE),
                              dom.state()[0])
            self.write_driver_file()

    def lookup(self, conn: libvirt.virConnect, name: str) -> libvirt.virDomain:
        try:
            return conn.lookupByName(name)
        except libvirt.libvirtError:
            raise UserError(f"no domain {name!r} on {self.uri}") from None

    # -------------------------------------------------------------------- vGPUs
    def vgpu(self, spec: DomainSpec) -> tuple[MdevDefinition, MdevType]:
        """The defined mdev a domain's hostdev names, and its type."""
        try:
            mdev = self.mdevs.get(spec.mdev_uuid)
        except MdevTypeError:
            raise domain_xml.hostdev_fail(
                spec, f"names mdev {spec.mdev_uuid}, which is not defined on "
                      f"{', '.join(p.address for p in self.mdevs.parents)} (create it: "
                      f"gpuvm mdev create "
                      f"{spec.workload.vgpu_type or 'TYPE'} --uuid {spec.mdev_uuid})") from None
        if spec.workload.vgpu_type and spec.workload.vgpu_type != mdev.type_id:
            raise domain_xml.vgpu_fail(spec, f"expects a {spec.workload.vgpu_type} vGPU but "
                                             f"mdev {mdev.uuid} is a {mdev.type_id}")
        return mdev, mdev_types.lookup(self.mdevs.parent_of(mdev.parent).types(),
                                       mdev.type_id)

    # -------------------------------------------------------------------- commands
    def define(self, conn: libvirt.virConnect, spec: DomainSpec) -> libvirt.virDomain:
        self.vgpu(spec)
        try:
            dom = conn.defineXMLFlags(spec.xml, libvirt.VIR_DOMAIN_DEFINE_VALIDATE)
        except libvirt.libvirtError as exc:
            raise DomainXmlError(f"{spec.source}: libvirt refused the domain: "
                                 f"{libvirt_message(exc)}") from None
        self._keep(dom)
        return dom

    def spec_of(self, dom: libvirt.virDomain) -> DomainSpec:
        return domain_xml.parse(dom.XMLDesc(libvirt.VIR_DOMAIN_XML_INACTIVE),
                                f"domain {dom.name()!r}")

    def start(self, conn: libvirt.virConnect, name: str, settings: RunSettings,
              on_running: Callable[[libvirt.virDomain, MdevDefinition], None] = lambda d, m: None
              ) -> tuple[libvirt.virDomain, RunResult]:
        """Start a domain: libvirt marks it running, its guest runs on gpuvm's VMM with its
        vGPU, the result goes into its metadata, and it is shut off (the guest ended by
        itself) or destroyed (gpuvm had to stop it)."""
        dom = self.lookup(conn, name)
        if dom.isActive():
            raise UserError(f"domain {name!r} is already running")
        spec = self.spec_of(dom)
        mdev, mdev_type = self.vgpu(spec)
        for other in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
            try:
                other_uuid = self.spec_of(other).mdev_uuid
            except DomainXmlError:
                continue
            if other_uuid == mdev.uuid:
                raise domain_xml.hostdev_fail(spec, f"mdev {mdev.uuid} is in use by running "
                                                    f"domain {other.name()!r}")
        try:
            dom.create()
        except libvirt.libvirtError as exc:
            raise UserError(f"domain {name!r}: libvirt cannot start it: "
                            f"{libvirt_message(exc)}") from None
        self._keep(dom)
        on_running(dom, mdev)
        try:
            result, ended = run_on_vgpu(spec, mdev, mdev_type,
                                        self.mdevs.parent_of(mdev.parent), settings)
        except BaseException:
            dom.destroy()
            self._keep(dom)
            raise
        dom.setMetadata(libvirt.VIR_DOMAIN_METADATA_ELEMENT,
                        domain_xml.metadata_element(spec.workload, result),
                        domain_xml.PREFIX, domain_xml.NS, BOTH)
        if ended:
            dom.shutdown()
        else:
            dom.destroy()
        self._keep(dom)
        return dom, result

    def destroy(self, conn: libvirt.virConnect, name: str) -> libvirt.virDomain:
        dom = self.lookup(conn, name)
        if not dom.isActive():
            raise UserError(f"domain {name!r} is not running")
        dom.destroy()
        self._keep(dom)
        return dom

    def undefine(self, conn: libvirt.virConnect, name: str) -> None:
        dom = self.lookup(conn, name)
        if dom.isActive():
            raise UserError(f"domain {name!r} is running: destroy it first")
        dom.undefine()
        if self.own:
            self.domains.remove(name)
            self.write_driver_file()
