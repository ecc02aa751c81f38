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
from gpuvm import host_pages
from gpuvm.calibrate.cli import model_slug, parse_size
from gpuvm.calibrate.gpu import chunks
from gpuvm.calibrate.profile import (Bandwidth, CopyInto, GpuProfile, MeasurementSetup, PinCost,
                                     from_toml, load, to_toml)
from gpuvm.calibrate.stats import Spread

REPO = Path(__file__).resolve().parents[1]
H100_PROFILE = REPO / "experiments" / "costs" / "gpu-h100.toml"
H200_PROFILE = REPO / "experiments" / "costs" / "gpu-h200.toml"
H200_SMART = REPO / "experiments" / "costs" / "gpu-h200-smart.toml"


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
    (["--shmem-thp", "never,sometimes"], "--shmem-thp 'sometimes'"),
    (["--also-offset", "5000"], "--also-offset 5000"),
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
    region = host_pages.smaps_kib(SMAPS, 0x7F0000000000, 0x7F0000400000)
    assert region["Size"] == 4096 and region["Rss"] == 4096
    assert region["ShmemPmdMapped"] == 2048 and host_pages.huge_kib(region) == 2048
    assert "THPeligible" not in region  # not a kB field
    anon = host_pages.smaps_kib(SMAPS, 0x7F0000400000, 0x7F0000401000)
    assert anon == {"Size": 2048, "Rss": 1024, "AnonHugePages": 2048}
    assert host_pages.smaps_kib(SMAPS, 0x7F0000600000, 0x7F0000700000) == {}


@pytest.mark.parametrize("text, mode", [
    ("always within_size advise [never] deny force\n", "never"),
    ("always within_size [advise] never deny force\n", "advise"),
    ("always [madvise] never\n", "madvise"),
])
def test_thp_knob_selected_mode(text, mode):
    assert host_pages.selected_mode(text) == mode


def test_thp_knob_without_a_selection_is_an_error():
    with pytest.raises(ValueError, match="no \\[selected\\] mode"):
        host_pages.selected_mode("always madvise never")


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
    if host_pages.read_knob(host_pages.SHMEM_THP_KNOB) not in ("advise", "always", "within_size"):
        pytest.skip(f"shmem THP is {host_pages.read_knob(host_pages.SHMEM_THP_KNOB)!r} here")
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
    info = MeasurementSetup("NVIDIA Test \"GPU\"", "1.2.3", "13.0", "cupy 0",
                            "2026-01-01T00:00:00Z", "gpuvm calibrate --gpu", "6.1", "advise",
                            "madvise", 7, 4 << 20, 1 << 20)
    return GpuProfile(info,
                      [Bandwidth("h2d", "pinned", 1 << 30, sp, "advise", [0.5, 0.6]),
                       Bandwidth("d2h", "pageable", 64 << 20, sp)],
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


def test_the_committed_h200_profile_measured_both_thp_modes_and_kept_every_repetition():
    """The lent H200's profile (issue 79): shmem THP never and always, both set; every
    repetition kept and matching its spread; huge pages before/after each D2H mode."""
    profile = load(H200_PROFILE)
    d = profile.device
    assert "H200" in d.gpu and d.driver != "unknown" and d.kernel and d.date and d.command
    assert [(t.requested, t.selected, t.note) for t in profile.thp] == \
        [("never", "never", ""), ("always", "always", "")]
    assert d.shmem_thp == "never"  # what the machine had, and was put back to
    for rows, unit in ((profile.bandwidth, "rate"), (profile.d2h_into, "rate")):
        for r in rows:
            assert len(r.seconds) == r.gib_s.n == d.reps
            assert r.gib_s.median == pytest.approx(Spread.of(r.seconds).inverted(
                r.nbytes / (1 << 30)).median)
    for p in profile.pin:
        assert len(p.register_s) == len(p.unregister_s) == d.reps
        assert p.register_ms.median == pytest.approx(Spread.of(p.register_s).median * 1e3)
    modes = {(c.shmem_thp, c.chunk_offset, c.memory, c.mode) for c in profile.d2h_into}
    assert len(modes) == 2 * 2 * 2 * 3  # THP modes x grids x memories x transfer modes
    huge = [c for c in profile.d2h_into if c.memory == "memfd-thp" and c.shmem_thp == "always"]
    assert huge and all(c.huge_kib_before == 1 << 20 for c in huge)
    assert all(c.shmem_huge_kib_before >= 0 and c.shmem_huge_kib_after >= 0 for c in huge)
    assert profile.costs_mode() == "always" and d.costs_shmem_thp == "always"
    costs = profile.costs()
    assert costs["thp_split_us"] == profile.thp_split_us()
    assert costs["pin_chunk_memfd_thp_us"] < costs["pin_chunk_memfd_4k_us"]


def test_the_committed_smart_pinning_profile_and_its_crossover():
    from gpuvm.calibrate.smart_pinning import PIN_POLICIES, crossover

    profile = load(H200_SMART)
    sizes = sorted({r.nbytes for r in profile.smart})
    assert sizes[0] == 4096 and sizes[-1] == 1 << 30
    assert {(r.policy, r.nbytes) for r in profile.smart} == \
        {(p, s) for p in PIN_POLICIES for s in sizes}
    assert all(len(r.seconds) == r.ms.n >= 5 for r in profile.smart)
    assert {r.pinned for r in profile.smart if r.policy == "smart"} == {2}  # 2 hot of 8
    assert crossover(profile.smart, "smart", "none") == 1 << 20
    assert crossover(profile.smart, "all", "none") == 256 << 10


def test_crossover_is_where_a_policy_wins_from_then_on():
    from gpuvm.calibrate.profile import SmartPin
    from gpuvm.calibrate.smart_pinning import crossover

    def row(policy, size, ms):
        return SmartPin(policy, size, 8, 8, 4, 0, Spread(ms, ms, ms, 5), [ms / 1e3] * 5)

    rows = [row("none", 1, 1.0), row("all", 1, 2.0), row("none", 2, 2.0), row("all", 2, 1.0),
            row("none", 4, 2.0), row("all", 4, 3.0), row("none", 8, 9.0), row("all", 8, 3.0)]
    assert crossover(rows, "all", "none") == 8  # won at 2, lost again at 4
    assert crossover(rows, "none", "all") is None  # loses at the largest size
    assert crossover(rows[:2], "all", "none") is None


def test_hot_allocations_are_those_copied_more_than_the_threshold():
    from gpuvm.calibrate.smart_pinning import hot_allocations

    assert hot_allocations({0: 16, 1: 2, 2: 3}) == {0, 2}


def test_meminfo_huge_page_lines():
    text = "MemTotal: 100 kB\nAnonHugePages:    4096 kB\nShmemHugePages:  2048 kB\n"
    assert host_pages.meminfo_kib(text) == {"AnonHugePages": 4096, "ShmemHugePages": 2048,
                                         "ShmemPmdMapped": 0}
    assert set(host_pages.meminfo_kib()) == set(host_pages.MEMINFO_HUGE)


def test_a_knob_that_does_not_take_the_mode_says_why(tmp_path):
    knob = tmp_path / "shmem_enabled"
    knob.write_text("always [never]\n")
    why = host_pages.set_knob(knob, "always")  # a plain file reads back what was written
    assert why is not None and "reads [unavailable]" in why
    assert "cannot set" in host_pages.set_knob(tmp_path / "no" / "knob", "always")


class MemmoveBackend:
    """A stand-in for CUDA on the host: 'device' memory is host memory, copies are
    memmove, registration pins nothing.  It exercises the measuring code's every path
    (regions, chunk grids, smaps and meminfo reads, repetitions, the profile) where no
    GPU is; its numbers mean nothing and no profile is written from it."""

    name = "memmove"

    def __init__(self) -> None:
        import ctypes
        self.ctypes = ctypes
        self.buffers: dict[int, object] = {}

    def device_alloc(self, nbytes: int) -> int:
        buf = self.ctypes.create_string_buffer(nbytes)
        self.buffers[self.ctypes.addressof(buf)] = buf
        return self.ctypes.addressof(buf)

    pinned_alloc = device_alloc

    def device_free(self, ptr: int) -> None:
        del self.buffers[ptr]

    pinned_free = device_free

    def h2d(self, dev: int, host: int, nbytes: int) -> None:
        self.ctypes.memmove(dev, host, nbytes)

    def d2h(self, host: int, dev: int, nbytes: int) -> None:
        self.ctypes.memmove(host, dev, nbytes)

    def register(self, host: int, nbytes: int) -> None:
        pass

    def unregister(self, host: int) -> None:
        pass

    def device_name(self) -> str:
        return "stand-in"

    def runtime_version(self) -> str:
        return "0"

    def release(self) -> None:
        self.buffers.clear()


def test_the_measuring_code_runs_end_to_end_on_a_stand_in_backend():
    from gpuvm.calibrate import gpu

    plan = gpu.Plan([1 << 20], 4 << 20, 1 << 20, 5, "test", 0, (), (512 << 10,),
                    (4096, 1 << 20))
    profile = gpu.calibrate(MemmoveBackend(), plan)
    assert len(profile.bandwidth) == 4
    assert {(p.memory, p.chunk_offset) for p in profile.pin} == \
        {(k, o) for k in gpu.PIN_KINDS for o in (0, 512 << 10)}
    assert len(profile.d2h_into) == 2 * 2 * 3 and len(profile.smart) == 2 * 3
    assert [t.requested for t in profile.thp] == [profile.device.shmem_thp]  # as it was
    assert all(len(r.seconds) == 5 for r in profile.bandwidth + profile.d2h_into)
    assert from_toml(to_toml(profile)) == profile


def test_calibration_on_a_real_gpu(tmp_path, capsys):
    reason = gpu_available()
    if reason is not None:
        pytest.skip(f"needs an NVIDIA GPU: {reason}")
    out = tmp_path / "gpu.toml"
    rc, _, err = calibrate(capsys, "--gpu", "--sizes", "4M", "--pin-size", "16M",
                           "--reps", "5", "--shmem-thp", "asis", "--also-offset", "0",
                           "--out", str(out))
    assert rc == 0, err
    profile = load(out)
    assert len(profile.bandwidth) == 4 and len(profile.pin) == 4
    assert all(b.gib_s.min > 0 and len(b.seconds) == 5 for b in profile.bandwidth)


def test_smart_pinning_on_a_real_gpu(tmp_path, capsys):
    reason = gpu_available()
    if reason is not None:
        pytest.skip(f"needs an NVIDIA GPU: {reason}")
    out = tmp_path / "smart.toml"
    rc, _, err = calibrate(capsys, "--gpu", "--smart-pinning", "--smart-sizes", "4K,4M",
                           "--reps", "5", "--out", str(out))
    assert rc == 0, err
    profile = load(out)
    assert len(profile.smart) == 6 and not profile.bandwidth
    assert all(r.ms.min > 0 for r in profile.smart)
