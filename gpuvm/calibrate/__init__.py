"""Calibration against real hardware, and the arithmetic that needs no hardware.

`gpuvm calibrate --gpu` measures host-memory transfer and pinning costs on a real NVIDIA
GPU and writes them as a cost/device profile; `gpuvm calibrate --pt-footprint` computes
(and cross-checks by building them) the GPU page tables that map pinned host memory.

Nothing here imports simpy or the VMM: the GPU part must run on a bare GPU machine with
only numpy, rich and CuPy or PyTorch installed.
"""
