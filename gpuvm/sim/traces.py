"""The event streams the model replays, recorded once per (benchmark, parameters, mode,
driver, cost profile).

A stream is what one VM did when it ran alone on the emulator's virtual clock: each exit
at its price and its part under the mediator's lock, each doorbell with the engine time
its submission took, each wait on the GPU (gpuvm.device.clock.EventStream).  Virtual time
is deterministic, so one run serves every replay; the cache is results/traces/<key>.json
under the current directory (never the installation), and `refresh` re-records it (after
a change to the guests, the mediator or the profile).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuvm.experiment.costs import load_costs
from gpuvm.mediator.modes import MODES
from gpuvm.run import run_vms
from gpuvm.run.spec import RunOptions, VmSpec
from gpuvm.sim.stream_replay import VmStream

CACHE = Path("results") / "traces"
# what a stream depends on besides its key: the emulator's and the guests' sources
_SOURCES = ("gpuvm/device", "gpuvm/mediator", "gpuvm/vmm", "gpuvm/run", "shadow",
            "scheduler", "guest_tools")
# 7: priced event streams of the virtual clock (6: per-phase counts; 5 and before:
# per-event wall-time traces)
FORMAT = 7


@dataclass(frozen=True)
class TraceKey:
    """What a recorded event stream depends on (benchmark, parameters, mode, driver, cost
    profile): the cache key, so a stream is recorded once."""

    benchmark: str
    params: tuple[int, ...]
    mode: str
    profile: str = "xen-2014"

    @property
    def driver(self) -> str:
        """The guest binary the mode runs (native and every fv mode share one)."""
        return "pv" if MODES[self.mode].pv else "direct"

    @property
    def file_name(self) -> str:
        params = "-".join(str(p) for p in self.params) or "default"
        profile = Path(self.profile).stem
        return (f"{self.benchmark}_{params}_{self.mode.replace('+', 'plus')}_{self.driver}"
                f"_{profile}.json")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """A digest of the sources a stream comes from, so a cached stream recorded by other
    code (a changed driver, mediator or clock) is recorded again, never replayed stale."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for top in _SOURCES:
        for path in sorted((root / top).rglob("*")):
            if path.suffix in (".py", ".c", ".h", ".S", ".ld") and path.is_file():
                digest.update(str(path.relative_to(root)).encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _profile_fingerprint(profile: str) -> str:
    return hashlib.sha256(repr(load_costs(profile)).encode()).hexdigest()[:16]


def record_run(key: TraceKey, backend: str) -> VmStream:
    """One VM of `key` run once, alone, on the virtual clock; its stream (not cached)."""
    prices = load_costs(key.profile).event_prices(MODES[key.mode].mediated)
    (result,) = run_vms([VmSpec("vm", key.benchmark, list(key.params))],
                        RunOptions(mode=key.mode, backend=backend, prices=prices))
    if not result.passed:
        raise RuntimeError(f"recording {key.file_name}: the VM failed: {result.error()}")
    return VmStream("vm", tuple(tuple(e) for e in result.session.clock_party.stream.entries))


def read_trace(path: Path, key: TraceKey) -> VmStream | None:
    """The cached stream, or None where it is of another format, was recorded by other
    code or prices, or is unreadable."""
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("format") == FORMAT and \
                data.get("code") == code_fingerprint() and \
                data.get("prices") == _profile_fingerprint(key.profile):
            return VmStream.from_json(data["stream"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return None


def load_trace(key: TraceKey, backend: str = "auto", refresh: bool = False,
               cache: Path = CACHE) -> VmStream:
    """The stream of `key`, recorded now if it is not cached (or `refresh`)."""
    path = cache / key.file_name
    if not refresh:
        stream = read_trace(path, key)
        if stream is not None:
            return stream
    stream = record_run(key, backend)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")  # a partial file never replaces a whole one
    tmp.write_text(json.dumps({"format": FORMAT, "key": asdict(key) | {"driver": key.driver},
                               "code": code_fingerprint(),
                               "prices": _profile_fingerprint(key.profile),
                               "stream": stream.to_json()}))
    tmp.replace(path)
    return stream
