"""Nutanix libvfio-user, built from ../shared/third_party for the interop tests: an
independent implementation of vfio-user, so gpuvm's server and client are tried against
a peer nobody here wrote (tests/test_vfio_user_interop.py).

The archive is unpacked into build/libvfio-user/src (ignored by git), the patches in
tests/data/libvfio-user applied there -- never to the archive -- and the samples built
with meson and ninja into build/libvfio-user/build.  The patches:
- samples-server-pow2-bar1.patch: the sample server declares a 0x3000-byte BAR1, which
  the library at this commit refuses (a PCI BAR is a power of two), so it would not
  start; BAR1 becomes 0x4000 there (the sample client's matching expectations -- 0x4000
  bytes, 16 and 17 migration iterations of 1 KiB -- are in the client patch).
- samples-client-generic.patch: `client -g` runs the sample client against any PCI
  device -- the steps tied to the sample server's own device (its IDs, its BAR0 timer
  and the interrupt and DMA that fires, dirty page logging, migration) are replaced by
  the protocol steps a device without them must still answer.

`python tests/libvfio_user.py` builds it (the Makefile's `libvfio-user` target, which
`make test` runs); the tests' fixture calls `build()` too, so one test file run alone
finds it built.  A stamp of the archive's and patches' hashes makes it idempotent, and a
lock keeps two pytest workers from building at once."""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHIVE_NAME = "libvfio-user-efd091b.tar.gz"
# ../shared from the project's root; a helper's git worktree (/work/wt/<name>) sits one
# level deeper than the main checkout and finds the same directory at ../../shared
ARCHIVE = next((d / "shared" / "third_party" / ARCHIVE_NAME for d in (ROOT.parent,
                                                                      ROOT.parent.parent)
                if (d / "shared" / "third_party" / ARCHIVE_NAME).is_file()),
               ROOT.parent / "shared" / "third_party" / ARCHIVE_NAME)
PATCHES = sorted((ROOT / "tests" / "data" / "libvfio-user").glob("*.patch"))
BUILD_ROOT = ROOT / "build" / "libvfio-user"
SOURCE = BUILD_ROOT / "src"
BUILD = BUILD_ROOT / "build"
SAMPLES = ("samples/client", "samples/server", "samples/gpio-pci-idio-16")
TOOLS = ("meson", "ninja", "patch", "pkg-config", "gcc")


class BuildError(RuntimeError):
    """libvfio-user could not be built here; one line naming the step."""


def missing_reason() -> str:
    """Why the interop tests cannot run here ("" when they can): only a checkout outside
    this workspace, without the archive, is a reason to skip."""
    if not ARCHIVE.is_file():
        return f"libvfio-user archive {ARCHIVE} is absent (a checkout outside the workspace)"
    return ""


def _fingerprint() -> str:
    digest = hashlib.sha256(ARCHIVE.read_bytes())
    for patch in PATCHES:
        digest.update(patch.name.encode() + patch.read_bytes())
    return digest.hexdigest()


def _run(step: str, argv: list[str], cwd: Path) -> None:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True)
    if proc.returncode:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-5:]
        raise BuildError(f"libvfio-user {step} failed ({' '.join(argv)}): " + " | ".join(tail))


def build() -> Path:
    """The build directory with the samples built (building them first if needed)."""
    if reason := missing_reason():
        raise BuildError(reason)
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    if absent:
        raise BuildError(f"libvfio-user needs {', '.join(absent)} (`make install` puts "
                         f"them in with apt)")
    BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    with open(BUILD_ROOT / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = BUILD_ROOT / ".stamp"
        want = _fingerprint()
        if stamp.is_file() and stamp.read_text() == want and \
                all((BUILD / s).is_file() for s in SAMPLES):
            return BUILD
        stamp.unlink(missing_ok=True)
        shutil.rmtree(SOURCE, ignore_errors=True)
        shutil.rmtree(BUILD, ignore_errors=True)
        SOURCE.mkdir(parents=True)
        with tarfile.open(ARCHIVE) as tar:
            tar.extractall(SOURCE, filter="data")
        tops = [p for p in SOURCE.iterdir()]
        source = tops[0] if len(tops) == 1 and tops[0].is_dir() else SOURCE
        for patch in PATCHES:
            _run(f"patch {patch.name}", ["patch", "-p1", "--forward", "-i", str(patch)],
                 source)
        _run("meson setup", ["meson", "setup", str(BUILD)], source)
        _run("build", ["ninja", "-C", str(BUILD), *SAMPLES], source)
        stamp.write_text(want)
    return BUILD


if __name__ == "__main__":
    if reason := missing_reason():
        print(f"libvfio-user: skipped: {reason}")
        sys.exit(0)
    try:
        print(f"libvfio-user: samples built in {build()}")
    except BuildError as exc:
        sys.stderr.write(f"gpuvm: error: {exc}\n")
        sys.exit(2)
