"""`gpuvm bench vfio-user` end to end with few accesses (shape and plumbing, not timing),
and GPUVM_VFIO_USER_POLL_US, the poll-time override both sides read at import."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

from gpuvm.bench import vfio_user
from gpuvm.errors import UserError


def test_bench_measures_both_paths_of_this_checkout_and_a_baseline(
        capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    vfio_user.add_arguments(parser)
    # this checkout as its own baseline: two checkouts' rows, each probe importing gpuvm
    # from the checkout it was meant for (the bench refuses a probe that did not)
    args = parser.parse_args(["--accesses", "200", "--rounds", "1", "--target", "registers",
                              "--poll-us", "0", "--json",
                              "--baseline", str(vfio_user.THIS_CHECKOUT)])
    assert vfio_user.main_vfio_user(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["poll_us"] == 0 and out["accesses"] == 200 and len(out["rows"]) == 2
    for row in out["rows"]:
        assert row["kind"] == "registers"
        for figure in vfio_user.FIGURES:
            assert row[figure] > 0
        assert row["added_write_us"] == pytest.approx(row["socket_write_us"] -
                                                      row["inproc_write_us"])
        assert row["socket_write_spread"] == 0  # one round: nothing to spread
    vfio_user.print_vfio_user_bench(out)


def test_bench_refuses_a_directory_that_is_no_checkout(tmp_path) -> None:
    with pytest.raises(UserError, match="not a gpuvm checkout"):
        vfio_user.run_vfio_user_bench(accesses=10, rounds=1, baseline=tmp_path)
    with pytest.raises(UserError, match="--poll-us"):
        vfio_user.run_vfio_user_bench(accesses=10, rounds=1, poll_us=-1)


def _spin_under(value: str | None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("GPUVM_VFIO_USER_POLL_US", None)
    if value is not None:
        env["GPUVM_VFIO_USER_POLL_US"] = value
    return subprocess.run([sys.executable, "-c", "from gpuvm.vfio.user import protocol as p; "
                           "print(repr(p.SPIN_S), repr(p.DEFAULT_SPIN_S))"],
                          env=env, capture_output=True, text=True)


def test_poll_time_comes_from_the_environment_else_the_core_count() -> None:
    spin, default = map(float, _spin_under(None).stdout.split())
    assert spin == default == (50e-6 if len(os.sched_getaffinity(0)) >= 4 else 0.0)
    assert float(_spin_under("7.5").stdout.split()[0]) == pytest.approx(7.5e-6)
    assert float(_spin_under("0").stdout.split()[0]) == 0.0


@pytest.mark.parametrize("bad", ["fast", "-3", "1e9"])
def test_a_bad_poll_time_is_one_error_line(bad: str) -> None:
    done = _spin_under(bad)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"gpuvm: error: GPUVM_VFIO_USER_POLL_US={bad!r}: expected microseconds between 0 "
        f"and 1000000"]
