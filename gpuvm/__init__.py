"""gpuvm: a GPU virtualization lab (GPUvm reproduced on an emulated Fermi GPU)."""
