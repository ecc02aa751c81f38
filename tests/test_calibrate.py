"""`gpuvm calibrate`: argument handling, the no-GPU line, THP detection, profile files.

The measurements themselves need an NVIDIA GPU; the one test that runs them skips
without one.  Everything else here runs on any Linux machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from gpuvm import cli
from gpuvm.calibrate import hostmem
from gpuvm.calibrate.command import model_slug, parse_size
from gpuvm.calibrate.gpu import chunks
from gpuvm.calibrate.profile import (Bandwidth, CopyInto, DeviceInfo, GpuProfile, PinCost,
                                     from_toml, load, to_toml)
from gpuvm.calibrate.stats import Spread

REPO = Path(__file__).resolve().parents[1]
H100_PROFILE = REPO / "experiments" / "costs" / "gpu-h100.toml"


def calibrate(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(["calibrate", *argv])
    except SystemExit as exc:  # argparse's own usage errors
        rc = int(exc.code)
    out, err = capsys.readouterr()
    return rc, out, err


def gpu_available() -> str | None:
    """None if a GPU backend works here, else why not."""
    from gpuvm.calibrate.cuda import NoGpu, find_backend
    try:
        find_backend().release()
    except NoGpu as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------ arguments
@pytest.mark.parametrize("text, value", [("4096", 4096), ("4K", 4096), ("4M", 4 << 20),
                                         ("64MiB", 64 << 20), ("1G", 1 << 30), ("1gb", 1 << 30)])
def test_sizes_parse_in_binary_units(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "0", "-4K", "4X", "1.5G", "M"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(cli.UserError, match="bad size"):
        parse_size(text)


def test_one_of_gpu_footprint_or_show_is_required(capsys):
    rc, _, err = calibrate(capsys)
    assert rc == 2 and "one of the arguments --gpu --pt-footprint --show is required" in err
    rc, _, err = calibrate(capsys, "--gpu", "--pt-footprint")
    assert rc == 2 and "not allowed with" in err


@pytest.mark.parametrize("argv, culprit", [
    (["--reps", "3"], "--reps 3"),
    (["--chunk", "4M", "--chunk-offset", "4M"], "--chunk-offset 4M"),
    (["--chunk", "6000"], "multiples of 4 KiB"),
    (["--sizes", "64M,oops"], "'oops'"),
])
def test_bad_gpu_arguments_are_one_line_before_any_gpu_work(capsys, argv, culprit):
    rc, out, err = calibrate(capsys, "--gpu", *argv)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("gpuvm: error:") and culprit in err


def test_without_a_gpu_one_clear_line_and_no_simpy(tmp_path):
    """In a fresh interpreter where simpy and the VMM cannot be imported, `--gpu` still
    starts, and without a GPU it ends with one line naming what is missing."""
    reason = gpu_available()
    if reason is None:
        pytest.skip("a GPU is present: the no-GPU path cannot be seen here")
    script = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'simpy' or name.startswith(('gpuvm.vmm', "
        "'gpuvm.sim', 'gpuvm.run', 'gpuvm.mediator')):\n"
        "            raise ImportError(f'blocked {name}')\n"
        "sys.meta_path.insert(0, Block())\n"
        "from gpuvm.cli import main\n"
        f"sys.exit(main(['calibrate', '--gpu', '--out', {str(tmp_path / 'p.toml')!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("gpuvm: error: calibrate --gpu: no usable NVIDIA GPU (")
    assert not (tmp_path / "p.toml").exists()


def test_model_slug_names_the_profile_file():
    assert model_slug("NVIDIA H100 80GB HBM3") == "h100"
    assert model_slug("NVIDIA A10G") == "a10g"
    assert model_slug("Some Card") == "some-card"


# ------------------------------------------------------------------ THP detection
SMAPS = """\
7f0000000000-7f0000200000 rw-s 00000000 00:01 42                         /memfd:gpuvm-memfd-thp (deleted)
Size:               2048 kB
Rss:                2048 kB
ShmemPmdMapped:     2048 kB
AnonHugePages:         0 kB
VmFlags: rd wr sh mr mw me ms hg
7f0000200000-7f0000400000 rw-s 00200000 00:01 42                         /memfd:gpuvm-memfd-thp (deleted)
Size:               2048 kB
Rss:                2048 kB
ShmemPmdMapped:        0 kB
VmFlags: rd wr sh mr mw me ms nh
7f0000400000-7f0000600000 rw-p 00000000 00:00 0
Size:               2048 kB
Rss:                1024 kB
AnonHugePages:      2048 kB
THPeligible:    1
"""


def test_smaps_fields_are_summed_over_the_vmas_a_region_spans():
    region = hostmem.smaps_kib(SMAPS, 0x7F0000000000, 0x7F0000400000)
    assert region["Size"] == 4096 and region["Rss"] == 4096
    assert region["ShmemPmdMapped"] == 2048 and hostmem.huge_kib(region) == 2048
    assert "THPeligible" not in region  # not a kB field
    anon = hostmem.smaps_kib(SMAPS, 0x7F0000400000, 0x7F0000401000)
    assert anon == {"Size": 2048, "Rss": 1024, "AnonHugePages": 2048}
    assert hostmem.smaps_kib(SMAPS, 0x7F0000600000, 0x7F0000700000) == {}


@pytest.mark.parametrize("text, mode", [
    ("always within_size advise [never] deny force\n", "never"),
    ("always within_size [advise] never deny force\n", "advise"),
    ("always [madvise] never\n", "madvise"),
])
def test_thp_knob_selected_mode(text, mode):
    assert hostmem.selected_mode(text) == mode


def test_thp_knob_without_a_selection_is_an_error():
    with pytest.raises(ValueError, match="no \\[selected\\] mode"):
        hostmem.selected_mode("always madvise never")


@pytest.mark.parametrize("kind", sorted(hostmem.REGION_KINDS))
def test_host_regions_are_seen_in_smaps_once_populated(kind):
    region = hostmem.HostRegion.open(kind, 8 << 20)
    try:
        # the kernel may merge the mapping with a neighbouring one of the same kind (whose
        # pages other threads fill and free meanwhile: smaps' Rss of the whole entry once
        # grew by 3.3 MiB while the region's 8 MiB were populated), so its smaps entry can
        # be larger; the region's own pages are counted by mincore
        before = region.smaps()
        assert before["Size"] >= 8 << 10
        assert region.resident_bytes() == 0
        region.populate()
        assert region.resident_bytes() == 8 << 20
        assert region.smaps()["Rss"] >= 8 << 10
        if kind.endswith("-4k"):
            assert region.thp_kib() == 0  # MADV_NOHUGEPAGE is always honoured
    finally:
        region.close()


def test_thp_memfd_is_huge_when_the_kernel_allows_it():
    if hostmem.read_knob(hostmem.SHMEM_THP_KNOB) not in ("advise", "always", "within_size"):
        pytest.skip(f"shmem THP is {hostmem.read_knob(hostmem.SHMEM_THP_KNOB)!r} here")
    region = hostmem.HostRegion.open("memfd-thp", 8 << 20)
    try:
        region.populate()
        assert region.thp_kib() > 0
    finally:
        region.close()


def test_unknown_region_kind_is_refused():
    with pytest.raises(ValueError, match="unknown host memory kind 'huge'"):
        hostmem.HostRegion.open("huge", 4096)


# ------------------------------------------------------------------ chunks and spreads
@given(st.integers(1, 64).map(lambda n: n * 4096), st.integers(1, 16).map(lambda n: n * 4096),
       st.data())
def test_chunks_tile_the_region_exactly(nbytes, chunk, data):
    offset = data.draw(st.integers(0, chunk // 4096 - 1)) * 4096
    pieces = chunks(1 << 30, nbytes, chunk, offset)
    assert pieces[0][0] == 1 << 30
    assert all(a + n == b for (a, n), (b, _) in zip(pieces, pieces[1:]))
    assert sum(n for _, n in pieces) == nbytes and all(0 < n <= chunk for _, n in pieces)
    # every boundary but the region's ends lies on the shifted grid
    assert all((a - (1 << 30) - offset) % chunk == 0 for a, _ in pieces[1:])


def test_spread_keeps_min_below_max_when_inverted():
    s = Spread.of([2.0, 1.0, 4.0, 3.0, 5.0])
    assert (s.median, s.min, s.max, s.n) == (3.0, 1.0, 5.0, 5)
    rate = s.inverted(10.0)
    assert (rate.median, rate.min, rate.max) == (10 / 3, 2.0, 10.0)
    assert s.scaled(1000).max == 5000.0


# ------------------------------------------------------------------ profiles
def sample_profile() -> GpuProfile:
    sp = Spread(1.5, 1.25, 2.0, 7)
    info = DeviceInfo("NVIDIA Test \"GPU\"", "1.2.3", "13.0", "cupy 0", "2026-01-01T00:00:00Z",
                      "gpuvm calibrate --gpu", "6.1", "advise", "madvise", 7, 4 << 20, 1 << 20)
    return GpuProfile(info,
                      [Bandwidth("h2d", "pinned", 1 << 30, sp), Bandwidth("d2h", "pageable",
                                                                          64 << 20, sp)],
                      [PinCost("memfd-thp", 1 << 30, 4 << 20, 257, 1 << 20, sp, sp)],
                      [CopyInto("memfd-4k", "chunk-pinned", 1 << 30, 0, 0, sp)])


def test_profile_round_trips_through_toml():
    profile = sample_profile()
    assert from_toml(to_toml(profile)) == profile


def test_profile_costs_summarise_the_largest_size_and_per_chunk_times():
    costs = sample_profile().costs()
    assert costs["h2d_pinned_gib_s"] == 1.5
    assert "d2h_pageable_gib_s" not in costs  # only measured at 64 MiB, not the largest
    assert costs["pin_chunk_memfd_thp_us"] == round(1.5 * 1000 / 257, 3)
    assert costs["d2h_chunk_pinned_memfd_4k_gib_s"] == 1.5


def test_show_prints_a_saved_profile(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text(to_toml(sample_profile()))
    rc, out, _ = calibrate(capsys, "--show", str(path))
    assert rc == 0 and "copy bandwidth" in out and "1.50 [1.25–2.00]" in out
    rc, out, _ = calibrate(capsys, "--show", str(path), "--json")
    assert rc == 0 and json.loads(out)["costs"]["h2d_pinned_gib_s"] == 1.5
    rc, _, err = calibrate(capsys, "--show", str(tmp_path / "missing.toml"))
    assert rc == 2 and err.startswith("gpuvm: error:") and "no such profile" in err


def test_the_committed_h100_profile_holds_real_measurements():
    """The profile measured on the lent H100: complete, >= 5 reps, spreads ordered."""
    profile = load(H100_PROFILE)
    assert "H100" in profile.device.gpu and profile.device.driver != "unknown"
    assert profile.device.reps >= 5
    spreads = [b.gib_s for b in profile.bandwidth] + [c.gib_s for c in profile.d2h_into] + \
        [s for p in profile.pin for s in (p.register_ms, p.unregister_ms)]
    assert all(s.n >= 5 and 0 < s.min <= s.median <= s.max for s in spreads)
    kinds = {(b.direction, b.host) for b in profile.bandwidth}
    assert kinds == {("h2d", "pinned"), ("d2h", "pinned"), ("h2d", "pageable"),
                     ("d2h", "pageable")}
    assert {p.memory for p in profile.pin} >= {"anon-4k", "memfd-thp"}
    costs = profile.costs()
    assert costs["d2h_pinned_gib_s"] > costs["d2h_pageable_gib_s"]


def test_calibration_on_a_real_gpu(tmp_path, capsys):
    reason = gpu_available()
    if reason is not None:
        pytest.skip(f"needs an NVIDIA GPU: {reason}")
    out = tmp_path / "gpu.toml"
    rc, _, err = calibrate(capsys, "--gpu", "--sizes", "4M", "--pin-size", "16M",
                           "--reps", "5", "--out", str(out))
    assert rc == 0, err
    profile = load(out)
    assert len(profile.bandwidth) == 4 and len(profile.pin) == 3
    assert all(b.gib_s.min > 0 for b in profile.bandwidth)
