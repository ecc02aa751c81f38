"""Mediated-device definitions kept on disk, as `mdevctl` keeps them.

A user creates a vGPU by type (`gpuvm mdev create gpuvm-Q6000-8Q`), gets a UUID, and later
names that UUID in a run, an experiment or a libvirt domain.  The definitions live in a
state directory (one JSON file per mdev, like /etc/mdevctl.d/<parent>/<uuid>), so every
gpuvm command -- and libvirt's view of the host -- sees the same instances.  Placing them
on a parent GPU uses the mediator's own partition table, in creation order, so
`available_instances` is exactly what the mediator will find.

The host has one GPU unless `gpuvm mdev gpus N` said otherwise (kept in host.json in the
state directory, so every command sees the same parents, as every tool on a real host
sees the same PCI devices).  Parent i is the PCI function 0000:<i+1>:00.0 and emulated
GPU i of a run.  `create` places an instance on the parent it is given, else on the first
parent with an instance of that type available, as management layers do.

The state directory is $GPUVM_STATE_DIR, else $XDG_STATE_HOME/gpuvm, else
~/.local/state/gpuvm.
"""

from __future__ import annotations

import json
import textwrap
import uuid as uuidlib
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuvm.device.profile import DeviceProfile, load_profile
from gpuvm.errors import UserError
from gpuvm.mediator import mdev_types
from gpuvm.mediator.mdev_types import MdevType, MdevTypeError
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import PartitionTable
from gpuvm.state import state_dir

PARENT_ADDRESS = "0000:01:00.0"  # the first emulated GPU's PCI address on the host
DEFAULT_MODE = "fv-opt"
HOST_FILE = "host.json"  # the host's settings: {"gpus": N}
MAX_GPUS = 16


@dataclass(frozen=True)
class MdevDefinition:
    """One defined vGPU (mediated device) as mdevctl keeps it: type, parent GPU and mode,
    persisted so runs, `gpuvm serve` and libvirt find the same vGPU."""

    uuid: str
    parent: str
    type_id: str
    mode: str  # the virtualization mode of this vGPU (an mdev attribute)
    order: int  # creation order: placement on the parent follows it


def parent_address(index: int, first: str = PARENT_ADDRESS) -> str:
    """The PCI address of parent GPU `index`: one bus after another from the first."""
    dom, bus, rest = first.split(":")
    return f"{dom}:{int(bus, 16) + index:02x}:{rest}"


def parent_index(address: str, first: str = PARENT_ADDRESS) -> int:
    """Which emulated GPU of a run a parent address is (inverse of parent_address)."""
    return int(address.split(":")[1], 16) - int(first.split(":")[1], 16)


@dataclass(frozen=True)
class ParentGpu:
    """A physical GPU that can host mdevs: its address, profile and the types it offers,
    and which of the host's GPUs it is (the emulated GPU a run puts its vGPUs on)."""

    address: str
    profile: DeviceProfile
    index: int = 0

    def types(self) -> dict[str, MdevType]:
        return mdev_types.profile_types(self.profile)

    def empty_table(self) -> PartitionTable:
        return mdev_types.empty_table(self.profile)


def check_uuid(text: str) -> str:
    try:
        return str(uuidlib.UUID(text))
    except ValueError:
        raise MdevTypeError(f"{text!r} is not a UUID") from None


class MdevStore:
    """The mdev definitions of one host (see the module docstring).  `parent` is the
    first parent GPU (its address and profile; the others are the same card, one bus
    after another); `gpus` overrides the host's GPU count (host.json)."""

    def __init__(self, root: Path | None = None, parent: ParentGpu | None = None,
                 gpus: int | None = None) -> None:
        self.root = Path(root) if root is not None else state_dir()
        self._first = parent or ParentGpu(PARENT_ADDRESS, load_profile())
        self._gpus = gpus

    # ------------------------------------------------------------------ parents
    @property
    def gpu_count(self) -> int:
        if self._gpus is not None:
            return self._gpus
        path = self.root / HOST_FILE
        if not path.is_file():
            return 1
        try:
            count = json.loads(path.read_text())["gpus"]
        except (ValueError, KeyError, TypeError):
            raise MdevTypeError(f"{path}: not a host file ({{\"gpus\": N}})") from None
        if not isinstance(count, int) or not 1 <= count <= MAX_GPUS:
            raise MdevTypeError(f"{path}: gpus must be 1-{MAX_GPUS}, got {count!r}")
        return count

    def set_gpu_count(self, count: int) -> None:
        """Give the host `count` GPUs; a parent that goes away must have no mdevs."""
        if not 1 <= count <= MAX_GPUS:
            raise MdevTypeError(f"gpus must be 1-{MAX_GPUS}, got {count}")
        for parent in self.parents[count:]:
            left = self.list(parent.address)
            if left:
                raise MdevTypeError(f"{parent.address} still has {len(left)} mdev(s); "
                                    f"remove them before taking its GPU away")
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / f".{HOST_FILE}.tmp"
        tmp.write_text(json.dumps({"gpus": count}) + "\n")
        tmp.replace(self.root / HOST_FILE)
        self._gpus = None

    @property
    def parents(self) -> list[ParentGpu]:
        first = self._first
        return [first] + [ParentGpu(parent_address(i, first.address), first.profile, i)
                          for i in range(1, self.gpu_count)]

    @property
    def parent(self) -> ParentGpu:
        """The first parent GPU (the host's only one, unless it has more)."""
        return self._first

    def parent_of(self, address: str) -> ParentGpu:
        for p in self.parents:
            if p.address == address:
                return p
        raise MdevTypeError(f"no parent GPU {address} (have "
                            f"{', '.join(p.address for p in self.parents)})")

    def _dir(self, parent: ParentGpu) -> Path:
        return self.root / "mdev" / parent.address

    # ------------------------------------------------------------------ instances
    def list(self, parent: str | None = None) -> list[MdevDefinition]:
        """Every defined mdev (of one parent, if given), parent by parent, each parent's
        in creation order."""
        parents = [self.parent_of(parent)] if parent is not None else self.parents
        out = []
        for p in parents:
            if not self._dir(p).is_dir():
                continue
            mine = []
            for path in self._dir(p).glob("*.json"):
                try:
                    mine.append(MdevDefinition(**json.loads(path.read_text())))
                except (ValueError, TypeError) as exc:
                    raise MdevTypeError(f"{path}: not an mdev definition ({exc})") from None
            out += sorted(mine, key=lambda d: d.order)
        return out

    def get(self, uuid: str) -> MdevDefinition:
        uuid = check_uuid(uuid)
        for d in self.list():
            if d.uuid == uuid:
                return d
        raise MdevTypeError(f"no mdev {uuid} on this host's "
                            f"{len(self.parents)} parent GPU(s)")

    def placed_table(self, parent: str | None = None) -> PartitionTable:
        """A parent's partition table (default the first's) with every mdev defined on
        it placed, in order."""
        p = self.parent_of(parent) if parent is not None else self.parent
        types = p.types()
        table = p.empty_table()
        for d in self.list(p.address):
            table.allocate(mdev_types.lookup(types, d.type_id).partition)
        return table

    def available(self, parent: str | None = None) -> dict[str, int]:
        """available_instances of every type on a parent (default the first)."""
        p = self.parent_of(parent) if parent is not None else self.parent
        table = self.placed_table(p.address)
        return {t.type_id: mdev_types.available_instances(table, t)
                for t in p.types().values()}

    def create(self, type_id: str, uuid: str | None = None, mode: str = DEFAULT_MODE,
               parent: str | None = None) -> MdevDefinition:
        """An instance of `type_id` on `parent`, or on the first parent with one
        available."""
        mdev_type = mdev_types.lookup(self.parent.types(), type_id)
        if mode not in MODES or not MODES[mode].mediated:
            raise MdevTypeError(f"mode {mode!r} is not a mediated mode (have "
                                f"{', '.join(m for m in MODES if MODES[m].mediated)})")
        uuid = check_uuid(uuid) if uuid else str(uuidlib.uuid4())
        existing = self.list()
        if any(d.uuid == uuid for d in existing):
            raise MdevTypeError(f"mdev {uuid} already exists")
        candidates = [self.parent_of(parent)] if parent is not None else self.parents
        target = next((p for p in candidates
                       if mdev_types.fits(self.placed_table(p.address), mdev_type.partition)),
                      None)
        if target is None:
            where = candidates[0].address if parent is not None else \
                f"any of {len(candidates)} parent GPU(s)"
            raise MdevTypeError(f"{type_id}: no instance available on {where} "
                                f"(available_instances is 0)")
        # creation order is host-wide, so an mdev's IOMMU group number is unique
        d = MdevDefinition(uuid, target.address, type_id, mode,
                           1 + max((e.order for e in existing), default=0))
        directory = self._dir(target)
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{uuid}.tmp"
        tmp.write_text(json.dumps(asdict(d), indent=1) + "\n")
        tmp.replace(directory / f"{uuid}.json")
        return d

    def remove(self, uuid: str) -> MdevDefinition:
        d = self.get(uuid)
        (self._dir(self.parent_of(d.parent)) / f"{d.uuid}.json").unlink()
        return d


# ------------------------------------------------------------------------------ output
def format_types(store: MdevStore, parent: str | None = None) -> str:
    """What `mdevctl types` prints: each parent (or the one given) and its types, a
    description longer than 80 columns wrapped under itself (never cut)."""
    lines = []
    for p in [store.parent_of(parent)] if parent is not None else store.parents:
        avail = store.available(p.address)
        lines.append(p.address)
        for t in p.types().values():
            lines += [f"  {t.type_id}", f"    Available instances: {avail[t.type_id]}",
                      f"    Device API: {t.device_api}", f"    Name: {t.name}",
                      textwrap.fill(f"    Description: {t.description}", 80,
                                    subsequent_indent=" " * 17, break_on_hyphens=False)]
    return "\n".join(lines)


def format_list(store: MdevStore, parent: str | None = None) -> str:
    """What `mdevctl list --defined` prints (UUID PARENT TYPE), one line each, with the
    vGPU's mode where mdevctl says the start policy (always manual here): at most 77
    columns, so a line is whole at 80 and its fields split on spaces."""
    return "\n".join(f"{d.uuid} {d.parent} {d.type_id} {d.mode}"
                     for d in store.list(parent))


# ------------------------------------------------------------------------------ CLI
def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="mdev_command", required=True)
    types = sub.add_parser("types", help="the types each parent GPU offers, with available "
                                         "instances")
    types.add_argument("--parent", metavar="ADDR", help="only this parent GPU")
    create = sub.add_parser("create", help="create an instance of a type")
    create.add_argument("type_id", metavar="TYPE")
    create.add_argument("--uuid", help="the instance's UUID (default: a new one)")
    create.add_argument("--mode", default=DEFAULT_MODE,
                        help=f"virtualization mode of this vGPU (default {DEFAULT_MODE}; "
                             f"have {', '.join(m for m in MODES if MODES[m].mediated)})")
    create.add_argument("--parent", metavar="ADDR",
                        help="the parent GPU (default: the first with an instance of the "
                             "type available)")
    listing = sub.add_parser("list", help="the instances defined on this host")
    listing.add_argument("--parent", metavar="ADDR", help="only this parent GPU's")
    remove = sub.add_parser("remove", help="remove an instance by UUID")
    remove.add_argument("uuid", metavar="UUID")
    gpus = sub.add_parser("gpus", help="the host's parent GPUs; with N, give the host N GPUs")
    gpus.add_argument("count", nargs="?", type=int, metavar="N",
                      help=f"how many GPUs the host has (1-{MAX_GPUS}; default 1)")


def main(args) -> int:
    store = MdevStore()
    try:
        if args.mdev_command == "types":
            print(format_types(store, args.parent))
        elif args.mdev_command == "create":
            print(store.create(args.type_id, args.uuid, args.mode, args.parent).uuid)
        elif args.mdev_command == "list":
            text = format_list(store, args.parent)
            if text:
                print(text)
        elif args.mdev_command == "remove":
            store.remove(args.uuid)
        elif args.mdev_command == "gpus":
            if args.count is not None:
                store.set_gpu_count(args.count)
            for p in store.parents:
                print(f"{p.address} {p.profile.name} GPU {p.index} "
                      f"({len(store.list(p.address))} mdev(s))")
    except MdevTypeError as exc:
        raise UserError(str(exc)) from None
    return 0
