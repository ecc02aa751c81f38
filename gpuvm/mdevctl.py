"""Mediated-device definitions kept on disk, as `mdevctl` keeps them.

A user creates a vGPU by type (`gpuvm mdev create gpuvm-Q6000-8Q`), gets a UUID, and later
names that UUID in a run, an experiment or a libvirt domain.  The definitions live in a
state directory (one JSON file per mdev, like /etc/mdevctl.d/<parent>/<uuid>), so every
gpuvm command -- and libvirt's view of the host -- sees the same instances.  Placing them
on the parent GPU uses the mediator's own partition table, in creation order, so
`available_instances` is exactly what the mediator will find.

The state directory is $GPUVM_STATE_DIR, else $XDG_STATE_HOME/gpuvm, else
~/.local/state/gpuvm.
"""

from __future__ import annotations

import json
import os
import uuid as uuidlib
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuvm.device.profile import DeviceProfile, load_profile
from gpuvm.mediator import mdev_types
from gpuvm.mediator.mdev_types import MdevType, MdevTypeError
from gpuvm.mediator.modes import MODES
from gpuvm.mediator.partition import PartitionError, PartitionTable

PARENT_ADDRESS = "0000:01:00.0"  # the emulated GPU's PCI address on the host
DEFAULT_MODE = "fv-opt"


def state_dir() -> Path:
    if "GPUVM_STATE_DIR" in os.environ:
        return Path(os.environ["GPUVM_STATE_DIR"])
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "gpuvm"


@dataclass(frozen=True)
class MdevDefinition:
    uuid: str
    parent: str
    type_id: str
    mode: str  # the virtualization mode of this vGPU (an mdev attribute)
    order: int  # creation order: placement on the parent follows it


@dataclass(frozen=True)
class ParentGpu:
    """A physical GPU that can host mdevs: its address, profile and the types it offers."""

    address: str
    profile: DeviceProfile

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
    """The mdev definitions of one host (see the module docstring)."""

    def __init__(self, root: Path | None = None, parent: ParentGpu | None = None) -> None:
        self.root = Path(root) if root is not None else state_dir()
        self.parent = parent or ParentGpu(PARENT_ADDRESS, load_profile())

    @property
    def _dir(self) -> Path:
        return self.root / "mdev" / self.parent.address

    def list(self) -> list[MdevDefinition]:
        if not self._dir.is_dir():
            return []
        out = []
        for path in self._dir.glob("*.json"):
            try:
                out.append(MdevDefinition(**json.loads(path.read_text())))
            except (ValueError, TypeError) as exc:
                raise MdevTypeError(f"{path}: not an mdev definition ({exc})") from None
        return sorted(out, key=lambda d: d.order)

    def get(self, uuid: str) -> MdevDefinition:
        uuid = check_uuid(uuid)
        for d in self.list():
            if d.uuid == uuid:
                return d
        raise MdevTypeError(f"no mdev {uuid} on {self.parent.address}")

    def placed_table(self) -> PartitionTable:
        """The parent's partition table with every defined mdev placed, in order."""
        types = self.parent.types()
        table = self.parent.empty_table()
        for d in self.list():
            table.allocate(mdev_types.lookup(types, d.type_id).partition)
        return table

    def available(self) -> dict[str, int]:
        table = self.placed_table()
        return {t.type_id: mdev_types.available_instances(table, t)
                for t in self.parent.types().values()}

    def create(self, type_id: str, uuid: str | None = None,
               mode: str = DEFAULT_MODE) -> MdevDefinition:
        types = self.parent.types()
        mdev_type = mdev_types.lookup(types, type_id)
        if mode not in MODES or not MODES[mode].mediated:
            raise MdevTypeError(f"mode {mode!r} is not a mediated mode (have "
                                f"{', '.join(m for m in MODES if MODES[m].mediated)})")
        uuid = check_uuid(uuid) if uuid else str(uuidlib.uuid4())
        existing = self.list()
        if any(d.uuid == uuid for d in existing):
            raise MdevTypeError(f"mdev {uuid} already exists")
        try:
            self.placed_table().allocate(mdev_type.partition)
        except PartitionError:
            raise MdevTypeError(f"{type_id}: no instance available on {self.parent.address} "
                                f"(available_instances is 0)") from None
        d = MdevDefinition(uuid, self.parent.address, type_id, mode,
                           1 + max((e.order for e in existing), default=0))
        self._dir.mkdir(parents=True, exist_ok=True)
        tmp = self._dir / f".{uuid}.tmp"
        tmp.write_text(json.dumps(asdict(d), indent=1) + "\n")
        tmp.replace(self._dir / f"{uuid}.json")
        return d

    def remove(self, uuid: str) -> MdevDefinition:
        d = self.get(uuid)
        (self._dir / f"{d.uuid}.json").unlink()
        return d


# ------------------------------------------------------------------------------ output
def format_types(store: MdevStore) -> str:
    """What `mdevctl types` prints for the parent."""
    avail = store.available()
    lines = [store.parent.address]
    for t in store.parent.types().values():
        lines += [f"  {t.type_id}", f"    Available instances: {avail[t.type_id]}",
                  f"    Device API: {t.device_api}", f"    Name: {t.name}",
                  f"    Description: {t.description}"]
    return "\n".join(lines)


def format_list(store: MdevStore) -> str:
    """What `mdevctl list --defined` prints: UUID PARENT TYPE START, one line each."""
    return "\n".join(f"{d.uuid} {d.parent} {d.type_id} manual (mode={d.mode})"
                     for d in store.list())


# ------------------------------------------------------------------------------ CLI
def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="mdev_command", required=True)
    sub.add_parser("types", help="the types the GPU offers, with available instances")
    create = sub.add_parser("create", help="create an instance of a type")
    create.add_argument("type_id", metavar="TYPE")
    create.add_argument("--uuid", help="the instance's UUID (default: a new one)")
    create.add_argument("--mode", default=DEFAULT_MODE,
                        help=f"virtualization mode of this vGPU (default {DEFAULT_MODE}; "
                             f"have {', '.join(m for m in MODES if MODES[m].mediated)})")
    sub.add_parser("list", help="the instances defined on this host")
    remove = sub.add_parser("remove", help="remove an instance by UUID")
    remove.add_argument("uuid", metavar="UUID")


def main(args) -> int:
    from gpuvm.errors import UserError

    store = MdevStore()
    try:
        if args.mdev_command == "types":
            print(format_types(store))
        elif args.mdev_command == "create":
            print(store.create(args.type_id, args.uuid, args.mode).uuid)
        elif args.mdev_command == "list":
            text = format_list(store)
            if text:
                print(text)
        elif args.mdev_command == "remove":
            store.remove(args.uuid)
    except MdevTypeError as exc:
        raise UserError(str(exc)) from None
    return 0
