"""Running benchmarks in VMs: specs (`spec`), machines (`native`, `mediated`), the run
loop (`execute`), tables (`tables`) and the `gpuvm run` command (`cli`)."""

from gpuvm.run.execute import machine_for, run_vms
from gpuvm.run.result import VmResult
from gpuvm.run.spec import RunError, RunOptions, VmSpec

__all__ = ["RunError", "RunOptions", "VmResult", "VmSpec", "machine_for", "run_vms"]
