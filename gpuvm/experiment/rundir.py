"""A run directory: which experiment it belongs to, its rows, and whether it is complete.

    results/<name>/<timestamp>/
        manifest.json   written first: the experiment's name, a hash of its configuration,
                        the backend and the plan's size -- what `--report` and `--resume`
                        check a config file against
        runs.jsonl      one row per VM run, each appended with one write and an fsync, so
                        a crash can tear at most the last line (dropped, with a warning,
                        when the rows are read back)
        COMPLETE        written last, atomically (temporary file, fsync, rename): only a
                        directory holding it has every planned run
        writer.lock     flock()ed by the one process writing the directory (a run, a
                        resume, a report's rebuild): a second is refused, so two resumes
                        cannot both append the same runs
        report.md, results.csv, report.json (what the report was built from), figures
    results/<name>/latest -> the newest *complete* run (replaced atomically)

Everything that can go wrong with a directory given by the user is a `RunDirError`: one
line naming the path.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

from gpuvm.experiment.config import Experiment
from gpuvm.mediator.modes import MODES

MANIFEST = "manifest.json"
ROWS = "runs.jsonl"
COMPLETE = "COMPLETE"
REPORT_RECORD = "report.json"
WRITER_LOCK = "writer.lock"
LATEST = "latest"
FORMAT = 1


class RunDirError(Exception):
    """One line: the directory or file, and what is wrong with it."""


class RunKey(NamedTuple):
    """One run of the plan: a scenario's VMs together under one mode, policy, repetition."""

    scenario: str
    mode: str
    policy: str
    rep: int


def points(exp: Experiment) -> list[RunKey]:
    """Each point (scenario x mode x policy) once, as its first repetition, in the
    experiment file's order (native has no scheduler: first policy only)."""
    return [RunKey(s.name, m, p, 0) for s in exp.scenarios for m in exp.modes
            for p in (exp.policies if MODES[m].mediated else exp.policies[:1])]


def plan(exp: Experiment) -> list[RunKey]:
    """Every planned run, in the order they are made.  By rounds (the default): the
    first repetition of every point, then the second of every point, and so on.  Why:
    the host's speed drifts in stretches of seconds, and a point whose runs are made
    back to back can land all of them in one slow stretch of wall time; spread over
    rounds, a point's runs meet the host at different times.  By points (`order = "points"`): each point's runs back to
    back.  Within a round the file's order holds, so a scenario that plans from an
    earlier one's run (pin_hot_from) finds it."""
    firsts = points(exp)
    reps = range(exp.repetitions)
    if exp.order == "points":
        return [key._replace(rep=r) for key in firsts for r in reps]
    return [key._replace(rep=r) for r in reps for key in firsts]


def planned_vm_runs(exp: Experiment) -> int:
    sizes = {s.name: len(s.vms) for s in exp.scenarios}
    return sum(sizes[k.scenario] for k in plan(exp))


def fingerprint(exp: Experiment) -> dict[str, Any]:
    """What decides an experiment's rows.  Left out on purpose: the description and output
    path (words and places), the cost profile (a report may be re-priced later), the
    backend (recorded on its own: `--backend` may override the file) and `isolated`
    (VMs in processes count exactly what VM threads count)."""
    scenarios = [asdict(s) for s in exp.scenarios]
    for s in scenarios:  # keys added later count only where set (older runs still match)
        for vm in s["vms"]:
            for key in ("working_set_mib", "mdev_type"):
                if vm.get(key) is None:
                    vm.pop(key, None)
    out = {"name": exp.name, "kind": exp.kind, "modes": list(exp.modes),
           "policies": list(exp.policies), "repetitions": exp.repetitions,
           "time_scale": exp.time_scale, "timeout_s": exp.timeout_s,
           "scheduler": exp.scheduler, "scenarios": scenarios}
    if exp.vram_mib is not None:
        out["vram_mib"] = exp.vram_mib
    out["clock"] = exp.clock
    return out


def config_hash(exp: Experiment) -> str:
    text = json.dumps(fingerprint(exp), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def output_base(exp: Experiment) -> Path:
    """Where an experiment's run directories go: a relative `output` is under the current
    directory (results/<name> by default), never the installation gpuvm runs from."""
    return exp.output if exp.output.is_absolute() else Path.cwd() / exp.output


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: str | bytes) -> None:
    """Readers see the old file or the whole new one, never a part (also after a crash)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


@dataclass
class LoadedRows:
    """The rows of runs.jsonl as dicts, each with its line; what was dropped and why."""

    rows: list[dict[str, Any]]
    lines: list[bytes]
    warnings: list[str]


def key_of(row: dict[str, Any]) -> RunKey:
    return RunKey(row["scenario"], row["mode"], row["policy"], row["rep"])


class RunDir:
    """One run directory on disk (see the module's docstring)."""

    def __init__(self, path: Path, manifest: dict[str, Any]) -> None:
        self.path = path
        self.manifest = manifest
        self._lock_fd: int | None = None

    # ---------------------------------------------------------------- one writer
    def hold(self) -> RunDir:
        """Become the directory's one writer until release() or this process ends (the
        kernel drops an flock with its last descriptor, so a killed writer never leaves
        the directory locked).  Another process holding it: a RunDirError."""
        if self._lock_fd is not None:
            return self
        path = self.path / WRITER_LOCK
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RunDirError(f"{path}: cannot open: {exc.strerror or exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EACCES):
                raise RunDirError(f"{path}: cannot lock: {exc.strerror or exc}") from None
            raise RunDirError(f"{self.path}: another gpuvm (pid {holder}) is writing it; "
                              f"wait for it to end (or stop it) and try again") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd
        return self

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # ---------------------------------------------------------------- create / open
    @classmethod
    def create(cls, exp: Experiment) -> RunDir:
        """A new time-stamped directory with its manifest; never one that exists."""
        base = output_base(exp)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            base.mkdir(parents=True, exist_ok=True)
            n = 1
            while True:
                path = base / (stamp if n == 1 else f"{stamp}-{n}")
                try:
                    path.mkdir()
                    break
                except FileExistsError:
                    n += 1
        except OSError as exc:
            raise RunDirError(f"{base}: cannot create a run directory: "
                              f"{exc.strerror or exc}") from None
        manifest = {"format": FORMAT, "experiment": exp.name, "config_sha256": config_hash(exp),
                    "backend": exp.backend, "planned_runs": len(plan(exp)),
                    "planned_vm_runs": planned_vm_runs(exp), "started": time.time(),
                    "source": exp.source, "config": fingerprint(exp)}
        run = cls(path, manifest).hold()  # before the manifest: no resume can take it
        (path / ROWS).touch()
        write_atomically(path / MANIFEST, json.dumps(manifest, indent=1) + "\n")
        return run

    @classmethod
    def open(cls, path: Path) -> RunDir:
        if path.is_symlink():  # `latest`: work on what it names, never on the link itself
            path = path.resolve()
        if not path.exists():
            raise RunDirError(f"{path}: no such run directory")
        if not path.is_dir():
            raise RunDirError(f"{path}: not a directory (give a run directory, "
                              f"results/<name>/<timestamp>)")
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            raise RunDirError(f"{path}: not a run directory of `gpuvm experiment` (no "
                              f"{MANIFEST}; directories made before it existed cannot be "
                              f"checked against a config)") from None
        except (OSError, ValueError) as exc:
            raise RunDirError(f"{path / MANIFEST}: unreadable: {exc}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise RunDirError(f"{path / MANIFEST}: not a manifest of format {FORMAT}")
        if not (path / ROWS).is_file():
            raise RunDirError(f"{path / ROWS}: missing")
        return cls(path, manifest)

    @classmethod
    def newest_incomplete(cls, exp: Experiment) -> RunDir:
        """The latest interrupted run of this very configuration, for a bare `--resume`."""
        base = output_base(exp)
        found: list[RunDir] = []
        for child in sorted(base.iterdir()) if base.is_dir() else []:
            if child.is_symlink() or not (child / MANIFEST).is_file():
                continue
            try:
                run = cls.open(child)
            except RunDirError:
                continue
            if not run.complete and run.manifest.get("config_sha256") == config_hash(exp):
                found.append(run)
        if not found:
            raise RunDirError(f"{base}: no interrupted run of {exp.name!r} with this "
                              f"configuration to resume")
        return max(found, key=lambda r: (r.manifest.get("started", 0), r.path.name))

    def check(self, exp: Experiment) -> None:
        """The directory must hold this experiment, run with this very configuration."""
        name = self.manifest.get("experiment")
        if name != exp.name:
            raise RunDirError(f"{self.path}: holds experiment {name!r}, not {exp.name!r} "
                              f"of {exp.source}")
        if self.manifest.get("config_sha256") != config_hash(exp):
            raise RunDirError(f"{self.path}: was run with another configuration of "
                              f"{exp.name!r} than {exp.source} has now (config hash "
                              f"{str(self.manifest.get('config_sha256'))[:12]} vs "
                              f"{config_hash(exp)[:12]})")

    # ---------------------------------------------------------------------- state
    @property
    def rows_path(self) -> Path:
        return self.path / ROWS

    @property
    def complete(self) -> bool:
        return (self.path / COMPLETE).is_file()

    def mark_complete(self, rows: int) -> None:
        write_atomically(self.path / COMPLETE,
                         json.dumps({"rows": rows, "finished": time.time()}) + "\n")

    def point_latest(self) -> None:
        """results/<name>/latest -> this directory, swapped in one rename; only for a
        complete run, and never over something that is not our symlink."""
        if not self.complete:
            raise RunDirError(f"{self.path}: not complete; `latest` stays where it is")
        latest = self.path.parent / LATEST
        if latest.exists() and not latest.is_symlink():
            return
        tmp = self.path.parent / f".{LATEST}.tmp-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(self.path.name)
        os.replace(tmp, latest)
        _fsync_dir(self.path.parent)

    # ----------------------------------------------------------------------- rows
    def read_rows(self) -> LoadedRows:
        """Every whole row.  A last line cut short by a crash is dropped with a warning; a
        bad line anywhere else means the file was damaged, which is an error."""
        try:
            data = self.rows_path.read_bytes()
        except OSError as exc:
            raise RunDirError(f"{self.rows_path}: unreadable: {exc.strerror}") from None
        lines = data.split(b"\n")
        tail = lines.pop()  # b"" when the file ends with a newline
        rows, kept, warnings = [], [], []
        for n, line in enumerate(lines, 1):
            try:
                row = json.loads(line)
                key_of(row)
            except (ValueError, TypeError, KeyError):
                if n == len(lines) and not tail:
                    warnings.append(f"{self.rows_path}:{n}: dropped a torn last row")
                    continue
                raise RunDirError(f"{self.rows_path}:{n}: not a row; the file is "
                                  f"damaged") from None
            rows.append(row)
            kept.append(line + b"\n")
        if tail:
            warnings.append(f"{self.rows_path}:{len(lines) + 1}: dropped a torn last row "
                            f"({len(tail)} bytes without an end of line)")
        return LoadedRows(rows, kept, warnings)

    def rewrite_rows(self, lines: list[bytes]) -> None:
        """Replace runs.jsonl by these lines in one rename (used to drop torn or partial
        rows before a resume appends after them)."""
        write_atomically(self.rows_path, b"".join(lines))

    def appender(self) -> RowAppender:
        return RowAppender(self.rows_path)


class RowAppender:
    """Appends rows to runs.jsonl: each row one write of one whole line (O_APPEND), then
    fsync, so what is on disk is always a sequence of whole rows plus at most one torn
    line from a crash in the middle of a write."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append(self, row: dict[str, Any]) -> None:
        line = (json.dumps(row) + "\n").encode()
        written = os.write(self.fd, line)
        while written < len(line):  # regular files write whole; just in case
            written += os.write(self.fd, line[written:])
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> RowAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def repeated_run(rows: list[dict[str, Any]]) -> str | None:
    """The first VM run that has more than one row, as a report's refusal names it; None
    where every row is a run of its own.  Two rows of one run mean two writers appended
    the same runs (a report over them would count that run twice)."""
    seen: set[tuple[RunKey, str]] = set()
    for n, row in enumerate(rows, 1):
        key = (key_of(row), row.get("vm"))
        if key in seen:
            k = key[0]
            return (f"row {n} repeats the run of VM {key[1]} in scenario {k.scenario}, "
                    f"mode {k.mode}, policy {k.policy}, rep {k.rep}")
        seen.add(key)
    return None


def complete_runs(rows: list[dict[str, Any]], exp: Experiment) -> set[RunKey]:
    """The plan's runs whose every VM has its row."""
    vms = {s.name: {v.name for v in s.vms} for s in exp.scenarios}
    seen: dict[RunKey, set[str]] = {}
    for row in rows:
        seen.setdefault(key_of(row), set()).add(row["vm"])
    return {k for k, names in seen.items() if k.scenario in vms and names >= vms[k.scenario]}
