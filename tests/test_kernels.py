"""The engine's kernel library on the host: a kernel's host work stays on one thread."""
from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_matrix_kernel_keeps_numpys_blas_on_one_thread():
    """In a fresh interpreter (the limit is set once per process): BLAS starts with a
    thread per core, and after one mmul it has one -- its idle threads would otherwise
    spin on the cores the VMs' vCPUs need."""
    probe = textwrap.dedent("""
        import numpy as np
        from threadpoolctl import threadpool_info, threadpool_limits
        from gpuvm.device import regs
        from gpuvm.device.kernels import KERNELS
        from gpuvm.device.profile import load_profile

        threadpool_limits(limits=2, user_api="blas")  # what a 2-core host starts with
        before = {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}

        class Memory:
            def __init__(self):
                self.data = np.zeros(3 * 4 * 8 * 8, dtype=np.uint8)
            def read(self, va, length):
                return self.data[va:va + length]
            def write(self, va, data):
                self.data[va:va + len(data)] = data

        mem = Memory()
        a = np.arange(64, dtype=np.float32)
        mem.write(0, a.view(np.uint8))
        mem.write(256, np.eye(8, dtype=np.float32).reshape(-1).view(np.uint8))
        params = [0, 0, 256, 0, 512, 0, 8, 0]
        KERNELS[regs.KERNEL_MMUL].run(mem, params, load_profile().compute)
        after = {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
        assert np.array_equal(mem.read(512, 256).view(np.float32), a), "wrong product"
        print(sorted(before), sorted(after))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[2]", "[1]"], out.stdout
