"""Host memory (issues 16, 79): guest RAM backing (really on huge pages for "thp"), the
VMM's count of the guest's pins, of huge pages they cut (arithmetic) and of those the
kernel split (smaps), the prices from the measured profile, the page-table footprint per
VM, smart pinning driven by a profile run's history, and the report that reads the
measured H200 profiles."""

from __future__ import annotations

import tomllib

import pytest

from gpuvm.calibrate.footprint import vm_pt_footprint
from gpuvm.device import regs
from gpuvm.errors import UserError
from gpuvm.experiment.config import ConfigError, parse
from gpuvm.experiment.costs import COSTS_DIR, load_hostmem_costs
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.run.spec import RunError
from gpuvm.vmm import abi
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.hostmem import HUGE_PAGE, HostMemTracker, hot_mask

MiB = regs.MiB


def _event(op: int, gpa: int, nbytes: int, arg: int = 0, alloc: int = 0) -> abi.HostmemEvent:
    return abi.HostmemEvent(op=op, arg=arg, alloc=alloc, gpa=gpa, bytes=nbytes)


@pytest.fixture
def thp_ram():
    ram = GuestRam(16 * MiB, backing="thp")
    ram.array[::4096] = 1  # faulted in: huge pages where the host gives them
    if not ram.huge_kib():
        ram.close()
        pytest.skip("the host gives this process no transparent huge pages")
    yield ram
    ram.close()


def test_guest_ram_backings_and_smaps():
    for backing in ("anon", "4k", "thp"):
        ram = GuestRam(4 * MiB, backing=backing)
        ram.array[::4096] = 1
        assert 0 <= ram.huge_kib() <= 4096  # smaps answers; the host decides how much
        ram.close()
    with pytest.raises(ValueError, match="backing"):
        GuestRam(4 * MiB, backing="1g")


def _rss_kib(ram: GuestRam) -> int:
    from pathlib import Path

    from gpuvm.host_pages import smaps_kib
    return smaps_kib(Path("/proc/self/smaps").read_text(), ram.host_address,
                     ram.host_address + ram.size)["Rss"]


def test_guest_ram_is_allocated_up_front_unless_asked_on_demand():
    """Up front (the default) every page is mapped before the guest runs, so no first
    touch faults inside KVM_RUN; on demand only what the guest touched."""
    eager = GuestRam(8 * MiB, prealloc=True)
    lazy = GuestRam(8 * MiB, prealloc=False)
    try:
        assert _rss_kib(eager) == 8 * 1024
        assert _rss_kib(lazy) == 0
        lazy.array[:MiB:4096] = 1
        assert _rss_kib(lazy) == 1024
        assert not eager.array.any()  # allocated, and still zero
    finally:
        eager.close()
        lazy.close()


def test_guest_ram_the_host_cannot_give_is_one_line(monkeypatch):
    """madvise(MADV_POPULATE_WRITE) failing as it does when the host is out of memory."""
    import ctypes
    import errno

    from gpuvm.vmm import guest_ram

    class OutOfMemory:
        @staticmethod
        def madvise(address, length, advice):
            ctypes.set_errno(errno.ENOMEM)
            return -1
    monkeypatch.setattr(guest_ram, "_libc", OutOfMemory)
    with pytest.raises(guest_ram.GuestRamAllocError) as info:
        GuestRam(8 * MiB, prealloc=True)
    message = str(info.value)
    assert "cannot allocate 8 MiB up front (ENOMEM" in message and "\n" not in message
    assert isinstance(info.value, UserError)  # the CLI prints it as one line


def test_an_allocation_name_says_whether_to_populate_up_front():
    from gpuvm.vmm.guest_ram import GuestRamAllocError, prealloc_for
    assert (prealloc_for("immediate"), prealloc_for("ondemand"), prealloc_for(None)) == \
        (True, False, None)
    with pytest.raises(GuestRamAllocError, match="'eager' is not one of"):
        prealloc_for("eager")


def test_the_default_allocation_is_immediate_unless_the_environment_says(monkeypatch):
    """$GPUVM_RAM_ALLOC names the default (this suite runs with "ondemand": conftest.py);
    unset, RAM is allocated up front; a bad value is one line naming the variable."""
    from gpuvm.vmm import guest_ram

    monkeypatch.delenv(guest_ram.ALLOC_ENV, raising=False)
    assert guest_ram.default_allocation() == "immediate"
    assert VmSpec("vm0", "memcpy").ram_alloc == "immediate"
    ram = GuestRam(4 * MiB)
    try:
        assert ram.prealloc and _rss_kib(ram) == 4 * 1024
    finally:
        ram.close()
    monkeypatch.setenv(guest_ram.ALLOC_ENV, "ondemand")
    assert VmSpec("vm0", "memcpy").ram_alloc == "ondemand"
    monkeypatch.setenv(guest_ram.ALLOC_ENV, "eager")
    with pytest.raises(UserError, match=r"^GPUVM_RAM_ALLOC='eager' is not one of immediate"):
        VmSpec("vm0", "memcpy")


def test_thp_guest_ram_is_huge_when_the_kernel_allows_it():
    from gpuvm import host_pages as knobs

    mode = knobs.read_knob(knobs.SHMEM_THP_KNOB)
    if mode not in ("advise", "always", "within_size"):
        pytest.skip(f"shmem THP is {mode!r} here")
    ram = GuestRam(8 * MiB, backing="thp")
    ram.array[::4096] = 1
    assert ram.huge_kib() > 0
    ram.close()
    ram = GuestRam(8 * MiB, backing="4k")
    ram.array[::4096] = 1
    assert ram.huge_kib() == 0  # MADV_NOHUGEPAGE is always honoured
    ram.close()


def test_thp_guest_ram_is_on_huge_pages_even_with_shmem_thp_off():
    """"thp" guest RAM is a memfd where shmem THP is on, else anonymous memory that
    MADV_HUGEPAGE puts on huge pages -- which then cannot be shared with another process."""
    from gpuvm import host_pages as knobs

    if knobs.read_knob(knobs.ANON_THP_KNOB) not in ("always", "madvise"):
        pytest.skip(f"anonymous THP is {knobs.read_knob(knobs.ANON_THP_KNOB)!r} here")
    ram = GuestRam(8 * MiB, backing="thp", prealloc=True)
    try:
        assert ram.huge_kib() == 8 * 1024
        off = knobs.read_knob(knobs.SHMEM_THP_KNOB) in ("never", "deny")
        assert ram.anonymous == off
        if off:
            with pytest.raises(UserError, match="shmem_enabled is \\[never\\].*set it to advise"):
                ram.share_fd()
    finally:
        ram.close()


def test_anonymous_thp_ram_keeps_its_huge_pages_across_a_fork(thp_ram):
    """A child forked while the guest runs (a compiler, a VM process) must not share the
    RAM copy-on-write: the guest's next store would split the huge page under it (seen:
    12 splits in one hostmem experiment before MADV_DONTFORK)."""
    import os

    if not thp_ram.anonymous:
        pytest.skip("shmem THP is on here: the RAM is a shared memfd, never copy-on-write")
    before = thp_ram.huge_kib()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child only waits
        os.read(read, 1)
        os._exit(0)
    try:
        thp_ram.array[::HUGE_PAGE] = 7  # one store per huge page while the child lives
        assert thp_ram.huge_kib() == before
    finally:
        os.write(write, b"x")
        os.waitpid(child, 0)
        os.close(read)
        os.close(write)


def test_write_pins_count_cuts_by_arithmetic_and_splits_by_the_kernel(thp_ram):
    t = HostMemTracker(thp_ram)
    t.handle(_event(abi.HM_PIN, 1 * MiB, 4 * MiB, arg=1))  # cuts pages 0 and 2
    t.handle(_event(abi.HM_PIN, 2 * MiB, 4 * MiB, arg=1))  # aligned: cuts nothing
    t.handle(_event(abi.HM_PIN, 1 * MiB, 4 * MiB, arg=0))  # read pin: no cut counted
    t.handle(_event(abi.HM_PIN, 4096, 8192, arg=1))  # inside one page: one cut
    assert t.counters["hostmem.huge_cuts"] == 3
    assert t.counters["hostmem.huge_splits"] == 0  # reporting a pin touches no page
    assert thp_ram.huge_kib() == 16 * 1024
    assert t.counters["hostmem.pins"] == 4
    assert t.counters["hostmem.pin_bytes_thp"] == 12 * MiB + 8192
    assert t.pinned_peak_bytes == 12 * MiB + 8192


def test_ram_the_host_gave_no_huge_pages_is_priced_as_4k():
    ram = GuestRam(16 * MiB, backing="4k")
    t = HostMemTracker(ram)
    t.handle(_event(abi.HM_PIN, 1 * MiB, 4 * MiB, arg=1))
    assert t.counters.get("hostmem.huge_splits", 0) == t.counters.get("hostmem.huge_cuts", 0) == 0
    assert t.counters["hostmem.pin_bytes_4k"] == 4 * MiB
    ram.close()


def test_nohugepage_on_pinned_ranges_removes_cuts_but_the_kernel_splits(thp_ram):
    """The field report's cure advises the pinned range 4 KiB pages: nothing left to
    cut -- but the madvise itself splits the huge mappings its edges fall inside."""
    t = HostMemTracker(thp_ram, nohugepage_pinned=True)
    t.handle(_event(abi.HM_PIN, 1 * MiB, 4 * MiB, arg=1))
    t.handle(_event(abi.HM_UNPIN, 1 * MiB, 4 * MiB, arg=1))
    assert t.counters.get("hostmem.huge_cuts", 0) == 0
    assert t.counters["hostmem.huge_splits"] == 2  # pages 0 and 2, as smaps saw
    # page 1, wholly inside the advised range, stays huge-mapped: the advice stops new
    # huge pages there, it does not split those in place
    assert thp_ram.huge_kib() == 16 * 1024 - 2 * 2048
    assert t.counters["hostmem.pin_bytes_4k"] == 4 * MiB
    assert t.counters["hostmem.unpin_bytes_4k"] == 4 * MiB
    assert t.pinned_bytes == 0
    # pages the advice did not reach are still huge
    assert t.thp_bytes(6 * MiB, HUGE_PAGE) == HUGE_PAGE


def test_bad_reports_are_refused(thp_ram):
    t = HostMemTracker(thp_ram)
    with pytest.raises(ValueError, match="unknown op"):
        t.handle(_event(99, 0, 4096))
    with pytest.raises(ValueError, match="unknown kind"):
        t.handle(_event(abi.HM_HTOD, 0, 4096, arg=7))
    with pytest.raises(Exception, match="outside RAM"):
        t.handle(_event(abi.HM_PIN, 15 * MiB, 2 * MiB))


def test_hot_mask_picks_allocations_over_the_threshold():
    assert hot_mask({1: 16, 2: 2, 3: 1, 5: 16, 0: 40}, threshold=2) == 0b10001
    assert hot_mask({1: 16, 2: 2}, threshold=1) == 0b11


def test_hostmem_costs_are_the_measured_medians():
    measured = tomllib.loads((COSTS_DIR / "gpu-h200.toml").read_text())
    c = load_hostmem_costs("gpu-h200")
    m = measured["costs"]
    assert (c.h2d_pinned_gib_s, c.d2h_pageable_gib_s) == (m["h2d_pinned_gib_s"],
                                                          m["d2h_pageable_gib_s"])
    assert c.pin_chunk_thp_us == m["pin_chunk_memfd_thp_us"]
    assert c.chunk_bytes == measured["device"]["chunk_bytes"]
    assert c.thp_split_us == m["thp_split_us"] == 0.0  # the H200's kernel split nothing
    assert c.thp_cut_us == 0.0
    field = load_hostmem_costs("hostmem-field-split")
    assert field.thp_cut_us == pytest.approx(215.2) and field.thp_split_us == 0.0
    assert field.pin_chunk_4k_us == c.pin_chunk_4k_us
    # 1 GiB staged at the pageable rate takes 1 / rate seconds
    ns = c.modelled_ns({"hostmem.xfer.dtoh.staged.bytes": regs.GiB})
    assert ns == pytest.approx(1e9 / c.d2h_pageable_gib_s)
    assert field.modelled_ns({"hostmem.huge_cuts": 10}) == pytest.approx(2152e3)
    assert c.modelled_ns({"hostmem.huge_cuts": 10}) == 0


def test_a_profile_whose_kernel_split_pages_prices_the_split(tmp_path):
    """thp_split_us comes from the measured rows: the chunk-pinned D2H time into THP memory
    over that into 4 KiB memory, per huge page smaps saw split."""
    from dataclasses import replace

    from gpuvm.calibrate.profile import load, to_toml
    from gpuvm.calibrate.stats import Spread

    prof = load(COSTS_DIR / "gpu-h200.toml")
    assert prof.thp_split_us() == 0.0
    rows, per_split = [], []
    for c in prof.d2h_into:
        if c.memory == "memfd-thp" and c.mode == "chunk-pinned" and c.huge_kib_before:
            # as if half the pages split and the copy took twice the 4 KiB one's time
            base = next(b for b in prof.d2h_into if (b.memory, b.mode, b.shmem_thp,
                        b.chunk_offset) == ("memfd-4k", c.mode, c.shmem_thp, c.chunk_offset))
            half = base.gib_s.median / 2
            c = replace(c, huge_kib_after=c.huge_kib_before // 2,
                        gib_s=Spread(half, half, half, 7))
            extra_us = c.nbytes / (1 << 30) / base.gib_s.median * 1e6
            per_split.append(extra_us / (c.huge_kib_before // 2 // 2048))
        rows.append(c)
    split = replace(prof, d2h_into=rows)
    assert len(per_split) == 2  # aligned grid and the one shifted 1 MiB
    assert split.thp_split_us() == pytest.approx(max(per_split), rel=1e-3)  # the worst
    path = tmp_path / "gpu-split.toml"
    path.write_text(to_toml(split))
    assert load_hostmem_costs(str(path)).thp_split_us == split.costs()["thp_split_us"]


def test_hostmem_profile_errors_name_the_culprit(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[hostmem]\nbase = "gpu-h200"\nsplit_us = 1.0\n')
    with pytest.raises(ValueError, match="unknown 'split_us'"):
        load_hostmem_costs(str(bad))
    with pytest.raises(ValueError, match="not found"):
        load_hostmem_costs("no-such-profile")


def test_vm_pt_footprint_exact_counts():
    one = vm_pt_footprint(regs.GiB)
    assert one["4k"]["ptes"] == 262144 and one["128k"]["ptes"] == 8192
    assert one["4k"]["entry_bytes"] == (262144 + 8) * 8
    eight = vm_pt_footprint(regs.GiB, vms=8)
    shared = vm_pt_footprint(regs.GiB, vms=8, shared=True)
    assert eight["4k"]["pt_bytes"] == 8 * one["4k"]["pt_bytes"]
    assert shared["4k"]["pt_bytes"] == one["4k"]["pt_bytes"]
    assert shared["4k"]["pdes"] == 8 * one["4k"]["pdes"]
    assert vm_pt_footprint(0)["4k"]["ptes"] == 0


def test_config_checks_hostmem_keys(monkeypatch):
    monkeypatch.delenv("GPUVM_RAM_ALLOC", raising=False)
    text = """
[experiment]
name = "x"
kind = "hostmem"
[[scenario]]
name = "s"
[[scenario.vm]]
name = "v"
benchmark = "memcpy"
ram_backing = "%s"
"""
    assert parse(text % "thp").scenarios[0].vms[0].ram_backing == "thp"
    with pytest.raises(ConfigError, match=r"vm\[0\]\.ram_backing: must be one of"):
        parse(text % "2m")
    assert parse(text % "4k").scenarios[0].vms[0].ram_alloc == "immediate"
    ondemand = (text % "4k") + 'ram_alloc = "ondemand"\n'
    assert parse(ondemand).scenarios[0].vms[0].ram_alloc == "ondemand"
    with pytest.raises(ConfigError, match=r"vm\[0\]\.ram_alloc: must be one of immediate"):
        parse(ondemand.replace("ondemand", "lazy"))
    bad_profile = text.replace('kind = "hostmem"', 'kind = "hostmem"\nhostmem_profiles = ["nope"]')
    with pytest.raises(ConfigError, match=r"hostmem_profiles: host-memory profile 'nope' not found"):
        parse(bad_profile % "thp")
    later = (text % "thp") + """
[[scenario]]
name = "t"
[[scenario.vm]]
name = "w"
benchmark = "hostmem"
pin_hot_from = "s/v"
"""
    with pytest.raises(ConfigError, match="pin_hot_from 's/v' is not a reporting VM"):
        parse(later)
    assert parse(later.replace('ram_backing = "thp"', 'ram_backing = "thp"\nhostmem_report = true'))


def test_spec_rejects_an_unknown_allocation():
    with pytest.raises(RunError, match="vm0: unknown guest RAM allocation 'lazy'"):
        VmSpec("vm0", "memcpy", ram_alloc="lazy").flags()


def test_spec_rejects_a_bad_chunk():
    with pytest.raises(RunError, match="pin chunk"):
        VmSpec("v", "memcpy", pin_chunks=True, pin_chunk_bytes=3000).flags()


def _hostmem_counts(result) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in result.session.phases:
        for k, v in p.counters.items():
            if "hostmem" in k:
                out[k] = out.get(k, 0) + v
    return out


def test_guest_without_the_flags_reports_nothing():
    (r,) = run_vms([VmSpec("vm0", "memcpy", [1 * MiB])], RunOptions(mode="native"))
    assert r.passed, r.error()
    assert _hostmem_counts(r) == {}


@pytest.mark.parametrize("backing,nohuge,cuts", [("4k", False, 0), ("thp", False, 8),
                                                 ("thp", True, 0)])
def test_guest_pins_pageable_copies_in_chunks(backing, nohuge, cuts):
    """16 MiB each way, 4 MiB chunks, buffers 1 MiB into their allocation: 4 pins per
    direction; each D2H chunk cuts two huge pages of THP-backed RAM, which the kernel
    splits only where the VMM advises the pinned ranges 4 KiB pages."""
    (r,) = run_vms([VmSpec("vm0", "memcpy", [16 * MiB, 0, 1 * MiB], ram_size=128 * MiB,
                           ram_backing=backing, hostmem_report=True, pin_chunks=True,
                           nohugepage_pinned=nohuge)], RunOptions(mode="fv-opt"))
    assert r.passed, r.error()
    c = _hostmem_counts(r)
    assert c["hostmem.pins"] == c["hostmem.unpins"] == 8
    assert c["hostmem.pin_bytes"] == 32 * MiB
    huge = r.session.hostmem.huge_kib_first
    if backing == "thp" and not huge:
        pytest.skip("the host gave this guest's RAM no huge pages")
    assert c.get("hostmem.huge_cuts", 0) == cuts
    assert (c.get("hostmem.huge_splits", 0) > 0) == nohuge  # only the madvise splits
    assert c["hostmem.xfer.htod.chunks.bytes"] == c["hostmem.xfer.dtoh.chunks.bytes"] == 16 * MiB
    assert r.session.hostmem.pinned_peak_bytes == 4 * MiB


def test_chunk_size_is_configurable():
    (r,) = run_vms([VmSpec("vm0", "memcpy", [4 * MiB], ram_size=64 * MiB, hostmem_report=True,
                           pin_chunks=True, pin_chunk_bytes=1 * MiB)], RunOptions(mode="native"))
    assert r.passed, r.error()
    assert _hostmem_counts(r)["hostmem.pins"] == 8


def test_smart_pinning_pins_only_what_the_profile_run_saw_hot():
    size = 256 * 1024
    (profile,) = run_vms([VmSpec("p", "hostmem", [size, 8, 0], hostmem_report=True)],
                         RunOptions(mode="native"))
    assert profile.passed, profile.error()
    transfers = profile.session.hostmem.transfers_per_alloc()
    assert transfers == {1: 16, 2: 2, 3: 2, 4: 2, 5: 16, 6: 2, 7: 2, 8: 2}
    assert profile.session.hostmem.pinned_peak_bytes == 0
    history = profile.session.hostmem.history()["events"]
    assert [e["op"] for e in history[:8]] == ["alloc"] * 8
    assert all(e["t_ns"] >= 0 for e in history)
    mask = hot_mask(transfers, threshold=2)
    runs = run_vms([VmSpec("smart", "hostmem", [size, 8, 2, mask], hostmem_report=True),
                    VmSpec("all", "hostmem", [size, 8, 1], hostmem_report=True)],
                   RunOptions(mode="native"))
    smart, every = runs
    assert smart.passed and every.passed
    assert smart.session.hostmem.pinned_peak_bytes == 2 * size
    assert every.session.hostmem.pinned_peak_bytes == 8 * size
    how = {e["alloc"]: e["how"] for e in smart.session.hostmem.events if e["op"] == "htod"}
    assert how == {1: "pinned", 2: "staged", 3: "staged", 4: "staged", 5: "pinned",
                   6: "staged", 7: "staged", 8: "staged"}
    costs = load_hostmem_costs("gpu-h200")

    def total(result) -> float:
        return costs.modelled_ns(_hostmem_counts(result))

    assert total(every) < total(profile) and total(smart) < total(profile)


SMALL = """
[experiment]
name = "hostmem-small"
kind = "hostmem"
modes = ["native"]
output = "{out}"
hostmem_profiles = ["gpu-h200", "hostmem-field-split"]
[[scenario]]
name = "bandwidth"
[[scenario.vm]]
name = "pinned"
benchmark = "memcpy"
params = [1048576, 1]
hostmem_report = true
[[scenario.vm]]
name = "pageable"
benchmark = "memcpy"
params = [1048576, 0]
hostmem_report = true
[[scenario]]
name = "thp"
[[scenario.vm]]
name = "thp"
benchmark = "memcpy"
params = [8388608, 0, 1048576]
ram_backing = "thp"
hostmem_report = true
pin_chunks = true
[[scenario]]
name = "profile"
[[scenario.vm]]
name = "none-256k"
benchmark = "hostmem"
params = [262144, 8, 0]
hostmem_report = true
[[scenario]]
name = "use"
[[scenario.vm]]
name = "smart-256k"
benchmark = "hostmem"
params = [262144, 8, 2]
hostmem_report = true
hot_threshold = 2
pin_hot_from = "profile/none-256k"
[[scenario.vm]]
name = "all-256k"
benchmark = "hostmem"
params = [262144, 8, 1]
hostmem_report = true
"""


def test_hostmem_experiment_rows_histories_and_report(tmp_path):
    import json

    from gpuvm.experiment.execute import execute
    from gpuvm.experiment.report import write_report
    from gpuvm.experiment.rundir import RunDir

    exp = parse(SMALL.format(out=tmp_path / "out"))
    run = RunDir.create(exp)
    rows = execute(exp, run)
    assert all(r.passed for r in rows), [r.error for r in rows]
    smart = next(r for r in rows if r.vm == "smart-256k")
    assert smart.record["hot_mask"] == "0x11"  # from the profile run's history
    assert smart.hostmem["pinned_peak_bytes"] == 2 * 262144
    assert smart.hostmem["pt_footprint"]["4k"]["ptes"] == 2 * 262144 // 4096
    thp = next(r for r in rows if r.vm == "thp")
    field = thp.hostmem["modelled_ns"]["hostmem-field-split"]
    assert thp.counters["hostmem.huge_cuts"] == 4  # 2 D2H chunks, 2 cuts each
    assert thp.counters.get("hostmem.huge_splits", 0) == 0  # the kernel split nothing
    assert field["cut"] == pytest.approx(4 * 215.2e3)
    assert thp.hostmem["modelled_ns"]["gpu-h200"]["split"] == 0
    history = json.loads((run.path / "history" / "profile-native-fifo-0-none-256k.json")
                         .read_text())
    assert sum(e["op"] == "htod" for e in history["events"]) == 22  # 2 hot x 8 + 6 cold
    md = write_report(exp, rows, run.path).read_text()
    for heading in ("measured vs modelled", "Huge pages and chunked pinning", "page-table footprint",
                    "Smart pinning"):
        assert heading in md
    bandwidth = [line for line in md.splitlines() if line.startswith("| h2d ")
                 or line.startswith("| d2h ")]
    assert len(bandwidth) == 4 and all(line.endswith("| yes |") for line in bandwidth)
    assert "| 4k | 1 | no | 262144 | 8 | 8 | 2097216 | 2097152 |" in md
    # read from the committed H200 profiles, not written in the code
    assert "THP result: with shmem THP `always`" in md and "split 0 of the 3072 huge pages" in md
    assert "smart beats none from 1048576 B" in md and "all beats none from 262144 B" in md
    assert "| 2m | 1 | 2054 | 524288 | 8409120 | 4194304 | yes, 4096/4096 translated |" in md


def test_bench_ram_alloc_runs_both_ways_side_by_side(capsys):
    from gpuvm import cli

    assert cli.main(["bench", "ram-alloc", "--modes", "native", "--vms", "1",
                     "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines()) and "…" not in out, out
    words = " ".join(out.split())
    assert "guest RAM up front vs on demand" in words and "ondemand /" in out
    assert "made fresh vs kept" in words and "│  kept │" in out and "│ fresh │" in out
    assert cli.main(["bench", "ram-alloc", "--modes", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bench ram-alloc: no mode 'nope' (have native" in err
    assert cli.main(["bench", "ram-alloc", "--vms", "0"]) == 2
    assert "VM counts >= 1" in capsys.readouterr().err
