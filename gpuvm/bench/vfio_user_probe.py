"""One measurement for `gpuvm bench vfio-user`, run as a process of its own inside the
checkout being measured (its working directory), so that one run can put two checkouts'
vfio-user code side by side: this file is executed by path, and every `gpuvm` import
below resolves to the checkout it runs in.

It therefore uses only what every checkout with vfio-user has had: `bench_target` and
`serve_target` of gpuvm/bench/exits.py, `VfioUserDevice`, and `protocol.SPIN_S` (set here
on both sides instead of through GPUVM_VFIO_USER_POLL_US, which older checkouts lack).

Prints one JSON object: µs per access for `device.write` and `device.read` of one BAR0
register, made on the device object in this process and over a vfio-user socket to the
same kind of device served by a child process.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import gpuvm
import gpuvm.vfio.user.protocol as p
from gpuvm.bench.exits import bench_target, served_target

REGISTER = 0x140  # PMC_INTR_EN: the register `gpuvm bench exits` stores to


BATCHES = 5


def _per_access_us(device, accesses: int, write: bool) -> float:
    """µs per call: a warm-up, then `accesses` calls (writes alternate two values) in
    BATCHES batches; the fastest batch counts, so that a moment of host noise (another
    process taking the core) does not."""
    if write:
        def loop(n: int) -> None:
            w = device.write
            for i in range(n):
                w(0, REGISTER, 4, i & 1)
    else:
        def loop(n: int) -> None:
            r = device.read
            for _ in range(n):
                r(0, REGISTER, 4)
    loop(min(1000, accesses))
    batch = max(1, accesses // BATCHES)
    best = None
    for _ in range(BATCHES):
        gc.collect()
        start = time.perf_counter_ns()
        loop(batch)
        took = time.perf_counter_ns() - start
        best = took if best is None else min(best, took)
    return best / batch / 1e3


def measure(kind: str, accesses: int, poll_us: float) -> dict:
    p.SPIN_S = poll_us * 1e-6
    result = {"kind": kind, "accesses": accesses, "poll_us": poll_us,
              "gpuvm": gpuvm.__file__}
    device, _, release = bench_target(kind)
    try:
        result["inproc_write_us"] = _per_access_us(device, accesses, True)
        result["inproc_read_us"] = _per_access_us(device, accesses, False)
    finally:
        release()
    device, release = served_target(kind, poll_us)
    try:
        result["socket_write_us"] = _per_access_us(device, accesses, True)
        result["socket_read_us"] = _per_access_us(device, accesses, False)
    finally:
        release()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind")
    parser.add_argument("accesses", type=int)
    parser.add_argument("poll_us", type=float)
    args = parser.parse_args()
    print(json.dumps(measure(args.kind, args.accesses, args.poll_us)))


if __name__ == "__main__":
    main()
