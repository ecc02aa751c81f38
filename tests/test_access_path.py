"""The path of one access, as docs/development.md and the README state it, pinned.

A guest doorbell (GP_PUT through BAR1, fv, KVM) and a BAR0 register store are followed
from the vCPU's exit handler (ExitLoop._dispatch) to the device, with hooks that capture
the real call stack where each arrives, and the hops counted as the docs count them:

- the frames on the stack that are project code (gpuvm/, shadow/, scheduler/), in order;
- a hop is a call from one frame to the next, except a method calling a method of its
  own object (a private helper is no hop: `self` is the same);
- a back-edge is a hop whose callee holds the caller as one of its attributes (an owner
  called back by what it owns: a vGPU's part calling the vGPU, the scheduler calling
  the mediator that made it, the dispatcher calling its Submissions);
- the doorbell crosses threads once: the vCPU's thread hands it to Submissions.submit,
  the scheduler's thread rings it from Submissions' own loop -- one object, no hop.

And statically: no part of a vGPU imports the vGPU or the mediator, no block of the
device imports the Gpu.
"""

from __future__ import annotations

import ast
import sys
import threading
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuvm.device import regs
from gpuvm.device.gpu import Gpu
from gpuvm.device.pfifo import Pfifo
from gpuvm.mediator.submission import Submissions
from gpuvm.run import run_vms
from gpuvm.run.spec import RunOptions, VmSpec
from gpuvm.vmm.kvm import kvm_usable

KVM_USABLE, KVM_WHY = kvm_usable()
ROOT = Path(__file__).resolve().parent.parent
PROJECT = tuple(str(ROOT / d) + "/" for d in ("gpuvm", "shadow", "scheduler"))
EXIT_HANDLER = "ExitLoop._dispatch"
# what docs/development.md and the README say; change them together
DOORBELL_HOPS = 6
BAR0_STORE_HOPS = 3


@dataclass(frozen=True)
class Frame:
    name: str  # module-relative qualified name, e.g. "gpuvm/mediator/vgpu.py:VGpu.write"
    self: object  # the frame's `self`, or None


def _stack(frame: types.FrameType | None) -> list[Frame]:
    """The project frames from the outermost to `frame` (the hook's caller)."""
    out = []
    while frame is not None:
        code = frame.f_code
        if code.co_filename.startswith(PROJECT):
            rel = Path(code.co_filename).relative_to(ROOT)
            out.append(Frame(f"{rel}:{code.co_qualname}", frame.f_locals.get("self")))
        frame = frame.f_back
    return out[::-1]


def _from(stack: list[Frame], qualname: str) -> list[Frame]:
    names = [f.name.split(":", 1)[1] for f in stack]
    assert qualname in names, f"{qualname} not on the stack: {names}"
    return stack[names.index(qualname):]


def _hops(path: list[Frame]) -> list[tuple[Frame, Frame]]:
    return [(a, b) for a, b in zip(path, path[1:])
            if a.self is None or b.self is None or a.self is not b.self]


def _owns(owner: object, part: object) -> bool:
    """Whether `owner` holds `part` (an attribute, or the object of a bound method)."""
    for value in getattr(owner, "__dict__", {}).values():
        if value is part or getattr(value, "__self__", None) is part:
            return True
    return False


def _back_edges(hops: list[tuple[Frame, Frame]]) -> list[str]:
    return [f"{a.name} -> {b.name}" for a, b in hops
            if a.self is not None and b.self is not None and _owns(b.self, a.self)]


def _describe(hops: list[tuple[Frame, Frame]]) -> str:
    return " -> ".join([hops[0][0].name] + [b.name for _, b in hops]) if hops else "(none)"


@pytest.fixture(scope="module")
def paths():
    """One fv guest on KVM, the stacks captured where its first doorbell and its first
    channel-table store reach the scheduler and the device."""
    seen: dict[str, list[Frame]] = {}
    lock = threading.Lock()
    originals = {(Submissions, "submit"): Submissions.submit,
                 (Pfifo, "doorbell"): Pfifo.doorbell, (Gpu, "mmio_write"): Gpu.mmio_write}

    def keep(key: str, callee: Frame) -> None:
        """The stack of the hook's caller, and the hooked method's own frame after it."""
        with lock:
            if key not in seen:
                seen[key] = _stack(sys._getframe(2)) + [callee]

    def submit(self, *args, **kwargs):
        keep("submit", Frame("gpuvm/mediator/submission.py:Submissions.submit", self))
        return originals[(Submissions, "submit")](self, *args, **kwargs)

    def doorbell(self, chid):
        keep("doorbell", Frame("gpuvm/device/pfifo.py:Pfifo.doorbell", self))
        return originals[(Pfifo, "doorbell")](self, chid)

    def mmio_write(self, bar, offset, size, value):
        if bar == regs.BAR0 and regs.PFIFO_CHAN_TABLE <= offset < \
                regs.PFIFO_CHAN_TABLE + regs.NUM_CHANNELS * regs.PFIFO_CHAN_STRIDE and \
                value & regs.PFIFO_CHAN_VALID and "bar0" not in seen:
            stack = _stack(sys._getframe(1))
            if any(f.name.endswith(EXIT_HANDLER) for f in stack):
                with lock:
                    seen.setdefault("bar0", stack + [Frame("gpuvm/device/gpu.py:Gpu.mmio_write",
                                                           self)])
        return originals[(Gpu, "mmio_write")](self, bar, offset, size, value)

    Submissions.submit, Pfifo.doorbell, Gpu.mmio_write = submit, doorbell, mmio_write
    try:
        (result,) = run_vms([VmSpec("vm0", "vecadd", [64])],
                            RunOptions(mode="fv", backend="kvm"))
    finally:
        for (cls, name), fn in originals.items():
            setattr(cls, name, fn)
    assert result.passed, result.error()
    return seen


@pytest.mark.skipif(not KVM_USABLE, reason=KVM_WHY)
def test_a_doorbell_takes_six_hops_to_pfifo_and_none_back(paths):
    to_scheduler = _from(paths["submit"], EXIT_HANDLER)
    # the scheduler's thread starts in Submissions' own loop: the same object as the
    # vCPU thread's last frame, so the hand-over is no hop
    on_scheduler = _from(paths["doorbell"], "Submissions._loop")
    assert to_scheduler[-1].self is on_scheduler[0].self
    hops = _hops(to_scheduler) + _hops(on_scheduler)
    path = _describe(_hops(to_scheduler)) + " || " + _describe(_hops(on_scheduler))
    assert not _back_edges(hops), (_back_edges(hops), path)
    assert len(hops) == DOORBELL_HOPS, path
    assert on_scheduler[-1].name.endswith("Pfifo.doorbell")


@pytest.mark.skipif(not KVM_USABLE, reason=KVM_WHY)
def test_a_bar0_register_store_takes_three_hops_to_the_device_and_none_back(paths):
    path = _from(paths["bar0"], EXIT_HANDLER)
    hops = _hops(path)
    assert not _back_edges(hops), (_back_edges(hops), _describe(hops))
    assert len(hops) == BAR0_STORE_HOPS, _describe(hops)
    assert [b.name.split(":")[1] for _, b in hops] == [
        "VGpu.write", "Channels.table_write", "Gpu.reg_write"]


# the parts, and the owners none of them may import (even for a type): a part that
# imports its owner is one that can reach back up through it
PARTS = {
    "gpuvm/mediator": (("channel_table", "channels", "shadowing", "hypercalls", "bar0_traps",
                        "vm_faults", "meter", "host_port", "submission"),
                       ("gpuvm.mediator.vgpu", "gpuvm.mediator.mediator")),
    "gpuvm/device": (("pfifo", "channel", "channel_memory", "bar_aperture", "events",
                      "engine_classes", "blocks/pbdma", "blocks/pbus", "blocks/pcopy",
                      "blocks/pfb", "blocks/pgraph", "blocks/pmc", "blocks/pramin",
                      "blocks/ptimer"),
                     ("gpuvm.device.gpu",)),
}


@pytest.mark.parametrize("package", sorted(PARTS))
def test_no_part_imports_its_owner(package):
    """Each part is handed its collaborators: none imports the vGPU, the mediator or the
    Gpu that builds it (which also keeps the import graph free of circles there)."""
    modules, owners = PARTS[package]
    found = []
    for module in modules:
        path = ROOT / package / f"{module}.py"
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            found += [f"{package}/{module}.py imports {n}" for n in names if n in owners]
    assert not found
