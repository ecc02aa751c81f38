"""The real C guest driver (native mode, in-process) programs the device the way nouveau
does: its BAR0 trace around every runlist submission is gf100_fifo_runlist_commit's wait
on the runlist event, its copies are nvc0_bo_move_copy's launches, the last one fenced
the way Gdev fences a copy, its channels start as nouveau_channel_init starts them and
its fences are nvc0_fence_emit32's."""

from __future__ import annotations

from gpuvm.device import regs
from gpuvm.device.pushbuffer import PushDecoder
from gpuvm.run import RunOptions, VmSpec, run_vms
from gpuvm.run.native import NativeMachine
from gpuvm.vfio.passthrough import PassthroughGpu


class Recorder(PassthroughGpu):
    """The passed-through GPU, keeping the guest's BAR0 accesses."""

    def __init__(self, gpu) -> None:
        super().__init__(gpu)
        self.trace: list[tuple[str, int, int]] = []

    def read(self, region: int, offset: int, size: int) -> int:
        value = super().read(region, offset, size)
        if region == regs.BAR0:
            self.trace.append(("r", offset, value))
        return value

    def write(self, region: int, offset: int, size: int, value: int) -> None:
        if region == regs.BAR0:
            self.trace.append(("w", offset, value))
        super().write(region, offset, size, value)


class RecordingNative(NativeMachine):
    """Native mode whose device is watched: BAR0 accesses and copy-class methods."""

    last: "RecordingNative"

    def __init__(self, options, specs) -> None:
        super().__init__(options, specs)
        self.recorder: Recorder | None = None
        self.copy_methods: list[tuple[int, int]] = []
        RecordingNative.last = self

    device_class = Recorder

    def attach(self, spec) -> Recorder:
        recorder = super().attach(spec)
        gpu = recorder.gpu
        copy = gpu.classes[regs.CLASS_COPY]
        inner = copy.on_method

        def on_method(ch, obj, mem, method, value, now):
            self.copy_methods.append((method, value))
            return inner(ch, obj, mem, method, value, now)

        copy.on_method = on_method
        self.recorder = recorder
        return recorder


def run_native(bench: str, params: list[int]) -> RecordingNative:
    opts = RunOptions(mode="native", backend="inproc", time_scale=1000.0, wait_slice=10.0,
                      timeout=120)
    results = run_vms([VmSpec("vm0", bench, params)], opts, machine=RecordingNative)
    assert results[0].passed, results[0].session.console
    return RecordingNative.last


def test_guest_waits_for_the_runlist_event_like_gf100_fifo_runlist_commit():
    """After each PFIFO_RUNLIST_SUBMIT the guest reads PFIFO_INTR and finds bit 30, reads
    0x2a00 and acks bit 28 ("update done") as gf100_fifo_intr_runlist does, then reads
    0x227c until PENDING (bit 20) is clear -- and leaves no runlist event pending."""
    machine = run_native("idle", [])
    trace = machine.recorder.trace
    submits = [i for i, (op, off, _) in enumerate(trace)
               if op == "w" and off == regs.PFIFO_RUNLIST_SUBMIT]
    assert len(submits) >= 2  # channel create and destroy
    for i in submits:
        after = trace[i + 1:i + 5]
        assert [(op, off) for op, off, _ in after] == [
            ("r", regs.PFIFO_INTR), ("r", 0x2A00), ("w", 0x2A00), ("r", 0x227C)], after
        assert after[0][2] & 0x40000000
        assert after[1][2] & 0x10000000 and after[2][2] == 0x10000000
        assert not after[3][2] & 0x100000
    assert machine.recorder.read(regs.BAR0, 0x2A00, 4) == 0


def test_guest_copies_like_nvc0_bo_move_copy_and_gdev_memcpy_pcopy0():
    """memcpy of 100000 bytes (24 pages and a tail): launches are nouveau's
    nvc0_bo_move_copy shape -- pitches and XCNT of one page, YCNT the page count (the
    tail: one line of the rest), EXEC 0x110 -- except the last of each copy, which carries
    the fence as Gdev's nvc0_fence_write + nvc0_memcpy_pcopy0 do: query address and a new
    counter (0x338..0x340), then EXEC 0x3110.  The benchmark's own check passes."""
    machine = run_native("memcpy", [100000])
    shapes, state, fences = [], {}, []
    for m, v in machine.copy_methods:
        state[m] = v
        if m == regs.COPY_LAUNCH:
            shapes.append((state[regs.COPY_PITCH_IN], state[regs.COPY_PITCH_OUT],
                           state[regs.COPY_LINE_BYTES], state[regs.COPY_LINE_COUNT], v))
            if v == regs.COPY_LAUNCH_GDEV:
                fences.append(state[regs.COPY_QUERY_SEQUENCE])
    assert {s[4] for s in shapes} == {regs.COPY_LAUNCH_NOUVEAU, regs.COPY_LAUNCH_GDEV}
    assert (4096, 4096, 4096, 24, regs.COPY_LAUNCH_NOUVEAU) in shapes
    assert (100000 - 24 * 4096,) * 3 + (1, regs.COPY_LAUNCH_GDEV) in shapes
    assert len(fences) == 2 and fences[0] < fences[1]  # HtoD and DtoH, each fenced once


def test_guest_channel_like_nouveau_channel_init_and_nvc0_fence_emit32(monkeypatch):
    """The guest's first push on a channel starts with NOUVEAU_DMA_SKIPS (32) zero words,
    as nouveau_channel_init pads it, and every fence is nvc0_fence_emit32's: SEMAPHOREA-D
    with a 16-byte release (0x2) and NON_STALL_INTERRUPT -- each one a non-stall
    interrupt on the device."""
    segments: list[list[int]] = []
    decode = PushDecoder.decode

    def recording(self, words):
        segments.append(words.tolist())
        return decode(self, words)

    monkeypatch.setattr(PushDecoder, "decode", recording)
    machine = run_native("madd", [16])
    assert segments[0][:32] == [0] * 32 and segments[0][32] != 0
    emit32 = 0x20000000 | 5 << 16 | 0x10 >> 2
    fences = [s[s.index(emit32):] for s in segments if emit32 in s]
    assert fences and all(f[4:6] == [0x2, 0] for f in fences)
    counters = machine.recorder.gpu.counters()
    assert counters["pfifo.notify_intrs"] == len(fences)
    assert counters.get("pfifo.skipped_methods", 0) == 0 and not machine.recorder.gpu.faults()
