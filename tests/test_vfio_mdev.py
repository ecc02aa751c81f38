"""vGPUs as mediated devices: types and instances like mdevctl's, the VFIO attach path
(config space, regions, sparse areas, DMA mappings as the reference monitor for sysram),
eight default-type vGPUs on one GPU, and fv and pv vGPUs sharing the GPU at once."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpuvm.device import regs
from gpuvm.device.profile import load_profile
from gpuvm.device.gpu import Gpu
from gpuvm.device.host_driver import HostDriver
from gpuvm.mdevctl import MdevStore
from gpuvm.mediator.mdev_types import profile_types
from gpuvm.mediator.mediator import Mediator
from gpuvm.mediator.modes import MODES
from gpuvm.run import RunError, RunOptions, VmSpec, run_vms
from gpuvm.vfio import abi as vfio
from gpuvm.vfio.device import VfioError
from gpuvm.vmm.guest_ram import GuestRam
from gpuvm.vmm.kvm import kvm_usable

from test_device_end_to_end import SUB_COPY, Rig
from test_mediated_modes import phase_counts
from vfio_doubles import MmioPort, attached

KVM_OK, KVM_WHY = kvm_usable()
BACKENDS = ["inproc", pytest.param("kvm", marks=[pytest.mark.kvm,
                                                  pytest.mark.skipif(not KVM_OK, reason=KVM_WHY)])]
TYPES = ["gpuvm-Q6000-1Q", "gpuvm-Q6000-2Q", "gpuvm-Q6000-4Q", "gpuvm-Q6000-8Q"]


def available(out: str) -> dict[str, int]:
    """type id -> available instances, from `gpuvm mdev types` (mdevctl's layout)."""
    lines = out.splitlines()
    return {lines[i].strip(): int(lines[i + 1].split(":")[1])
            for i in range(len(lines) - 1) if lines[i].strip() in TYPES}


# ------------------------------------------------------------------------------ mdev CLI
def test_types_list_like_mdevctl(state, gpuvm_cli):
    rc, out, err = gpuvm_cli("mdev", "types")
    assert rc == 0 and err == ""
    assert out.splitlines()[0] == "0000:01:00.0"
    assert available(out) == {"gpuvm-Q6000-1Q": 1, "gpuvm-Q6000-2Q": 2,
                              "gpuvm-Q6000-4Q": 4, "gpuvm-Q6000-8Q": 8}
    assert "    Device API: vfio-pci" in out
    assert "Description: framebuffer=512M, channels=16, bar1=8M of 15M, bar3=8M" in out


def test_every_type_has_power_of_two_bars():
    """A PCI BAR is a power of two: libvfio-user refuses another size, QEMU asserts."""
    for t in profile_types(load_profile()).values():
        for size in (t.partition.bar1_size, t.partition.bar3_size):
            assert size > 0 and size & (size - 1) == 0, t.description


def test_create_list_remove_and_available_instances_follow(state, gpuvm_cli):
    uuids = []
    for i in range(3):
        rc, out, _ = gpuvm_cli("mdev", "create", "gpuvm-Q6000-8Q")
        assert rc == 0
        uuids.append(out.strip())
    rc, out, _ = gpuvm_cli("mdev", "create", "gpuvm-Q6000-4Q", "--uuid",
                       "c2177883-f1bb-47f0-914d-32a22e3a8804", "--mode", "pv")
    assert out.strip() == "c2177883-f1bb-47f0-914d-32a22e3a8804"
    _, out, _ = gpuvm_cli("mdev", "types")
    # three 8Q (16 channels, 15 MiB BAR1 each) and a 4Q (32 channels, 31 MiB BAR1) taken
    assert available(out) == {"gpuvm-Q6000-1Q": 0, "gpuvm-Q6000-2Q": 0,
                              "gpuvm-Q6000-4Q": 1, "gpuvm-Q6000-8Q": 3}
    _, out, _ = gpuvm_cli("mdev", "list")
    rows = out.splitlines()
    assert [r.split()[0] for r in rows] == uuids + ["c2177883-f1bb-47f0-914d-32a22e3a8804"]
    assert rows[-1].split()[1:] == ["0000:01:00.0", "gpuvm-Q6000-4Q", "pv"]
    assert gpuvm_cli("mdev", "remove", uuids[1])[0] == 0
    _, out, _ = gpuvm_cli("mdev", "types")
    assert available(out)["gpuvm-Q6000-8Q"] == 4
    assert uuids[1] not in gpuvm_cli("mdev", "list")[1]


def test_no_instance_left_bad_type_and_bad_uuid_are_one_line(state, gpuvm_cli):
    assert gpuvm_cli("mdev", "create", "gpuvm-Q6000-1Q")[0] == 0
    for argv, expect in [
        (("create", "gpuvm-Q6000-8Q"), "no instance available"),
        (("create", "gpuvm-Q9999-3Q"), "no mdev type 'gpuvm-Q9999-3Q'"),
        (("remove", "not-a-uuid"), "'not-a-uuid' is not a UUID"),
        (("remove", "c2177883-f1bb-47f0-914d-32a22e3a8804"), "no mdev c2177883"),
        (("create", "gpuvm-Q6000-8Q", "--mode", "native"), "not a mediated mode"),
    ]:
        rc, out, err = gpuvm_cli("mdev", *argv)
        assert rc == 2 and out == ""
        assert len(err.splitlines()) == 1 and err.startswith("gpuvm: error: ") and expect in err


def test_run_names_defined_mdevs(state, gpuvm_cli):
    """`gpuvm run --mdev` runs each VM on a defined vGPU: its type and mode."""
    store = MdevStore()
    fv = store.create("gpuvm-Q6000-8Q", mode="fv-opt").uuid
    pv = store.create("gpuvm-Q6000-4Q", mode="pv").uuid
    rc, out, err = gpuvm_cli("run", "--backend", "inproc", "-b", "madd", "--size", "16",
                         "--vms", "2", "--mdev", f"{fv},{pv}")
    assert rc == 0, err
    rows = [line.replace("│", " ").split() for line in out.splitlines()
            if line.strip("│ ").startswith("vm") and "1/1" in line]
    assert [(r[0], r[3]) for r in rows] == [("vm0", "gpuvm-Q6000-8Q"), ("vm1", "gpuvm-Q6000-4Q")]
    assert "vm0 fv-opt" in out and "vm1 pv" in out  # each vGPU's own mode


# ------------------------------------------------------------------------------ the device
def test_vgpu_regions_config_space_and_sparse_areas():
    gpu = Gpu(time_scale=1000.0, vram_size=2 * regs.GiB).start()
    med = Mediator(gpu)
    try:
        fv = med.add_vm("fv", MODES["fv"])
        opt = med.add_vm("opt", MODES["fv-opt"])
        pv = med.add_vm("pv", MODES["pv"])
        info = fv.get_info()
        assert info.flags & vfio.VFIO_DEVICE_FLAGS_PCI and info.num_regions == 9
        bar0 = fv.get_region_info(vfio.VFIO_PCI_BAR0_REGION_INDEX)
        assert bar0.size == regs.BAR0_SIZE and not bar0.mappable and bar0.sparse == ()
        assert not fv.get_region_info(1).mappable  # fv: everything traps
        bar1 = opt.get_region_info(1)  # fv-opt: the arena may be mapped where granted
        assert bar1.mappable and bar1.sparse[0].size == bar1.size == 16 * regs.MiB
        assert fv.get_region_info(regs.BAR4).size == 0  # no hypercall port without PV
        assert pv.get_region_info(regs.BAR4).size == regs.BAR4_SIZE
        config = vfio.VFIO_PCI_CONFIG_REGION_INDEX
        assert fv.read(config, regs.PCI_VENDOR_ID, 2) == regs.PCI_VENDOR_NVIDIA
        assert fv.read(config, regs.PCI_DEVICE_ID, 2) == regs.PCI_DEVICE_QUADRO_6000
        # BAR sizing as QEMU does it: write all ones, read back the size mask
        fv.write(config, regs.PCI_BASE_ADDRESS_0 + 4, 4, 0xFFFFFFFF)
        mask = fv.read(config, regs.PCI_BASE_ADDRESS_0 + 4, 4) & ~0xF
        assert (~mask & 0xFFFFFFFF) + 1 == 16 * regs.MiB
        pv.write(config, regs.PCI_BASE_ADDRESS_0 + 16, 4, 0xFFFFFFFF)
        io = pv.read(config, regs.PCI_BASE_ADDRESS_0 + 16, 4)
        assert io & regs.PCI_BASE_ADDRESS_SPACE_IO and (~(io & ~0x3) & 0xFFFFFFFF) + 1 == 16
        with pytest.raises(VfioError):
            fv.get_region_info(42)
    finally:
        med.close()
        gpu.release_memory()


def test_dma_mappings_confine_sysram_a_channel_outside_them_faults_alone():
    """The vGPU's DMA mappings are its only way to system memory: a channel whose page
    table names guest RAM its VMM did not DMA-map faults (that channel only), while the
    same VM's mapped RAM and another VM keep working."""
    gpu = Gpu(time_scale=1000.0, vram_size=3 * regs.GiB).start()
    med = Mediator(gpu)
    rams = [GuestRam(32 * regs.MiB), GuestRam(32 * regs.MiB)]
    try:
        vms = []
        for i, ram in enumerate(rams):
            vgpu = med.add_vm(f"vm{i}", MODES["fv"])
            att = attached(vgpu, ram, f"vm{i}")
            vms.append((vgpu, att, ram))
        # vm0's VMM maps only the first 8 MiB of its RAM for the device
        vgpu0, att0, ram0 = vms[0]
        vgpu0.dma_unmap(0, ram0.size)
        vgpu0.dma_map(0, ram0.array[:8 * regs.MiB], vfio.VFIO_DMA_MAP_FLAG_READ |
                      vfio.VFIO_DMA_MAP_FLAG_WRITE)
        results = []
        for (vgpu, att, ram), sys_base in zip(vms, (16 * regs.MiB, 4 * regs.MiB)):
            drv = HostDriver(MmioPort(vgpu))
            drv.init()
            drv.setup_bar1(16 * regs.MiB)
            rig = Rig(vgpu, ram, drv, 0, sys_base=sys_base, n=16)
            drv.submit_runlist([0])
            seq = rig.run(HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
                          + HostDriver.copy(SUB_COPY, rig.va(0), rig.sys_va(0), 64))
            results.append((vgpu, att, ram, rig, seq))
        for vgpu, att, ram, rig, seq in results:
            att.wait_event(lambda: ram.read_u32(rig.fence) == seq or bool(vgpu.faults()), 10)
        (v0, _, r0, rig0, seq0), (v1, _, r1, rig1, seq1) = results
        assert r0.read_u32(rig0.fence) != seq0  # its sysram window is not DMA-mapped
        assert v0.counters().get("shadow.ptes_refused", 0) > 0
        assert [f.chid for f in v0.faults()] == [0]
        assert r1.read_u32(rig1.fence) == seq1 and v1.faults() == []
        # what vm0's VMM did map is still reachable: the device wrote nothing outside it
        assert not r0.array[8 * regs.MiB:].any()
    finally:
        med.close()
        gpu.release_memory()
        for ram in rams:
            ram.close()


# ------------------------------------------------------------------------------ sharing
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["pv"])  # fv-opt: test_run_cli_eight_vms_fv_opt
def test_eight_default_type_vgpus_fit_and_pass(mode):
    """The paper's largest configuration: eight VMs with the default type on one GPU
    (what `gpuvm run -b madd --vms 8 --mode MODE` runs)."""
    specs = [VmSpec(f"vm{i}", "madd", [16], mdev_type="gpuvm-Q6000-8Q") for i in range(8)]
    results = run_vms(specs, RunOptions(mode=mode, backend="inproc", time_scale=1000.0,
                                        wait_slice=10.0, timeout=300))
    for r in results:
        assert r.passed, r.error()


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_fv_and_pv_vgpus_share_one_gpu_with_the_counts_they_have_alone(backend):
    """Two fv-opt VMs and two pv VMs at once on one GPU: each passes and counts exactly
    what it counts alone (the mode is a property of each vGPU)."""
    opts = RunOptions(mode="fv-opt", backend=backend, time_scale=1000.0, wait_slice=10.0,
                      timeout=300)
    layout = [("a", "fv-opt", "mmul", [32]), ("b", "fv-opt", "madd", [16]),
              ("c", "pv", "mmul", [32]), ("d", "pv", "madd", [16])]
    together = run_vms([VmSpec(n, b, p, mode=m) for n, m, b, p in layout], opts)
    for r, (name, mode, bench, params) in zip(together, layout):
        assert r.passed, r.error()
        assert (int(r.record["hypercalls"]) > 0) == (mode == "pv")
        (alone,) = run_vms([VmSpec(name, bench, params, mode=mode)], opts)
        assert phase_counts(r) == phase_counts(alone), name


def test_native_and_mediated_vms_cannot_share_a_run():
    with pytest.raises(Exception, match="native and mediated"):
        run_vms([VmSpec("a", "idle", [], mode="native"), VmSpec("b", "idle", [])],
                RunOptions(mode="fv", backend="inproc"))


def test_run_cli_eight_vms_fv_opt(tmp_path):
    """The command line itself: `gpuvm run -b madd --vms 8 --mode fv-opt` passes -- the
    paper's largest configuration, eight VMs of the default type on one GPU."""
    proc = subprocess.run([sys.executable, "-m", "gpuvm", "run", "-b", "madd", "--vms", "8",
                           "--mode", "fv-opt", "--backend", "inproc", "--size", "16"],
                          capture_output=True, text=True, timeout=600,
                          env={"GPUVM_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert sum(" 1/1 " in line for line in proc.stdout.splitlines()) == 8
    # every vGPU removed at its VM's last virtual time, none forced by the scheduler
    # (removals one after another waited for each other: 2 runs of 3 forced two)
    assert "not handled" not in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------ several GPUs
def test_four_vms_on_two_gpus_placed_by_type_availability(placement_watch):
    """Two instances of the 2Q type fit a GPU: four such VMs land two on each of two
    GPUs (each with its own mediator and scheduler) and all pass; a fifth has no room."""
    opts = RunOptions(mode="fv-opt", backend="inproc", gpus=2, time_scale=1000.0,
                      wait_slice=10.0, timeout=300)
    Watched, placed = placement_watch

    specs = [VmSpec(f"vm{i}", bench, params, mdev_type="gpuvm-Q6000-2Q")
             for i, (bench, params) in enumerate([("mmul", [32]), ("madd", [16]),
                                                  ("vecadd", [1000]), ("fmadd", [1000])])]
    results = run_vms(specs, opts, machine=Watched)
    for r in results:
        assert r.passed, r.error()
    assert placed == {"vm0": 0, "vm1": 0, "vm2": 1, "vm3": 1}
    with pytest.raises(RunError, match="vm4: no GPU has room"):
        run_vms(specs + [VmSpec("vm4", "idle", [], mdev_type="gpuvm-Q6000-2Q")], opts)
