"""`gpuvm serve` and `gpuvm vm start`: separate processes, one socket per mdev."""

from __future__ import annotations

import os
import shutil
import tempfile
import signal
import stat
import subprocess
import sys
import time

import pytest

from gpuvm.mdevctl import MdevStore
from gpuvm.serve import MdevServer, socket_dir, socket_path
from gpuvm.vfio.device import VfioError
from gpuvm.vfio.user.client import VfioUserDevice


@pytest.fixture
def served(monkeypatch):
    tmp_path = tempfile.mkdtemp(prefix="gpuvm-", dir="/tmp")  # socket paths are short
    monkeypatch.setenv("GPUVM_STATE_DIR", tmp_path)
    store = MdevStore()
    defs = [store.create("gpuvm-Q6000-2Q", mode="fv-opt"),
            store.create("gpuvm-Q6000-2Q", mode="pv")]
    server = MdevServer(defs).start()
    yield server, defs, tmp_path
    server.stop()
    shutil.rmtree(tmp_path, ignore_errors=True)


def vm_start(uuid: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "gpuvm", "vm", "start", "--mdev", uuid,
                             "--backend", "inproc", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_sockets_are_private_and_one_vmm_per_mdev(served):
    server, defs, root = served
    assert stat.S_IMODE(os.stat(socket_dir()).st_mode) == 0o700
    for d in defs:
        assert stat.S_IMODE(os.stat(socket_path(d.uuid)).st_mode) == 0o600
    first = VfioUserDevice.connect(str(socket_path(defs[0].uuid)))
    with pytest.raises(VfioError):  # the mdev is held: a second VMM is turned away
        VfioUserDevice.connect(str(socket_path(defs[0].uuid))).get_info()
    first.close()


def test_killed_vmm_leaves_the_daemon_and_the_other_vm_running(served):
    server, (fv, pv), _ = served
    victim = vm_start(fv.uuid, "-b", "loop", "-p", "200000")
    other = vm_start(pv.uuid, "-b", "mmul", "-p", "32")
    deadline = time.monotonic() + 60
    while fv.uuid not in server.active and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # well into its run
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    out, err = other.communicate(timeout=300)
    assert other.returncode == 0, err
    assert "PASS" in out
    deadline = time.monotonic() + 10
    while fv.uuid in server.active and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fv.uuid not in server.active  # its vGPU was removed, its partition freed
    again = vm_start(fv.uuid, "-b", "mmul", "-p", "32")  # and the mdev serves anew
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0 and "PASS" in out, err
