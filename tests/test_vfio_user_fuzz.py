"""A hostile vfio-user client against `gpuvm serve`'s daemon, the short version of
`gpuvm bench vfio-user-fuzz` (which also runs a VM beside it): hypothesis draws the seeds
of the messages, so a failing sequence shrinks to the few messages that matter."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuvm.bench.vfio_user_fuzz import CASES, DaemonView, HostileClient, Tally
from gpuvm.mdevctl import MdevStore
from gpuvm.serve import MdevServer, socket_path


_FUZZ_IN_A_FRESH_PROCESS = """
import json
from gpuvm.bench.vfio_user_fuzz import fuzz
r = fuzz(3000, seed=7, co_runner=False)
print(json.dumps({"failures": len(r.tally.failures), "thread_errors": len(r.thread_errors),
                  "escapes": len(r.escapes), "still_serves": r.still_serves,
                  "fds_before": r.fds_before, "fds_after": r.fds_after,
                  "cases": sorted(r.tally.by_case), "closed": r.tally.closed_as_expected,
                  "fds_sent": r.tally.fds_sent}))
"""


def test_the_bench_reports_a_clean_run_and_covers_every_case(tmp_path):
    """The bench's own checks, on a short run without the co-runner VM, in a process of
    its own: its fd count is the daemon's, not whatever the suite's earlier tests in
    this worker still hold or are closing."""
    done = subprocess.run([sys.executable, "-c", _FUZZ_IN_A_FRESH_PROCESS],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "GPUVM_STATE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["failures"] and not report["thread_errors"] and not report["escapes"]
    assert report["still_serves"] and report["fds_after"] <= report["fds_before"]
    assert report["cases"] == sorted(CASES)
    assert report["closed"] >= 1 and report["fds_sent"] > 0


@pytest.fixture(scope="module")
def daemon():
    root = Path(tempfile.mkdtemp(prefix="gpuvm-", dir="/tmp"))  # short socket paths
    patch = pytest.MonkeyPatch()
    patch.setenv("GPUVM_STATE_DIR", str(root))
    definition = MdevStore().create("gpuvm-Q6000-2Q", mode="fv-opt")
    server = MdevServer([definition]).start()
    yield server, definition
    server.stop()
    patch.undo()
    shutil.rmtree(root, ignore_errors=True)


@settings(max_examples=25, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 2 ** 32 - 1), min_size=1, max_size=40))
def test_every_hostile_message_is_answered_or_ends_only_its_connection(daemon, seeds):
    server, definition = daemon
    tally = Tally()
    client = HostileClient(str(socket_path(definition.uuid)),
                           DaemonView(server, definition.uuid), tally)
    try:
        for seed in seeds:
            client.step(random.Random(seed))
    finally:
        client.close()
    assert not tally.failures, tally.failures
