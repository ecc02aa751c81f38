"""Guests may push anything: random pushbuffers fault their own channel at worst."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from gpuvm.device import regs
from gpuvm.device.host_driver import HostDriver

from test_device_end_to_end import SUB_COPY, Rig

words_st = st.lists(st.one_of(
    st.integers(0, 2 ** 32 - 1),
    st.builds(lambda t, c, s, m: (t << 29) | (c << 16) | (s << 13) | m,
              st.sampled_from([1, 3, 4, 5]), st.integers(0, 6), st.integers(0, 7),
              st.integers(0, 0xFFF)),
), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=words_st)
def test_random_pushbuffers(gpu, sysram, words):
    drv = HostDriver(gpu)
    drv.init()
    drv.setup_bar1(gpu.profile.bar1_size)
    for chid in (7, 8):  # start each example from unbound channels
        drv.wr(regs.PFIFO_CHAN_TABLE + chid * regs.PFIFO_CHAN_STRIDE, 0)
    victim = Rig(gpu, sysram, drv, 7, sys_base=4 * regs.MiB, n=8)
    fuzzed = Rig(gpu, sysram, drv, 8, sys_base=8 * regs.MiB, n=8)
    drv.submit_runlist([7, 8])
    before = len(gpu.faults())
    seq = fuzzed.run(words)
    # Either the fence arrives or the fuzzed channel faults (or blocks on an acquire).
    gpu.wait_event(lambda: sysram.read_u32(fuzzed.fence) == seq or
                   len(gpu.faults()) > before, 0.2)
    for fault in gpu.faults()[before:]:
        assert fault.chid == 8
        assert "internal error" not in fault.reason, fault
    vseq = victim.run(HostDriver.bind(SUB_COPY, regs.CLASS_COPY, regs.ENGINE_PCOPY0)
                      + HostDriver.copy(SUB_COPY, victim.sys_va(0), victim.va(0), 256))
    assert gpu.wait_event(lambda: sysram.read_u32(victim.fence) == vseq, 10)
    assert all(f.chid == 8 for f in gpu.faults()[before:])
