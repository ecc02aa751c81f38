"""The VFIO user ABI: the constants of linux/vfio.h that gpuvm's devices speak.

Values are the kernel's (include/uapi/linux/vfio.h); tests/test_vfio_abi.py compiles a C
program against the machine's own header and checks them.
"""

from __future__ import annotations

# struct vfio_device_info.flags
VFIO_DEVICE_FLAGS_RESET = 1 << 0
VFIO_DEVICE_FLAGS_PCI = 1 << 1

# struct vfio_region_info.flags
VFIO_REGION_INFO_FLAG_READ = 1 << 0
VFIO_REGION_INFO_FLAG_WRITE = 1 << 1
VFIO_REGION_INFO_FLAG_MMAP = 1 << 2
VFIO_REGION_INFO_FLAG_CAPS = 1 << 3

# region-info capability ids
VFIO_REGION_INFO_CAP_SPARSE_MMAP = 1
VFIO_REGION_INFO_CAP_TYPE = 2

# vfio-pci region indices
VFIO_PCI_BAR0_REGION_INDEX = 0
VFIO_PCI_BAR1_REGION_INDEX = 1
VFIO_PCI_BAR2_REGION_INDEX = 2
VFIO_PCI_BAR3_REGION_INDEX = 3
VFIO_PCI_BAR4_REGION_INDEX = 4
VFIO_PCI_BAR5_REGION_INDEX = 5
VFIO_PCI_ROM_REGION_INDEX = 6
VFIO_PCI_CONFIG_REGION_INDEX = 7
VFIO_PCI_VGA_REGION_INDEX = 8
VFIO_PCI_NUM_REGIONS = 9

# vfio-pci IRQ indices
VFIO_PCI_INTX_IRQ_INDEX = 0
VFIO_PCI_MSI_IRQ_INDEX = 1
VFIO_PCI_MSIX_IRQ_INDEX = 2
VFIO_PCI_ERR_IRQ_INDEX = 3
VFIO_PCI_REQ_IRQ_INDEX = 4
VFIO_PCI_NUM_IRQS = 5

# struct vfio_irq_info.flags
VFIO_IRQ_INFO_EVENTFD = 1 << 0
VFIO_IRQ_INFO_MASKABLE = 1 << 1
VFIO_IRQ_INFO_AUTOMASKED = 1 << 2
VFIO_IRQ_INFO_NORESIZE = 1 << 3

# struct vfio_irq_set.flags
VFIO_IRQ_SET_DATA_NONE = 1 << 0
VFIO_IRQ_SET_DATA_BOOL = 1 << 1
VFIO_IRQ_SET_DATA_EVENTFD = 1 << 2
VFIO_IRQ_SET_ACTION_MASK = 1 << 3
VFIO_IRQ_SET_ACTION_UNMASK = 1 << 4
VFIO_IRQ_SET_ACTION_TRIGGER = 1 << 5

# struct vfio_iommu_type1_dma_map.flags
VFIO_DMA_MAP_FLAG_READ = 1 << 0
VFIO_DMA_MAP_FLAG_WRITE = 1 << 1
