"""Fermi (GF100) register map: the one place where offsets and bit layouts live.

Everything that touches the hardware interface -- the device model, the mediator's trap
handlers, the shadow code and (through the generated C header) the guest driver -- takes
its numbers from here.  Values follow ../shared/reference/fermi-mmio.md (envytools /
nouveau / Gdev).  Names ending in ``_EXT`` are this emulator's own additions where real
hardware reports through mechanisms we do not model; they are documented as such.

Run ``python -m gpuvm.device.regs`` to print the C header the guest build uses.
"""

from __future__ import annotations

import sys

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

# --------------------------------------------------------------------------------------
# PCI identity and BARs
# --------------------------------------------------------------------------------------
PCI_VENDOR_NVIDIA = 0x10DE
PCI_DEVICE_QUADRO_6000 = 0x06D8
PCI_REVISION_QUADRO_6000 = 0xA3

BAR0 = 0  # MMIO registers
BAR1 = 1  # VRAM aperture through the BAR1 VM
BAR3 = 3  # RAMIN aperture through the BAR3 VM
BAR4 = 4  # GPUvm's paravirtual hypercall port (an I/O BAR of PV vGPUs; not on real cards)
BAR0_SIZE = 32 * MiB
BAR4_SIZE = 16  # I/O ports: +0 = hypercall doorbell (the record's guest-physical address)
BAR4_HYPERCALL = 0x0

# PCI configuration space (type 0 header).  gpuvm presents BAR1 and BAR3 as 32-bit
# prefetchable memory BARs (the card's are 64-bit), which frees the BAR4 slot for the
# PV hypercall port.
PCI_CONFIG_SIZE = 256
PCI_VENDOR_ID = 0x00  # 16 bits
PCI_DEVICE_ID = 0x02  # 16 bits
PCI_COMMAND = 0x04  # 16 bits
PCI_COMMAND_IO = 1 << 0
PCI_COMMAND_MEMORY = 1 << 1
PCI_COMMAND_MASTER = 1 << 2
PCI_STATUS = 0x06  # 16 bits
PCI_REVISION_ID = 0x08  # 8 bits; class code follows in 0x09-0x0b
PCI_CLASS_PROG = 0x09
PCI_CLASS_DISPLAY_VGA = 0x030000  # base class 3 (display), subclass 0 (VGA), prog-if 0
PCI_HEADER_TYPE = 0x0E
PCI_BASE_ADDRESS_0 = 0x10  # BAR n at 0x10 + 4n
PCI_BASE_ADDRESS_SPACE_IO = 0x1
PCI_BASE_ADDRESS_MEM_PREFETCH = 0x8
PCI_SUBSYSTEM_VENDOR_ID = 0x2C
PCI_SUBSYSTEM_ID = 0x2E
PCI_SUBSYSTEM_QUADRO_6000 = 0x076F
PCI_INTERRUPT_PIN = 0x3D

# --------------------------------------------------------------------------------------
# BAR0 blocks (start offsets); used for per-block access counting
# --------------------------------------------------------------------------------------
BLOCK_PMC = 0x000000
BLOCK_PBUS = 0x001000
BLOCK_PFIFO = 0x002000
BLOCK_PTIMER = 0x009000
BLOCK_PFB_PART = 0x022000  # memory partition config (count of partitions)
BLOCK_PBDMA = 0x040000
BLOCK_PFLUSH = 0x070000
BLOCK_PFB = 0x100000
BLOCK_PFFB = 0x100800
BLOCK_PCOPY0 = 0x104000
BLOCK_PCOPY1 = 0x105000
BLOCK_PFBPA = 0x10F000  # per-partition memory amounts
BLOCK_PGRAPH = 0x400000
BLOCK_PDISPLAY = 0x610000
BLOCK_PRAMIN = 0x700000

# --------------------------------------------------------------------------------------
# PMC
# --------------------------------------------------------------------------------------
PMC_BOOT_0 = 0x000000
PMC_BOOT_0_QUADRO_6000 = 0x0C0C00A3
PMC_INTR = 0x000100
PMC_INTR_EN = 0x000140
PMC_ENABLE = 0x000200

PMC_INTR_PCOPY0 = 1 << 5
PMC_INTR_PCOPY1 = 1 << 6
PMC_INTR_PFIFO = 1 << 8
PMC_INTR_PGRAPH = 1 << 12
PMC_INTR_PTIMER = 1 << 20
PMC_INTR_PBUS = 1 << 28
PMC_INTR_EN_HW = 1 << 0
PMC_INTR_EN_SW = 1 << 1

PMC_ENABLE_PCOPY0 = 1 << 6
PMC_ENABLE_PCOPY1 = 1 << 7
PMC_ENABLE_PFIFO = 1 << 8
PMC_ENABLE_PGRAPH = 1 << 12
PMC_ENABLE_PTIMER = 1 << 16

# --------------------------------------------------------------------------------------
# PBUS host memory windows
# --------------------------------------------------------------------------------------
PBUS_PRAMIN_BASE = 0x001700  # bits 0-23: VRAM address >> 16
PBUS_PRAMIN_BASE_MASK = 0x00FFFFFF
PBUS_PRAMIN_BASE_SHIFT = 16
PBUS_BAR1_VM = 0x001704
PBUS_BAR3_VM = 0x001714
PBUS_BARVM_INST_MASK = 0x0FFFFFFF  # instance block address >> 12
PBUS_BARVM_TARGET_SHIFT = 28
PBUS_BARVM_TARGET_MASK = 0x3
PBUS_BARVM_ENABLE = 1 << 31  # MODE: 1 = through the BAR VM, 0 = plain VRAM (pbus.xml)

PRAMIN_WINDOW = 0x700000
PRAMIN_WINDOW_SIZE = 1 * MiB

# Memory targets (page-table entries, instance pointers, runlists)
TARGET_VRAM = 0
TARGET_SYSRAM = 2
TARGET_SYSRAM_NOSNOOP = 3

# --------------------------------------------------------------------------------------
# Memory amount discovery (nouveau gf100_ram_probe: 0x022438 parts, 0x10f20c + i*0x1000 MiB)
# --------------------------------------------------------------------------------------
PFB_PART_COUNT = 0x022438
PFBPA_PART_SIZE_MIB = 0x10F20C  # + part * PFBPA_PART_STRIDE
PFBPA_PART_STRIDE = 0x1000
PFB_MAX_PARTS = 8

# --------------------------------------------------------------------------------------
# PFIFO
# --------------------------------------------------------------------------------------
PFIFO_INTR = 0x002100
PFIFO_INTR_EN = 0x002140
PFIFO_INTR_CHAN_TABLE = 1 << 0
PFIFO_INTR_SCHED = 1 << 8  # envytools: PLAYLIST (a runlist the device cannot use)
PFIFO_INTR_VM_FAULT = 1 << 28
PFIFO_INTR_PBDMA = 1 << 29
PFIFO_INTR_RUNLIST = 1 << 30  # level: PFIFO_INTR_RUNLIST_STATUS != 0
PFIFO_INTR_ENGINE = 1 << 31  # level: PFIFO_ENGINE_INTR_SOURCE != 0 (the non-stall interrupt)

# FIFO engine interrupts (rnndb gf100_pfifo.xml ENGINE_INTR*; nvkm gf100_fifo_intr_engine):
# a bit per FIFO engine in SOURCE, a word per engine whose nibbles carry NOTIFY in bit 0
# (the host NOTIFY_INTR / NON_STALL_INTERRUPT method), written back to acknowledge;
# ENGINE_INTR_EN gates which bits count (nvkm's gf100_fifo_init writes 1).
PFIFO_ENGINE_INTR_SOURCE = 0x0025A4
PFIFO_ENGINE_INTR = 0x0025A8  # + 4 * FIFO engine
PFIFO_ENGINE_INTR_STRIDE = 4
PFIFO_ENGINE_INTR_COUNT = 16
PFIFO_ENGINE_INTR_NOTIFY = 1 << 0
PFIFO_ENGINE_INTR_EN = 0x002628
FIFO_ENGINE_PGRAPH = 0  # the FIFO engine a channel's host NOTIFY_INTR is reported on

# PBDMA (the GF100 pusher/puller unit; envytools calls it PSUBFIFO), unit 0: what nvkm's
# gf100_fifo_intr_pbdma reads.  SOURCE has a bit per unit with a pending interrupt
# (PFIFO_INTR bit 29 is its level); INTR holds the reasons (write 1s to ack); METHOD0 /
# DATA0 the trapped method (subchannel << 16 | method) and its data; CHAN the channel.
PFIFO_PBDMA_INTR_SOURCE = 0x0025A0
PFIFO_PBDMA_ENABLE = 0x002204  # a bit per PBDMA; nvkm counts the bits that stick: one
PMC_PBDMA_ENABLE = 0x000204  # nvkm's gf100_fifo_init writes (1 << PBDMAs) - 1
PBDMA_COUNT = 1
PBDMA_CONFIG = 0x04013C  # nvkm masks bits 8 and 28 off at init; stored
PBDMA_INTR = 0x040108  # + 0x2000 * unit
PBDMA_INTR_EN = 0x04010C
PBDMA_METHOD0 = 0x0400C0
PBDMA_DATA0 = 0x0400C4
PBDMA_CHAN = 0x040120  # bits 0-6: channel id
PBDMA_STRIDE = 0x2000
PBDMA_METHOD0_SUBC_SHIFT = 16
PBDMA_METHOD0_NOP = 0x80600008  # what nvkm writes to METHOD0 to let the channel go on
PBDMA_INTR_MEMREQ = 1 << 0  # a pushbuffer/IB read the device could not make
PBDMA_INTR_GPENTRY = 1 << 15  # a bad GPFIFO entry ("seen with null ib push", nvkm)
PBDMA_INTR_PBENTRY = 1 << 18  # a pushbuffer word that is no command
PBDMA_INTR_ILLEGAL_MTHD = 1 << 21  # a host method that does not exist: skipped
PBDMA_INTR_EMPTY_SUBC = 1 << 23  # a method on a subchannel with no object: skipped
PBDMA_INTR_CHANNEL_STOPPED_EXT = 1 << 28  # emulator: the channel stopped (CHAN_ERROR_EXT)

PFIFO_CTRL = 0x002200
PFIFO_CTRL_ENABLE = 1 << 0

PFIFO_USERD_POLL = 0x002254  # bits 0-27: BAR1-VM address >> 12, bit 28 enable
PFIFO_USERD_POLL_ADDR_MASK = 0x0FFFFFFF
PFIFO_USERD_POLL_ENABLE = 1 << 28

USERD_STRIDE = 0x1000  # channel c's USERD page = poll base + c * USERD_STRIDE

PFIFO_RUNLIST_ADDR = 0x002270  # address >> 12, target in bits 28-29
PFIFO_RUNLIST_ADDR_MASK = 0x0FFFFFFF
PFIFO_RUNLIST_TARGET_SHIFT = 28
PFIFO_RUNLIST_SUBMIT = 0x002274  # bits 0-11 length; writing submits (nouveau ORs 0x01f00000)
PFIFO_RUNLIST_LEN_MASK = 0xFFF
PFIFO_RUNLIST_STATUS = 0x00227C
PFIFO_RUNLIST_PENDING = 1 << 20
PFIFO_INTR_RUNLIST_STATUS = 0x002A00  # the runlist event interrupt's status; write 1s to ack
PFIFO_RUNLIST_EVENT_DONE = 1 << 28  # "update done": what nouveau waits for after a submit
RUNLIST_ENTRY_SIZE = 8
RUNLIST_ENTRY_WORD1 = 0x00000004

PFIFO_KICK = 0x002634  # write chid, poll until it reads back chid

PFIFO_FAULT_UNIT_MASK = 0x00259C  # a bit per fault unit with a pending record; write 1 clears
PFIFO_FAULT_RECORD = 0x002800  # + 0x10 * unit
PFIFO_FAULT_RECORD_STRIDE = 0x10
PFIFO_FAULT_INST = 0x0  # instance >> 12
PFIFO_FAULT_ADDR_LO = 0x4
PFIFO_FAULT_ADDR_HI = 0x8
PFIFO_FAULT_FLAGS = 0xC  # bits 0-3 reason, bit 6 HUB, bit 7 write, bits 8-12 client
PFIFO_FAULT_FLAGS_REASON_MASK = 0xF
PFIFO_FAULT_FLAGS_HUB = 1 << 6  # the client is a hub client (else a GPC client)
PFIFO_FAULT_FLAGS_WRITE = 1 << 7
PFIFO_FAULT_FLAGS_CLIENT_SHIFT = 8
PFIFO_FAULT_FLAGS_CLIENT_MASK = 0x1F
PFIFO_FAULT_FLAGS_GPC_SHIFT = 24  # bits 24-28: GPC id of a GPC client
PFIFO_FAULT_UNITS = 32

PFIFO_CHAN_TABLE = 0x003000  # + 8 * chid
PFIFO_CHAN_STRIDE = 8
PFIFO_CHAN_INST_MASK = 0x0FFFFFFF
PFIFO_CHAN_TARGET_SHIFT = 28
PFIFO_CHAN_VALID = 1 << 31
PFIFO_CHAN_STATE = 0x003004  # + 8 * chid
PFIFO_CHAN_STATE_RUNNABLE = 1 << 0
PFIFO_CHAN_STATE_CREATE = 0x001F0001  # what nouveau writes on channel create
NUM_CHANNELS = 128

# Emulator extension: per-channel error status.  Real hardware reports pushbuffer and
# engine errors through PBDMA/engine interrupt registers we do not model in detail; one
# word per channel says why that channel stopped (bit 31 faulted, bits 0-7 reason).
PFIFO_CHAN_ERROR_EXT = 0x003800  # + 4 * chid
PFIFO_CHAN_ERROR_STRIDE_EXT = 4
PFIFO_CHAN_ERROR_FAULTED_EXT = 1 << 31
PFIFO_CHAN_ERROR_REASON_MASK_EXT = 0xFF

# VM fault reasons (fault record flags bits 0-3)
FAULT_PDE_NOT_PRESENT = 0
FAULT_PT_TOO_SHORT = 1
FAULT_PAGE_NOT_PRESENT = 2
FAULT_VM_LIMIT = 3
FAULT_NO_CHANNEL = 4
FAULT_SUPERVISOR_ONLY = 5
FAULT_READ_ONLY = 6

# Fault units / clients (which engine faulted)
FAULT_UNIT_PGRAPH = 0x00
FAULT_UNIT_BAR1 = 0x04
FAULT_UNIT_BAR3 = 0x05
FAULT_UNIT_PFIFO = 0x07
FAULT_UNIT_PCOPY0 = 0x15
FAULT_UNIT_PCOPY1 = 0x16

# Fault clients (record flags bits 8-12), as nouveau's gf100_fifo_fault_hubclient and
# envytools' GF100_VM_HUBCLIENT / GF100_VM_GPCCLIENT name them
FAULT_HUBCLIENT_PCOPY0 = 0x01
FAULT_HUBCLIENT_PCOPY1 = 0x02
FAULT_HUBCLIENT_PFIFO = 0x06
FAULT_HUBCLIENT_BAR_READ = 0x07
FAULT_HUBCLIENT_BAR_WRITE = 0x08
FAULT_GPCCLIENT_TPC0_L1 = 0x00  # compute loads and stores

# Emulator extension: channel error reasons (PFIFO_CHAN_ERROR_EXT bits 0-7)
CHAN_ERR_NONE_EXT = 0
CHAN_ERR_VM_FAULT_EXT = 1  # details in the fault record of the engine's unit
CHAN_ERR_BAD_METHOD_HEADER_EXT = 2
CHAN_ERR_UNKNOWN_CLASS_EXT = 3
CHAN_ERR_UNKNOWN_METHOD_EXT = 4
CHAN_ERR_BAD_GPFIFO_ENTRY_EXT = 5
CHAN_ERR_BAD_KERNEL_OBJECT_EXT = 6
CHAN_ERR_SIZE_LIMIT_EXT = 7
CHAN_ERR_NO_OBJECT_EXT = 8  # method on a subchannel with no object bound
CHAN_ERR_DMA_TARGET_EXT = 9  # sysram address outside the memory the VMM gave the device
CHAN_ERR_BAD_INSTANCE_EXT = 10  # unreadable or unsigned RAMIN
CHAN_ERR_IB_EMPTY_EXT = 11  # a zero-length GPFIFO entry (DMA pusher error IB_EMPTY)
CHAN_ERR_UNSUPPORTED_EXT = 12  # a valid request this model does not carry out (tiled copy)
CHAN_ERR_TIMEOUT_EXT = 13  # killed by the hypervisor's watchdog (held the GPU too long)

# --------------------------------------------------------------------------------------
# PTIMER
# --------------------------------------------------------------------------------------
PTIMER_TIME_0 = 0x009400  # low 32 bits, ns; bits 0-4 read as zero; writing sets the time
PTIMER_TIME_0_MASK = 0xFFFFFFE0
PTIMER_TIME_1 = 0x009410  # high 32 bits (nvkm writes it first, then TIME_0)
PTIMER_INTR_0 = 0x009100  # bit 0 ALARM; write 1s to clear
PTIMER_INTR_EN_0 = 0x009140
PTIMER_INTR_ALARM = 1 << 0
PTIMER_NUMERATOR = 0x009200  # stored: the model's timer always counts nanoseconds
PTIMER_DENOMINATOR = 0x009210
PTIMER_ALARM_0 = 0x009420  # the alarm fires when TIME's low 32 bits reach it

# --------------------------------------------------------------------------------------
# PFLUSH
# --------------------------------------------------------------------------------------
PFLUSH_FLUSH = 0x070000  # write PFLUSH_TRIGGER; poll until PFLUSH_BUSY clears
PFLUSH_TRIGGER = 1 << 0
PFLUSH_BUSY = 1 << 1  # nouveau polls (0x070000 & 2)

# --------------------------------------------------------------------------------------
# PFFB VM config and TLB flush
# --------------------------------------------------------------------------------------
PFFB_VM_CFG = 0x100C80
PFFB_VM_CFG_LARGE_64K = 1 << 0  # 0 = 128 KiB large pages / 128 MiB per PDE, 1 = 64 KiB / 64 MiB
PFFB_VM_CFG_FLUSH_DONE = 1 << 15
PFFB_VM_CFG_SLOTS_SHIFT = 16
PFFB_VM_CFG_SLOTS_MASK = 0xFF
PFFB_FLUSH_PAGE = 0x100CB4  # VA >> 12 in bits 4-31
PFFB_FLUSH_PD = 0x100CB8  # PD address >> 8 (bits 4-31 = addr >> 12), bit 1 sysram (either kind)
PFFB_FLUSH_PD_SYSRAM = 1 << 1
PFFB_FLUSH_PD_ADDR_SHIFT = 8
PFFB_FLUSH_TRIGGER = 0x100CBC
PFFB_TRIGGER_GO = 1 << 31
PFFB_TRIGGER_ALL_PAGES = 1 << 0
PFFB_TRIGGER_ALL_PDS = 1 << 1
PFFB_TRIGGER_HUB_ONLY = 1 << 2
PFFB_TRIGGER_BAR_VM = 0x80000005  # what nouveau writes for BAR VMs

# --------------------------------------------------------------------------------------
# PCOPY falcons (current/next channel instance; bit 30 valid)
# --------------------------------------------------------------------------------------
PCOPY_CUR_CHAN = 0x050
PCOPY_NEXT_CHAN = 0x054
PCOPY_CHAN_VALID = 1 << 30

# --------------------------------------------------------------------------------------
# PGRAPH
# --------------------------------------------------------------------------------------
PGRAPH_INTR = 0x400100
PGRAPH_INTR_NOTIFY = 1 << 0  # a notifier written (nvkm gf100_gr_intr acks it here)
PGRAPH_INTR_ILLEGAL_MTHD = 1 << 4  # a method the bound graph-engine class lacks: skipped
PGRAPH_TRAP_ADDR = 0x400704  # the illegal method: subchannel << 16 | method
PGRAPH_TRAP_DATA = 0x400708  # its data
PGRAPH_TRAP_SUBC_SHIFT = 16
PGRAPH_FIFO_ACCESS = 0x400500  # nvkm writes 0x00010001 after handling: accepted
PGRAPH_STATUS = 0x400700  # non-zero while busy

# --------------------------------------------------------------------------------------
# Channel instance block (RAMIN), 4 KiB
# --------------------------------------------------------------------------------------
RAMIN_SIZE = 0x1000
RAMIN_USERD_LO = 0x008  # target in bits 0-1, address bits 12-31
RAMIN_USERD_HI = 0x00C
RAMIN_SIGNATURE = 0x010
RAMIN_SIGNATURE_VALUE = 0x0000FACE
RAMIN_GPFIFO_LO = 0x048  # GPFIFO VA bits 0-31
RAMIN_GPFIFO_HI = 0x04C  # log2(entries) << 16 | VA bits 32-39
RAMIN_GPFIFO_LOG2_SHIFT = 16
RAMIN_GPFIFO_LOG2_MASK = 0x1F
RAMIN_PD_LO = 0x200  # page directory address lo (target in bits 0-1)
RAMIN_PD_HI = 0x204
RAMIN_LIMIT_LO = 0x208  # VM limit (last valid byte)
RAMIN_LIMIT_HI = 0x20C
RAMIN_GRCTX_LO = 0x210
RAMIN_GRCTX_HI = 0x214
RAMFC_END = 0x200  # offsets below this are RAMFC (saved FIFO state)
# Where the device saves a channel's progress when it is unbound and loads it when it is
# bound again (NVIDIA's RAMFC layout, whose USERD 0x08, signature 0x10, ACQUIRE 0x30 and
# GP_BASE 0x48/0x4c are the words nvkm's gf100_fifo_gpfifo_new writes).  A driver that
# zeroes a new instance block starts its channel at entry 0.
RAMFC_GP_PUT = 0x000
RAMFC_GP_GET = 0x014
RAMFC_SEMAPHOREA = 0x038  # semaphore address bits 32-39
RAMFC_SEMAPHOREB = 0x03C  # address bits 0-31
RAMFC_SEMAPHOREC = 0x040  # sequence
RAMFC_PROGRESS_WORDS = (RAMFC_GP_PUT, RAMFC_GP_GET, RAMFC_SEMAPHOREA, RAMFC_SEMAPHOREB,
                        RAMFC_SEMAPHOREC)
RAMIN_ADDR_TARGET_MASK = 0x3
RAMIN_ADDR_MASK = 0xFFFFF000

# --------------------------------------------------------------------------------------
# GPU virtual memory formats
# --------------------------------------------------------------------------------------
VA_BITS = 40
VA_LIMIT = 1 << VA_BITS
PDE_COUNT = 8192  # 128 KiB large-page mode (the default)
PDE_SIZE = 8
PD_BYTES = PDE_COUNT * PDE_SIZE  # 64 KiB
PDE_SPAN_SHIFT = 27  # each PDE covers 128 MiB
PDE_SPAN = 1 << PDE_SPAN_SHIFT
PDE_SPAN_SHIFT_64K = 26  # 64 KiB large-page mode: 64 MiB per PDE (nouveau gf100_vmm_desc_16_12)
PDE_COUNT_64K = 16384
PD_BYTES_64K = PDE_COUNT_64K * PDE_SIZE  # 128 KiB
LARGE_PAGE_SHIFT_64K = 16
SMALL_PAGE_SHIFT = 12
SMALL_PAGE = 1 << SMALL_PAGE_SHIFT
LARGE_PAGE_SHIFT = 17  # 128 KiB (PFFB_VM_CFG bit 0 clear)
LARGE_PAGE = 1 << LARGE_PAGE_SHIFT
SMALL_PTES_PER_PT = PDE_SPAN >> SMALL_PAGE_SHIFT  # 32768 (256 KiB table)
LARGE_PTES_PER_PT = PDE_SPAN >> LARGE_PAGE_SHIFT  # 1024
PTE_SIZE = 8

# PDE (nouveau gf100_vmm_pgd_pde): each half names its table's memory with a 2-bit target
PDE_LARGE_TARGET_SHIFT = 0  # bits 0-1: large-PT target (PDE_TARGET_*)
PDE_SMALL_TARGET_SHIFT = 32  # bits 32-33: small-PT target
PDE_TARGET_MASK = 0x3
PDE_TARGET_ABSENT = 0
PDE_TARGET_VRAM = 1
PDE_TARGET_SYSRAM = 2  # coherent (snooped) sysram; nouveau adds the volatile bit
PDE_TARGET_SYSRAM_NOSNOOP = 3
PDE_SMALL_VOLATILE = 1 << 34
PDE_LARGE_VOLATILE = 1 << 35
PDE_LARGE_PRESENT = PDE_TARGET_VRAM << PDE_LARGE_TARGET_SHIFT  # a large PT in VRAM
PDE_SIZE_SHIFT = 2  # bits 2-3: PT size (0 full, 1 1/2, 2 1/4, 3 1/8)
PDE_SIZE_MASK = 0x3
PDE_LARGE_ADDR_SHIFT = 4  # bits 4-31: large-PT address >> 12
PDE_SMALL_PRESENT = PDE_TARGET_VRAM << PDE_SMALL_TARGET_SHIFT  # a small PT in VRAM
PDE_SMALL_ADDR_SHIFT = 36  # bits 36-63: small-PT address >> 12
PDE_ADDR_FIELD_MASK = 0x0FFFFFFF

PTE_PRESENT = 1 << 0
PTE_SUPERVISOR = 1 << 1
PTE_READ_ONLY = 1 << 2
PTE_ADDR_SHIFT = 4  # bits 4-31: physical address >> 12 (PTE = phys >> 8 | flags)
PTE_ADDR_FIELD_MASK = 0x0FFFFFFF
PTE_VOLATILE = 1 << 32
PTE_TARGET_SHIFT = 33  # bits 33-34
PTE_TARGET_MASK = 0x3
PTE_KIND_SHIFT = 36  # bits 36-43

CHANNEL_VA_BASE = 128 * MiB  # nouveau allocates channel VAs from here

# --------------------------------------------------------------------------------------
# Command submission: USERD, GPFIFO, method headers
# --------------------------------------------------------------------------------------
# The channel control area (envytools dma-pusher.rst): in IB mode the device keeps the
# pushbuffer pointers here -- PUT/GET are the current segment's end and how far it has
# read (low 32 bits; the high 8 in *_HIGH), MGET the same for "main" segments -- which
# nouveau's READ_GET polls (0x44 / 0x60) to reuse pushbuffer space.
USERD_DMA_PUT = 0x40
USERD_DMA_GET = 0x44
USERD_REF = 0x48
USERD_DMA_PUT_HIGH = 0x4C
USERD_DMA_MGET = 0x58
USERD_DMA_MGET_HIGH = 0x5C  # bits 0-7 high address, bit 31 MGET valid
USERD_DMA_MGET_VALID = 1 << 31
USERD_DMA_GET_HIGH = 0x60
USERD_GP_GET = 0x88
USERD_GP_PUT = 0x8C

GPFIFO_ENTRY_SIZE = 8
GPFIFO_LEN_SHIFT = 10  # word1 bits 10-30: length in 32-bit words
GPFIFO_LEN_MASK = 0x1FFFFF
GPFIFO_VA_HI_MASK = 0xFF
GPFIFO_NOT_MAIN = 1 << 9  # word1: not the main pushbuffer (DMA_MGET is left alone)
GPFIFO_MAX_LOG2 = 16  # largest ring the device accepts (64 Ki entries)

# GF100 method headers (envytools docs/hw/fifo/dma-pusher.rst, "GF100 commands"):
# bits 29-31 type; the new forms carry count (or immediate data) in bits 16-28,
# subchannel 13-15, method >> 2 in 0-11.  Types 0 and 2 keep the pre-GF100 forms, told
# apart by bits 16-17 ("tert"): count in bits 18-28, the method's byte address in 2-12.
MTHD_TYPE_SHIFT = 29
MTHD_TYPE_GRP0 = 0  # tert 0: increasing methods (old form); 1-3: SLI commands
MTHD_TYPE_INC = 1
MTHD_TYPE_GRP2 = 2  # tert 0: non-increasing methods (old form); 1-3: no such command
MTHD_TYPE_NONINC = 3
MTHD_TYPE_IMMD = 4
MTHD_TYPE_INC_ONCE = 5
MTHD_COUNT_SHIFT = 16
MTHD_COUNT_MASK = 0x1FFF
MTHD_SUBC_SHIFT = 13
MTHD_SUBC_MASK = 0x7
MTHD_ADDR_MASK = 0xFFF  # method >> 2
MTHD_TERT_SHIFT = 16
MTHD_TERT_MASK = 0x3
MTHD_TERT_OLD_METHODS = 0
MTHD_TERT_SLI_CONDITIONAL = 1
MTHD_TERT_SLI_MASK_STORE = 2
MTHD_TERT_SLI_CONDITIONAL_MASK = 3
MTHD_OLD_COUNT_SHIFT = 18
MTHD_OLD_COUNT_MASK = 0x7FF
MTHD_OLD_ADDR_MASK = 0x1FFC  # the method's byte address

# Host (PFIFO) methods, valid on any subchannel
HOST_OBJECT = 0x00  # class bits 0-15, engine bits 16-20
HOST_OBJECT_ENGINE_SHIFT = 16
HOST_OBJECT_ENGINE_MASK = 0x1F
HOST_NOP = 0x08
HOST_SEMAPHORE_ADDR_HI = 0x10
HOST_SEMAPHORE_ADDR_LO = 0x14
HOST_SEMAPHORE_SEQUENCE = 0x18
HOST_SEMAPHORE_TRIGGER = 0x1C
HOST_NOTIFY_INTR = 0x20  # the non-stall interrupt (cl906f NON_STALL_INTERRUPT)
HOST_WRCACHE_FLUSH = 0x24
HOST_REF_CNT = 0x50
HOST_YIELD = 0x80
HOST_METHODS_END = 0x100  # methods below this are host methods

SEM_ACQUIRE_EQUAL = 1
SEM_RELEASE = 2
SEM_ACQUIRE_GEQUAL = 4
SEM_ACQUIRE_MASK = 8  # wait until (word & sequence) != 0
SEM_OP_MASK = 0xF
SEM_SHORT = 1 << 24  # release writes the 32-bit sequence only
SEM_RELEASE_BYTES = 16  # {sequence, 0, 64-bit timestamp}

ENGINE_PGRAPH = 0
ENGINE_PCOPY0 = 4
ENGINE_PCOPY1 = 5

# --------------------------------------------------------------------------------------
# Engine classes and their methods
# --------------------------------------------------------------------------------------
CLASS_M2MF = 0x9039
CLASS_COMPUTE = 0x90C0
CLASS_COPY = 0x90B5  # GF100 copy engine 0 (PCOPY0)
CLASS_COPY1 = 0x90B8  # GF100 copy engine 1 (PCOPY1): nouveau's "COPY1", same methods

# Compute 0x90c0 (Gdev order)
COMPUTE_GRID_XY = 0x0238  # y << 16 | x
COMPUTE_GRID_Z = 0x023C
COMPUTE_LAUNCH = 0x0368
COMPUTE_BLOCK_XY = 0x03AC
COMPUTE_BLOCK_Z = 0x03B0
COMPUTE_CODE_OFFSET = 0x03B4  # entry offset from the code address
COMPUTE_CODE_ADDR_HI = 0x1608
COMPUTE_CODE_ADDR_LO = 0x160C
COMPUTE_CB_BIND = 0x1694
COMPUTE_QUERY_ADDR_HI = 0x1B00
COMPUTE_QUERY_ADDR_LO = 0x1B04
COMPUTE_QUERY_SEQUENCE = 0x1B08
COMPUTE_QUERY_GET = 0x1B0C
COMPUTE_CB_SIZE = 0x2380
COMPUTE_CB_ADDR_HI = 0x2384
COMPUTE_CB_ADDR_LO = 0x2388
COMPUTE_CB_POS = 0x238C
COMPUTE_CB_DATA = 0x2390
QUERY_GET_SHORT = 1 << 28  # query writes the 32-bit sequence only
QUERY_GET_INTR = 1 << 20  # Gdev's "intr = 1 will cause an interrupt too": PGRAPH NOTIFY
# Methods Gdev's nvc0_init / nvc0_launch / nvc0_membar / nvc0_notify_intr also send,
# named as Gdev names them.  They set up what real SASS needs (local and shared memory,
# register and barrier counts, cache split, the g[] windows); the library kernels that
# stand in for SASS need none of it, so the values are kept and otherwise unused.
COMPUTE_NOP = 0x0100  # GRAPH_NOP; with a notify armed, writes it (see COMPUTE_NOTIFY_*)
COMPUTE_NOTIFY_ADDR_HI = 0x0104
COMPUTE_NOTIFY_ADDR_LO = 0x0108
COMPUTE_NOTIFY_TYPE = 0x010C  # 1 = WRITTEN_AND_AWAKEN: write the notifier, interrupt
COMPUTE_NOTIFY_WRITTEN_AND_AWAKEN = 1
NOTIFY_BYTES = 16  # {time lo, time hi, info32 0, info16 0 | status 0 (done) << 16}
COMPUTE_SERIALIZE = 0x0110
COMPUTE_LOCAL_POS_ALLOC = 0x0204
COMPUTE_LOCAL_NEG_ALLOC = 0x0208
COMPUTE_WARP_CSTACK_SIZE = 0x020C
COMPUTE_SHARED_BASE = 0x0214
COMPUTE_MEM_BARRIER = 0x021C
COMPUTE_SHARED_SIZE = 0x024C
COMPUTE_TH_ALLOC = 0x0250
COMPUTE_BARRIER_ALLOC = 0x0254
COMPUTE_BEGIN = 0x029C
COMPUTE_UNK2A0 = 0x02A0
COMPUTE_CP_GPR_ALLOC = 0x02C0
COMPUTE_GLOBAL_BASE_ENABLE = 0x02C4  # Gdev's UNK2C4
COMPUTE_GLOBAL_BASE = 0x02C8
COMPUTE_CACHE_SPLIT = 0x0308
COMPUTE_UNK360 = 0x0360
COMPUTE_UNK36C = 0x036C
COMPUTE_MP_LIMIT = 0x0758
COMPUTE_LOCAL_BASE = 0x077C
COMPUTE_GRIDID = 0x0780
COMPUTE_TEMP_ADDR_HI = 0x0790
COMPUTE_TEMP_ADDR_LO = 0x0794
COMPUTE_TEMP_SIZE_HI = 0x0798
COMPUTE_TEMP_SIZE_LO = 0x079C
COMPUTE_WARP_TEMP_ALLOC = 0x07A0
COMPUTE_END = 0x0A04
COMPUTE_UNKA08 = 0x0A08
COMPUTE_CALL_LIMIT_LOG = 0x0D64
COMPUTE_FLUSH = 0x1698  # FLUSH_CODE 0x1, FLUSH_GLOBAL 0x10, FLUSH_CB 0x1000: writes are
COMPUTE_SETUP_METHODS = (  # never cached here, so a flush has nothing to do
    COMPUTE_SERIALIZE, COMPUTE_LOCAL_POS_ALLOC, COMPUTE_LOCAL_NEG_ALLOC,
    COMPUTE_WARP_CSTACK_SIZE, COMPUTE_SHARED_BASE, COMPUTE_MEM_BARRIER, COMPUTE_SHARED_SIZE,
    COMPUTE_TH_ALLOC, COMPUTE_BARRIER_ALLOC, COMPUTE_BEGIN, COMPUTE_UNK2A0,
    COMPUTE_CP_GPR_ALLOC, COMPUTE_GLOBAL_BASE_ENABLE, COMPUTE_GLOBAL_BASE, COMPUTE_CACHE_SPLIT,
    COMPUTE_UNK360, COMPUTE_UNK36C, COMPUTE_MP_LIMIT, COMPUTE_LOCAL_BASE, COMPUTE_GRIDID,
    COMPUTE_TEMP_ADDR_HI, COMPUTE_TEMP_ADDR_LO, COMPUTE_TEMP_SIZE_HI, COMPUTE_TEMP_SIZE_LO,
    COMPUTE_WARP_TEMP_ALLOC, COMPUTE_END, COMPUTE_UNKA08, COMPUTE_CALL_LIMIT_LOG,
    COMPUTE_FLUSH, COMPUTE_NOTIFY_ADDR_HI, COMPUTE_NOTIFY_ADDR_LO, COMPUTE_NOTIFY_TYPE)
CB_MAX_SIZE = 0x10000

# Copy 0x90b5, as nouveau's copy firmware (nvkm/engine/ce/fuc/com.fuc) takes it
COPY_LAUNCH = 0x0300  # EXEC
COPY_WRCACHE_FLUSH = 0x0304
COPY_SRC_HI = 0x030C
COPY_SRC_LO = 0x0310
COPY_DST_HI = 0x0314
COPY_DST_LO = 0x0318
COPY_PITCH_IN = 0x031C
COPY_PITCH_OUT = 0x0320
COPY_LINE_BYTES = 0x0324  # XCNT: elements per line (bytes unless FORMAT)
COPY_LINE_COUNT = 0x0328  # YCNT: always used
# FORMAT: bits 0-15 a 4-bit selector per destination component (0-3 source component,
# 4/5 SWZ_CONST0/1, 6+ no write), 16-17 component size - 1, 20-21 source components - 1,
# 24-25 destination components - 1
COPY_FORMAT = 0x032C
COPY_SWZ_CONST0 = 0x0330
COPY_SWZ_CONST1 = 0x0334
COPY_QUERY_ADDR_HI = 0x0338
COPY_QUERY_ADDR_LO = 0x033C
COPY_QUERY_SEQUENCE = 0x0340
COPY_LAUNCH_FORMAT = 1 << 0  # remap components per COPY_FORMAT
COPY_LAUNCH_SRC_LINEAR = 1 << 4  # clear: tiled source
COPY_LAUNCH_DST_LINEAR = 1 << 8  # clear: tiled destination
COPY_LAUNCH_QUERY = 1 << 12  # write the query when the copy is done
COPY_LAUNCH_QUERY_SHORT = 1 << 13  # ... the counter only (else {counter, 0, time lo, hi})
COPY_LAUNCH_NOUVEAU = COPY_LAUNCH_SRC_LINEAR | COPY_LAUNCH_DST_LINEAR  # 0x110
COPY_LAUNCH_GDEV = COPY_LAUNCH_NOUVEAU | COPY_LAUNCH_QUERY | COPY_LAUNCH_QUERY_SHORT  # 0x3110
COPY_XCNT_MASK = 0xFFFF  # the firmware rejects wider values (INVALID_BITFIELD)
COPY_YCNT_MASK = 0x1FFF
COPY_PITCH_MASK = 0x7FFFF
COPY_FORMAT_MASK = 0x0333FFFF
COPY_SWZ_CONST0_SEL = 4  # FORMAT selector values beyond the source components
COPY_SWZ_CONST1_SEL = 5
COPY_SWZ_NO_WRITE_SEL = 6
COPY_MAX_BYTES = 1 << 32  # one launch moves at most 4 GiB

# M2MF 0x9039 (envytools rnndb/graph/gf100_m2mf.xml)
M2MF_EXEC = 0x0300
M2MF_OUT_HI = 0x0238
M2MF_OUT_LO = 0x023C
M2MF_IN_HI = 0x030C
M2MF_IN_LO = 0x0310
M2MF_PITCH_IN = 0x0314
M2MF_PITCH_OUT = 0x0318
M2MF_LINE_LENGTH = 0x031C
M2MF_LINE_COUNT = 0x0320
M2MF_QUERY_ADDR_HI = 0x032C
M2MF_QUERY_ADDR_LO = 0x0330
M2MF_QUERY_SEQUENCE = 0x0334
M2MF_EXEC_PUSH = 1 << 0  # data comes through M2MF_DATA (not modelled: refused)
M2MF_EXEC_LINEAR_IN = 1 << 4  # clear: block-linear source (not modelled)
M2MF_EXEC_LINEAR_OUT = 1 << 8
M2MF_EXEC_QUERY_SHIFT = 12  # bits 12-13: 2 = write the query when done
M2MF_EXEC_QUERY_MASK = 0x3
M2MF_EXEC_QUERY_YES = 2
M2MF_EXEC_QUERY_SHORT = 1 << 20

# --------------------------------------------------------------------------------------
# Kernel objects (what the guest uploads as "code"; see gpuvm/device/kernels.py)
# --------------------------------------------------------------------------------------
KOBJ_MAGIC = 0x4B565047  # "GPVK" little endian
KOBJ_VERSION = 1
KOBJ_HEADER_BYTES = 32  # u32 magic, u32 version, u32 kernel id, u32 param words, char[16] name
KOBJ_OFF_MAGIC = 0
KOBJ_OFF_VERSION = 4
KOBJ_OFF_KERNEL = 8
KOBJ_OFF_PARAM_WORDS = 12
KOBJ_OFF_NAME = 16

KERNEL_VECADD = 1  # params: a, b, c (u64 VAs), n          c = a + b (f32)
KERNEL_MADD = 2  # params: a, b, c, rows, cols            c = a + b (f32 matrices)
KERNEL_MMUL = 3  # params: a, b, c, n                     c = a @ b (f32, n x n)
KERNEL_FMADD = 4  # params: a, b, c, n                    c = a * b + c (f32)
KERNEL_LOOP = 5  # params: out (u64 VA), iterations       *out = iterations (u32), timed
KERNEL_MEMSET = 6  # params: dst (u64 VA), value, words    dst[i] = value (u32)
KERNEL_MMUL_FLOPS_PER_FMA = 2


def c_header() -> str:
    """The register map as C #defines, for the freestanding guest driver."""
    lines = [
        "/* Generated from gpuvm/device/regs.py -- do not edit. */",
        "#ifndef GPUVM_FERMI_REGS_H",
        "#define GPUVM_FERMI_REGS_H",
    ]
    for name, value in vars(sys.modules[__name__]).items():
        if name.isupper() and isinstance(value, int) and not isinstance(value, bool):
            lines.append(f"#define {name} 0x{value:x}ULL" if value > 0xFFFFFFFF
                         else f"#define {name} 0x{value:x}u")
    lines.append("#endif")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(c_header())
