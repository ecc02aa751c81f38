"""The VMM fork server: forked VMMs end, are killed and are reported as Popen's are,
and a fork server that dies leaves no VMM unaccounted for."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import pytest

from gpuvm.vmm.vmm_forks import UNKNOWN_EXIT, VmmForkServer


@pytest.fixture
def forks():
    server = VmmForkServer()
    yield server
    server.close()


def spawn_silent(forks: VmmForkServer) -> tuple:
    """A VMM whose vfio-user server never answers: it waits for VERSION's reply."""
    ours, theirs = socket.socketpair()
    try:
        vmm = forks.spawn({"name": "silent"}, theirs.fileno())
    finally:
        theirs.close()
    return vmm, ours


def assert_serves(forks: VmmForkServer) -> None:
    """A VMM forked now runs (it sends VERSION) and is killed."""
    vmm, ours = spawn_silent(forks)
    try:
        assert ours.recv(64)
        vmm.kill()
        assert vmm.wait(30) == -signal.SIGKILL
    finally:
        ours.close()
        vmm.close()


def test_a_forked_vmm_reports_how_it_ended(capfd: pytest.CaptureFixture) -> None:
    forks = VmmForkServer()  # started here, so that its stderr (its VMMs') is captured
    try:
        ours, theirs = socket.socketpair()
        ours.close()  # no server: its VERSION finds the socket closed, and it fails
        vmm = forks.spawn({"name": "orphan-socket"}, theirs.fileno())
        theirs.close()
        assert vmm.wait(60) == 1
        assert vmm.stdout.read() == ""
        vmm.close()
    finally:
        forks.close()
    assert "VfioError: orphan-socket: vfio-user socket" in capfd.readouterr().err


def test_a_forked_vmm_is_killed_through_its_pidfd(forks: VmmForkServer) -> None:
    vmm, ours = spawn_silent(forks)
    try:
        assert ours.recv(64)  # its VERSION: it runs
        assert vmm.poll() is None
        with pytest.raises(subprocess.TimeoutExpired):
            vmm.wait(0.05)
        vmm.kill()
        assert vmm.wait(30) == -signal.SIGKILL
        vmm.kill()  # reaped: a no-op, never another process
    finally:
        ours.close()
        vmm.close()


def test_the_fork_server_forks_from_one_thread(forks: VmmForkServer) -> None:
    vmm, ours = spawn_silent(forks)
    try:
        assert ours.recv(64)
        assert os.listdir(f"/proc/{forks.process.pid}/task") == [str(forks.process.pid)]
    finally:
        vmm.kill()
        vmm.wait(30)
        ours.close()
        vmm.close()


def test_a_vmm_outlives_its_fork_server_and_is_still_accounted_for(
        forks: VmmForkServer) -> None:
    """A fork server that dies leaves its VMMs collectable, and the next spawn starts a
    fresh one: a crash costs the run no VM started after it."""
    vmm, ours = spawn_silent(forks)
    first = forks.process
    try:
        assert ours.recv(64)
        first.kill()
        first.wait(30)
        deadline = time.monotonic() + 30
        while not forks.gone and time.monotonic() < deadline:
            time.sleep(0.01)
        assert vmm.poll() is None  # still running, now nobody's child
        vmm.kill()
        assert vmm.wait(30) == UNKNOWN_EXIT  # it ended; how, no one is left to say
        assert_serves(forks)
        assert forks.process is not first
    finally:
        ours.close()
        vmm.close()


def test_ctrl_c_is_the_runs_to_act_on(forks: VmmForkServer) -> None:
    """SIGINT (a Ctrl-C reaches the whole process group) leaves the fork server serving;
    a VMM takes it as a fresh interpreter would, and ends."""
    vmm, ours = spawn_silent(forks)
    try:
        assert ours.recv(64)
        os.kill(forks.process.pid, signal.SIGINT)
        os.kill(vmm.pid, signal.SIGINT)
        assert vmm.wait(30) != 0
        time.sleep(0.1)
        assert forks.process.poll() is None
        assert_serves(forks)
    finally:
        ours.close()
        vmm.close()
