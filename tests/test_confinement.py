"""In-process guests are native code inside the VMM process: nothing confines one from
another.  Runs that need tenants confined refuse them, with one line saying why."""

from __future__ import annotations

import pytest

from gpuvm.experiment.config import ConfigError, parse
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.run.spec import RunError

from test_experiment_config import GOOD


def test_confined_run_refuses_several_in_process_vms():
    specs = [VmSpec("a", "vecadd", [1000]), VmSpec("b", "vecadd", [1000])]
    with pytest.raises(RunError, match="in-process guests are not confined"):
        run_vms(specs, RunOptions(mode="fv", backend="inproc", confined=True))


def test_one_in_process_vm_or_an_unconfined_run_is_allowed():
    (r,) = run_vms([VmSpec("a", "vecadd", [1000])],
                   RunOptions(mode="fv", backend="inproc", confined=True))
    assert r.passed, r.error()


def test_isolation_experiment_may_not_name_the_in_process_backend():
    text = GOOD.replace('kind = "isolation"', 'kind = "isolation"\nbackend = "inproc"')
    with pytest.raises(ConfigError, match="needs kvm"):
        parse(text, "t.toml")
    parse(GOOD.replace('kind = "isolation"', 'kind = "benchmarks"\nbackend = "inproc"'),
          "t.toml")
