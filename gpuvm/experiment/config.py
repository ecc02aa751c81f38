"""Experiment files: what to run, in TOML.

An experiment is a set of scenarios (each a list of VMs with their benchmark, share,
start time and partition), run under each of its modes and scheduler policies, a number
of times.  Every key is checked: a typo or a wrong type is one line naming the file and
the field, before anything runs.

    [experiment]
    name = "modes"            # results go to results/<name>/ unless `output` says otherwise
    kind = "benchmarks"       # or "isolation", "hostmem", "scaling", "oversubscription",
                              # "suite": the report
    include = ["a.toml"]      # kind = "suite" only: the experiments it runs, in order
                              # (relative to this file); a suite has no scenarios
    modes = ["native", "fv", "fv-opt", "pv"]
    policies = ["fifo"]       # fifo | credit | band
    backend = "auto"          # kvm | inproc | auto
    isolated = false          # each VM in its own VMM process over vfio-user (same rows)
    repetitions = 1           # every point (scenario x mode x policy) runs this many times
    order = "rounds"          # one run of every point a round, round after round; or
                              # "points": each point's runs back to back
    time_scale = 1.0          # device clock speed relative to wall time
    clock = "virtual"         # each event a guest causes takes its price in
                              # cost_profile, so results repeat on any host; or "wall"
    cost_profile = "xen-2014" # experiments/costs/<name>.toml: modelled time
    vram_mib = 256            # the emulated GPU's VRAM (default: the device profile's)
    hostmem_profiles = ["gpu-h200"]  # host-memory prices for the hostmem report (costs.py)

    [scheduler]               # parameters shared by every policy (scheduler.SchedulerParams)
    period_ms = 30

    [[scenario]]
    name = "mmul"
    [[scenario.vm]]
    name = "vm"
    benchmark = "mmul"
    params = [256]
    count = 4                 # four such VMs: vm0 .. vm3
    share = 1.0
    start_s = 0.0
    partition = { vram_mib = 512 }
                              # or, instead of a partition, a vGPU (mdev) type:
                              # type = "gpuvm-Q6000-4Q" (default: the GPU's default type)
    working_set_mib = 96      # oversubscription: VRAM the model keeps resident for it
                              # (default: its partition's or type's framebuffer)
    ram_alloc = "immediate"   # or "ondemand": guest RAM allocated as it is touched
                              # (default: $GPUVM_RAM_ALLOC, else immediate)
    ram_backing = "anon"      # or "4k", "thp"; and hostmem_report, pin_chunks,
                              # pin_chunk_kib, nohugepage_pinned, pin_hot_from,
                              # hot_threshold (experiments/hostmem.toml uses them)

    [[scenario]]              # VMs may also be libvirt domain files (gpuvm.libvirt):
    name = "from-domains"     # each gets its vGPU type's partition and weight
    domains = ["domains/vecadd.xml", "domains/madd.xml"]
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuvm.device import regs
from gpuvm.device.clock import CLOCKS
from gpuvm.experiment.costs import load_costs
from gpuvm.mediator.mdev_types import MdevTypeError, lookup
from gpuvm.mediator.modes import MODES
from gpuvm.run.mediated import gpu_types, machine_profile
from gpuvm.run.spec import RunOptions
from gpuvm.vmm import abi, guest_programs
from gpuvm.vmm.guest_ram import ALLOCATIONS, default_allocation
from gpuvm.vmm.backends import BACKENDS
from scheduler import POLICIES, SchedulerParams

REPO = Path(__file__).resolve().parents[2]
KINDS = ("benchmarks", "isolation", "hostmem", "scaling", "oversubscription", "suite")
ORDERS = ("rounds", "points")  # the order of an experiment's runs (rundir.plan)
PARTITION_KEYS = {"vram_mib": "vram_size", "channels": "channels", "bar1_mib": "bar1_size",
                  "bar3_mib": "bar3_size", "shadow_mib": "shadow_size"}


class ConfigError(ValueError):
    """One line: the file, the field, what is wrong."""


@dataclass(frozen=True)
class VmConfig:
    name: str
    benchmark: str
    params: tuple[int, ...] = ()
    share: float = 1.0
    start_s: float = 0.0
    ram_mib: int = abi.GUEST_RAM_DEFAULT // regs.MiB
    partition: dict[str, int] = field(default_factory=dict)  # PartitionSpec fields, bytes
    inject: str | None = None
    # host memory (issue 16; gpuvm/run/spec.py VmSpec says what each does)
    ram_backing: str = "anon"
    ram_alloc: str = field(default_factory=default_allocation)  # VmSpec.ram_alloc
    hostmem_report: bool = False
    pin_chunks: bool = False
    pin_chunk_kib: int = 4096
    nohugepage_pinned: bool = False
    # smart pinning: "scenario/vm" whose history (same mode, policy, rep) picks this VM's
    # hot mask (params[3]): the allocations transferred more than hot_threshold times
    pin_hot_from: str = ""
    hot_threshold: int = 1
    # VRAM oversubscription (the model's side; gpuvm.sim.residency): the VRAM this VM keeps
    # in use, which must be resident while it runs (None: its partition's framebuffer)
    working_set_mib: int | None = None
    mdev_type: str | None = None  # the vGPU's type, where no partition is given


@dataclass(frozen=True)
class Scenario:
    name: str
    vms: tuple[VmConfig, ...]


@dataclass(frozen=True)
class Experiment:
    name: str
    kind: str
    scenarios: tuple[Scenario, ...]
    modes: tuple[str, ...] = ("fv-opt",)
    policies: tuple[str, ...] = ("fifo",)
    backend: str = "auto"
    isolated: bool = False  # VMs in VMM processes over vfio-user; counts are the same
    repetitions: int = 1
    # "rounds": repetition r of every point, then r + 1 (rundir.plan says why);
    # "points": each point's runs back to back
    order: str = "rounds"
    time_scale: float = 1.0
    timeout_s: float = 600.0
    clock: str = "virtual"  # "virtual" | "wall" (gpuvm/device/clock.py)
    cost_profile: str = "xen-2014"
    scheduler: dict[str, Any] = field(default_factory=dict)
    description: str = ""
    output: Path = Path("results")
    source: str = ""
    includes: tuple[Path, ...] = ()  # kind "suite": the experiment files it runs
    # host-memory cost profiles the hostmem report prices each row with (costs.py)
    hostmem_profiles: tuple[str, ...] = ("gpu-h200",)
    vram_mib: int | None = None  # the emulated GPU's VRAM (None: the device profile's)


class _Table:
    """Typed access to one TOML table that remembers where it is, for error messages."""

    def __init__(self, data: Any, where: str, source: str) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{source}: {where} must be a table")
        self.data, self.where, self.source = data, where, source
        self.used: set[str] = set()

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {self.where}.{key}: {message}")

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ...,
            check: Any = None) -> Any:
        self.used.add(key)
        if key not in self.data:
            if default is ...:
                raise self.fail(key, "missing")
            return default
        value = self.data[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind is float and isinstance(value, float) and not math.isfinite(value):
            raise self.fail(key, f"must be a finite number, got {value!r}")
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.fail(key, f"must be a {names}, got {value!r}")
        if check is not None:
            problem = check(value)
            if problem:
                raise self.fail(key, problem)
        return value

    def done(self) -> None:
        unknown = sorted(set(self.data) - self.used)
        if unknown:
            raise self.fail(unknown[0], "unknown key")



def _cost_profile_problem(name: str) -> str | None:
    """Why the cost profile `name` cannot price a run (None: it can), so a bad one is
    refused with the experiment file's other errors, before anything is written."""
    try:
        load_costs(name)
    except ValueError as exc:
        return str(exc)
    return None

def _positive(v: float) -> str | None:
    return None if v > 0 else "must be > 0"


def _names(allowed: tuple[str, ...] | list[str], what: str):
    def check(values: list) -> str | None:
        if not values:
            return f"needs at least one {what}"
        bad = [v for v in values if v not in allowed]
        return f"unknown {what} {bad[0]!r} (have {', '.join(allowed)})" if bad else None
    return check


def _vm(t: _Table) -> list[VmConfig]:
    name = t.get("name", str)
    benchmark = t.get("benchmark", str, check=lambda b: None if b in guest_programs.BENCHMARKS
                      else f"unknown benchmark (have {', '.join(guest_programs.BENCHMARKS)})")
    params = t.get("params", list, [])
    if len(params) > guest_programs.BENCH_NUM_PARAMS or \
            any(not isinstance(p, int) or isinstance(p, bool) or p < 0 for p in params):
        raise t.fail("params", f"must be at most {guest_programs.BENCH_NUM_PARAMS} "
                               "non-negative integers")
    if benchmark != "probe" and params and params[0] == 0:  # as `gpuvm run --size 0`
        raise t.fail("params", f"params[0] = 0 (size 0) means nothing to {benchmark}; "
                               "leave params out for its default")
    count = t.get("count", int, 1, check=lambda c: None if c >= 1 else "must be >= 1")
    share = t.get("share", float, 1.0, check=_positive)
    start = t.get("start_s", float, 0.0, check=lambda s: None if s >= 0 else "must be >= 0")
    ram = t.get("ram_mib", int, abi.GUEST_RAM_DEFAULT // regs.MiB, check=_positive)
    inject = t.get("inject", str, None, check=lambda i: None if i in abi.FI_NAMES
                   else f"unknown fault injection (have {', '.join(sorted(abi.FI_NAMES))})")
    part_table = _Table(t.get("partition", dict, {}), f"{t.where}.partition", t.source)
    partition = {}
    for key, field_name in PARTITION_KEYS.items():
        value = part_table.get(key, int, None, check=_positive)
        if value is not None:
            partition[field_name] = value if key == "channels" else value * regs.MiB
    part_table.done()
    extra = dict(  # host memory (issue 16), oversubscription (issue 17)
        ram_backing=t.get("ram_backing", str, "anon", check=lambda b: None
                          if b in ("anon", "4k", "thp") else "must be one of anon, 4k, thp"),
        ram_alloc=t.get("ram_alloc", str, default_allocation(), check=lambda a: None
                        if a in ALLOCATIONS else f"must be one of {', '.join(ALLOCATIONS)}"),
        hostmem_report=t.get("hostmem_report", bool, False),
        pin_chunks=t.get("pin_chunks", bool, False),
        pin_chunk_kib=t.get("pin_chunk_kib", int, 4096, check=lambda k: None
                            if k >= 4 and not k & (k - 1) else "must be a power of two >= 4"),
        nohugepage_pinned=t.get("nohugepage_pinned", bool, False),
        pin_hot_from=t.get("pin_hot_from", str, "", check=lambda f: None if f.count("/") == 1
                           else "must be \"scenario/vm\""),
        hot_threshold=t.get("hot_threshold", int, 1, check=lambda h: None if h >= 0
                            else "must be >= 0"),
        working_set_mib=t.get("working_set_mib", int, None, check=_positive),
        mdev_type=t.get("type", str, None, check=lambda n: None if n else "must be a type id"),
    )
    if extra["mdev_type"] and partition:
        raise t.fail("type", "give a type or a partition, not both")
    t.done()
    names = [name] if count == 1 else [f"{name}{i}" for i in range(count)]
    return [VmConfig(n, benchmark, tuple(params), share, start, ram, partition, inject,
                     **extra) for n in names]


def _domain_vms(files: list[str], source: str, where: str) -> list[VmConfig]:
    """VMs written as libvirt domain files (relative to the experiment file): each gets
    its vGPU type's partition and scheduler weight, its <memory> and its workload."""
    if not files:
        return []
    from dataclasses import asdict

    from gpuvm.errors import UserError
    from gpuvm.libvirt.placement import domain_vms
    from gpuvm.mdevctl import MdevStore

    base = Path(source).parent if source != "<config>" else Path.cwd()
    try:
        vms = domain_vms([base / f for f in files], MdevStore())
    except UserError as exc:
        raise ConfigError(f"{source}: {where}: {exc}") from None
    return [VmConfig(spec.name, spec.workload.benchmark, spec.workload.params,
                     share=vgpu.weight, ram_mib=spec.memory // regs.MiB,
                     ram_alloc=spec.memory_alloc,
                     partition=asdict(vgpu.partition), inject=spec.workload.inject)
            for spec, vgpu in vms]


def parse(text: str, source: str = "<config>") -> Experiment:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: not valid TOML: {exc}") from None
    root = _Table(data, "<top>", source)
    exp = _Table(root.get("experiment", dict), "experiment", source)
    sched = root.get("scheduler", dict, {})
    try:
        SchedulerParams.from_dict(sched)
    except ValueError as exc:
        raise ConfigError(f"{source}: scheduler: {exc}") from None
    raw_scenarios = root.get("scenario", list, [])
    root.done()
    name = exp.get("name", str, check=lambda n: None if n and "/" not in n
                   else "must be a non-empty name without '/'")
    result = dict(
        name=name,
        kind=exp.get("kind", str, "benchmarks", check=lambda k: None if k in KINDS
                     else f"must be one of {', '.join(KINDS)}"),
        modes=tuple(exp.get("modes", list, ["fv-opt"], check=_names(list(MODES), "mode"))),
        policies=tuple(exp.get("policies", list, ["fifo"],
                               check=_names(sorted(POLICIES), "policy"))),
        backend=exp.get("backend", str, "auto", check=lambda b: None if b in BACKENDS
                        else f"must be one of {', '.join(BACKENDS)}"),
        isolated=exp.get("isolated", bool, False),
        repetitions=exp.get("repetitions", int, 1, check=_positive),
        order=exp.get("order", str, "rounds", check=lambda o: None if o in ORDERS
                      else f"must be one of {', '.join(ORDERS)}"),
        time_scale=exp.get("time_scale", float, 1.0, check=_positive),
        timeout_s=exp.get("timeout_s", float, 600.0, check=_positive),
        clock=exp.get("clock", str, "virtual",
                      check=lambda c: None if c in CLOCKS
                      else f"must be one of {', '.join(CLOCKS)}"),
        cost_profile=exp.get("cost_profile", str, "xen-2014", check=_cost_profile_problem),
        description=exp.get("description", str, ""),
        output=Path(exp.get("output", str, f"results/{name}")),
        hostmem_profiles=tuple(exp.get("hostmem_profiles", list, ["gpu-h200"],
                                       check=lambda ps: None if ps and all(
                                           isinstance(p, str) for p in ps)
                                       else "must be a non-empty list of profile names")),
        vram_mib=exp.get("vram_mib", int, None, check=_positive),
        scheduler=sched, source=source,
    )
    includes = exp.get("include", list, [], check=lambda fs: None if all(
        isinstance(f, str) and f for f in fs) else "must be a list of experiment file paths")
    exp.done()
    if result["kind"] == "isolation" and result["backend"] == "inproc" \
            and not result["isolated"]:
        raise ConfigError(f"{source}: experiment.backend: an isolation experiment needs "
                          f"kvm (in-process guests are not confined from one another)")
    if result["kind"] == "hostmem" or "hostmem_profiles" in exp.data:
        from gpuvm.experiment.costs import load_hostmem_costs

        for profile in result["hostmem_profiles"]:
            try:
                load_hostmem_costs(profile)
            except ValueError as exc:
                raise ConfigError(f"{source}: experiment.hostmem_profiles: {exc}") from None
    if result["kind"] == "suite" or includes:
        return _suite(result, includes, raw_scenarios, source)
    if not raw_scenarios:
        raise ConfigError(f"{source}: scenario: needs at least one [[scenario]]")
    scenarios = []
    for i, raw in enumerate(raw_scenarios):
        st = _Table(raw, f"scenario[{i}]", source)
        sname = st.get("name", str)
        domain_files = st.get("domains", list, [], check=lambda fs: None if all(
            isinstance(f, str) for f in fs) else "must be a list of domain XML file paths")
        vms_raw = st.get("vm", list, ... if not domain_files else [])
        st.done()
        vms: list[VmConfig] = []
        for j, vm in enumerate(vms_raw):
            vms.extend(_vm(_Table(vm, f"scenario[{i}].vm[{j}]", source)))
        vms.extend(_domain_vms(domain_files, source, f"scenario[{i}].domains"))
        if not vms:
            raise ConfigError(f"{source}: scenario[{i}].vm: needs at least one [[scenario.vm]]")
        if len({v.name for v in vms}) != len(vms):
            raise ConfigError(f"{source}: scenario[{i}].vm: VM names repeat")
        scenarios.append(Scenario(sname, tuple(vms)))
    if len({s.name for s in scenarios}) != len(scenarios):
        raise ConfigError(f"{source}: scenario: names repeat")
    _check_types(scenarios, result["vram_mib"], source)
    for i, scenario in enumerate(scenarios):
        earlier = {f"{s.name}/{v.name}": v for s in scenarios[:i] for v in s.vms}
        for vm in scenario.vms:
            src = earlier.get(vm.pin_hot_from)
            if vm.pin_hot_from and (src is None or not src.hostmem_report):
                raise ConfigError(f"{source}: scenario[{i}] VM {vm.name}: pin_hot_from "
                                  f"{vm.pin_hot_from!r} is not a reporting VM of an earlier "
                                  "scenario")
    return Experiment(scenarios=tuple(scenarios), **result)


def _check_types(scenarios: list[Scenario], vram_mib: int | None, source: str) -> None:
    """Every VM's vGPU type must be one the experiment's GPU has (as `gpuvm run --type`
    is checked), before anything runs rather than as a run that fails."""
    types = None
    for i, scenario in enumerate(scenarios):
        for vm in scenario.vms:
            if vm.mdev_type is None:
                continue
            if types is None:
                types = gpu_types(machine_profile(RunOptions(
                    vram_size=vram_mib * regs.MiB if vram_mib else None)))
            try:
                lookup(types, vm.mdev_type)
            except MdevTypeError as exc:
                raise ConfigError(f"{source}: scenario[{i}] VM {vm.name}: type: "
                                  f"{exc}") from None


def _suite(result: dict[str, Any], includes: list[str], raw_scenarios: Any,
           source: str) -> Experiment:
    """A suite runs other experiment files one after another (each gets its own run
    directory and report) and then writes one report over all of them."""
    if result["kind"] != "suite":
        raise ConfigError(f"{source}: experiment.include: only a kind = \"suite\" "
                          "experiment includes others")
    if not includes:
        raise ConfigError(f"{source}: experiment.include: a suite needs at least one file")
    if raw_scenarios:
        raise ConfigError(f"{source}: scenario: a suite has none (its files have them)")
    base = Path(source).parent if source != "<config>" else Path.cwd()
    paths = tuple(base / f for f in includes)
    for path, name in zip(paths, includes):
        if not path.is_file():
            raise ConfigError(f"{source}: experiment.include: {name}: no such file")
    return Experiment(scenarios=(), includes=paths, **result)


def load(path: str | Path) -> Experiment:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    return parse(text, str(path))
