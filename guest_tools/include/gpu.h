/*
 * The driver's view of the GPU: bring-up, VRAM, the BAR1/BAR3 VMs, the PRAMIN window
 * and the runlist.  Follows gpuvm/device/PROGRAMMING.md (nouveau/Gdev-shaped).
 */
#ifndef GV_GPU_H
#define GV_GPU_H

#include <stdint.h>

#include "fermi_regs.h"
#include "gpuvm_abi.h"
#include "platform.h"
#include "range.h"
#include "vm.h"

#define VRAM_MAX_BLOCKS 512
#define MAX_CHANNELS 8          /* channels this driver creates (ids 0..7) */
#define POLL_LIMIT 1000         /* completion polls; the device completes on the first */

/* The parts of the BARs this driver maps.  The BAR VMs' limits cover only these, so
 * only the page-table entries below them exist (and are zeroed) -- the walker rejects
 * anything past a VM's limit before it reads a PDE. */
#define BAR1_WINDOW (1u << 20)  /* USERD poll area (128 pages) + probe pages */
#define BAR1_POLL_VA 0x0        /* channel c's USERD page: BAR1 + c * USERD_STRIDE */
#define BAR1_POLL_SIZE (NUM_CHANNELS * USERD_STRIDE)
#define BAR3_WINDOW_MAX (16u << 20)  /* instance memory window (GPUvm used 16 MiB) */

/* Driver-side event counts, reported with each result record. */
struct drv_stats {
    uint64_t pte_writes;   /* page-table entries written (or sent by hypercall) */
    uint64_t pde_writes;
    uint64_t pt_zero_words; /* stores spent zeroing new page tables/directories */
    uint64_t tlb_flushes;
    uint64_t doorbells;
    uint64_t hypercalls;
    uint64_t hc_entries;
    uint64_t copies;
    uint64_t copy_bytes;
    uint64_t launches;
    uint64_t waits;
};

struct gpu {
    uint64_t vram_size;
    struct range_alloc vram;
    struct range_block vram_blocks[VRAM_MAX_BLOCKS];
    uint32_t pramin_base;      /* cached PBUS_PRAMIN_BASE; ~0 when unknown */
    uint64_t bar1_inst, bar3_inst;
    struct gpu_vm bar1, bar3;  /* BAR VMs: tables written through PRAMIN */
    uint64_t runlist;          /* runlist buffer (instance memory, written through BAR3) */
    uint64_t runlist_bar3;
    uint64_t runlist_size;     /* 0 until the runlist buffer exists */
    uint32_t runnable;         /* bitmask of this driver's channels in the runlist */
    uint32_t fi;               /* fault injection (FI_*) */
    uint32_t pv_batch;         /* PV build: entries per map/unmap hypercall */
    struct gpuvm_hcall *hcall; /* PV build: the shared hypercall area */
    struct drv_stats stats;
};

int gpu_init(struct gpu *g, const struct gpuvm_boot_params *bp);
void gpu_fini(struct gpu *g);

/* BAR0 register access (aligned 32-bit only, as the device requires). */
static inline uint32_t gpu_rd32(struct gpu *g, uint32_t reg)
{
    (void)g;
    return plat_rd32(BAR0, reg);
}

static inline void gpu_wr32(struct gpu *g, uint32_t reg, uint32_t v)
{
    (void)g;
    plat_wr32(BAR0, reg, v);
}

/* Polls `reg` until (value & mask) == want; -E_BUSY after POLL_LIMIT reads. */
int gpu_poll(struct gpu *g, uint32_t reg, uint32_t mask, uint32_t want);
/* Polls `reg` until some bit of `mask` is set. */
int gpu_poll_any(struct gpu *g, uint32_t reg, uint32_t mask);

/* VRAM allocator (first fit, 4 KiB granules). */
int vram_alloc(struct gpu *g, uint64_t size, uint64_t align, uint64_t *addr);
void vram_free(struct gpu *g, uint64_t addr);

/* PRAMIN: 32-bit access to VRAM through the BAR0 window, moving the base as needed. */
void pramin_wr32(struct gpu *g, uint64_t vram, uint32_t v);
uint32_t pramin_rd32(struct gpu *g, uint64_t vram);
void pramin_wr64(struct gpu *g, uint64_t vram, uint64_t v);
/* `count` pramin_wr64(.., 0) at vram, vram + 8, ...: the same stores, each run within
 * one window position a single plat_zero. */
void pramin_zero64(struct gpu *g, uint64_t vram, uint64_t count);

/* Write flush of BAR/PRAMIN stores before the device is told to look (PFLUSH). */
int gpu_bar_flush(struct gpu *g);

/* Runlist: submit every channel whose bit is set in g->runnable. */
int gpu_runlist_update(struct gpu *g);
/* Waits for the runlist update the way nouveau does (PFIFO_INTR_RUNLIST, then PENDING). */
int gpu_runlist_wait(struct gpu *g);

#endif
