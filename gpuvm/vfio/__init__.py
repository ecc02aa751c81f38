"""VFIO: the shape every GPU-facing device of gpuvm has.

`abi` holds the kernel's user ABI (linux/vfio.h) as constants and ctypes structures;
`device` the device interface of that shape (region info with sparse-mmap areas, region
read/write, DMA map, IRQ eventfds, reset) that the emulated physical GPU and each vGPU
(mdev) implement, and that the VMM attaches the way QEMU's vfio-pci does; `caps` the bytes
of a region-info reply with its capability chain; `kernel` a client of the host kernel's
VFIO that offers a real GPU bound to vfio-pci through the same interface (README.md here
says how to bind one).
"""
