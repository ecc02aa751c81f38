"""Traces of a run that Perfetto (ui.perfetto.dev, trace_processor) opens.

Written as Chrome trace-event JSON, which Perfetto imports as it is: one process per VM
(tracks: vCPU phases, engine slices, and counters for channels, utilisation, credit,
shadow syncs, hypercalls) and one process for the GPU (its scheduler's decisions).
"""

from gpuvm.trace.chrome import TraceRecorder

__all__ = ["TraceRecorder"]
