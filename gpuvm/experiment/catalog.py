"""The experiments that ship with gpuvm, and how a name or a path becomes an experiment file.

Why: a `pip install .` user has no checkout, so `gpuvm experiment paper` must find the
experiment files (and the domain XML and cost profiles they name, by paths relative to
themselves) inside the installed package; setup.py installs the checkout's experiments/
there as gpuvm/experiment/files.  In a checkout (or an editable install) the files are
read where they are.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

INSTALLED = Path(__file__).resolve().parent / "files"
CHECKOUT = Path(__file__).resolve().parents[2] / "experiments"


class NoSuchExperiment(ValueError):
    """One line: what was asked for, and the names that ship."""


def directory() -> Path:
    """Where the shipped experiment files are: the installed package's copy, else the
    checkout's experiments/."""
    return INSTALLED if INSTALLED.is_dir() else CHECKOUT


@dataclass(frozen=True)
class Shipped:
    """An experiment file that ships with gpuvm, as `gpuvm experiment --list` shows it."""

    name: str  # the file's stem: what `gpuvm experiment NAME` takes
    path: Path
    kind: str
    description: str


def shipped() -> list[Shipped]:
    """Every experiment file that ships, by name; a file that does not parse as TOML is
    listed with that said (loading it names the culprit)."""
    out = []
    for path in sorted(directory().glob("*.toml")):
        try:
            exp = tomllib.loads(path.read_text()).get("experiment", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            exp = {"description": f"(unreadable: {exc})"}
        out.append(Shipped(path.stem, path, str(exp.get("kind", "benchmarks")),
                           " ".join(str(exp.get("description", "")).split())))
    return out


def resolve(given: str | Path) -> Path:
    """A path that exists is that file; otherwise a bare name (no '/', no .toml) is the
    shipped experiment of that name."""
    path = Path(given)
    if path.exists() or "/" in str(given) or path.suffix:
        return path
    found = directory() / f"{given}.toml"
    if found.is_file():
        return found
    names = ", ".join(s.name for s in shipped())
    raise NoSuchExperiment(f"{given}: no such file, nor an experiment that ships with "
                           f"gpuvm (have {names}; `gpuvm experiment --list`)")
