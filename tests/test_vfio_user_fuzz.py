"""A hostile vfio-user client against `gpuvm serve`'s daemon, the short version of
`gpuvm bench vfio-user-fuzz` (which also runs a VM beside it): hypothesis draws the seeds
of the messages, so a failing sequence shrinks to the few messages that matter."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuvm.bench.vfio_user_fuzz import CASES, DaemonView, HostileClient, Tally, fuzz
from gpuvm.mdevctl import MdevStore
from gpuvm.serve import MdevServer, socket_path


def test_the_bench_reports_a_clean_run_and_covers_every_case():
    """The bench's own checks, on a short run without the co-runner VM (first: the
    daemon of the next test would share this process's fd count)."""
    report = fuzz(3000, seed=7, co_runner=False)
    assert not report.tally.failures and not report.thread_errors and not report.escapes
    assert report.still_serves and report.fds_after <= report.fds_before
    assert set(report.tally.by_case) == set(CASES)
    assert report.tally.closed_as_expected >= 1 and report.tally.fds_sent > 0


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
