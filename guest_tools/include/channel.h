/*
 * Channels: RAMIN, USERD (VRAM, reached through the BAR1 poll area), GPFIFO ring and
 * pushbuffer in pinned guest RAM (writing commands costs no exits), fences by semaphore
 * release into pinned guest RAM, waits through PORT_WAIT (never by polling MMIO).
 */
#ifndef GV_CHANNEL_H
#define GV_CHANNEL_H

#include <stdint.h>

#include "gpu.h"
#include "instmem.h"
#include "vm.h"

#define CH_RING_LOG2 9               /* 512 GPFIFO entries (4 KiB) */
#define CH_RING_ENTRIES (1u << CH_RING_LOG2)
#define CH_PB_BYTES (64u * 1024)     /* pushbuffer */
#define CH_VM_LIMIT (VA_LIMIT - 1)   /* 1 TiB, as nouveau */

/* Subchannels this driver binds. */
#define SUBC_COMPUTE 0
#define SUBC_COPY 1

/* Pinned guest RAM mapped into a GPU address space with sysram PTEs. */
struct hostmem {
    void *virt;
    uint64_t phys;  /* guest-physical */
    uint64_t size;
    uint64_t va;    /* GPU VA in the space it was mapped into */
};

int hostmem_alloc(struct gpu_vm *vm, uint64_t size, struct hostmem *m);
void hostmem_free(struct gpu_vm *vm, struct hostmem *m);

struct channel {
    struct gpu *gpu;
    unsigned id;
    int created;              /* in the channel table */
    struct gpu_vm vm;
    struct instobj ramin;
    uint64_t userd;           /* VRAM address of the USERD page */
    uint64_t userd_bar1;      /* its BAR1 offset: poll area + id * USERD_STRIDE */
    int userd_owned;          /* userd was allocated by us (not a probe's address) */
    int userd_mapped;         /* the BAR1 poll page maps it */
    struct hostmem ring, pb, fence;
    uint32_t gp_put;          /* next GPFIFO slot */
    uint32_t gp_inflight;     /* entries submitted since the channel was last idle */
    uint32_t pb_pos, pb_start; /* bytes: end of written words, start of unsubmitted ones */
    uint32_t seq;             /* last fence sequence emitted */
    int faulted;
    uint32_t error;           /* PFIFO_CHAN_ERROR_EXT after a fault */
};

/* userd_override: 0 for a normal channel; otherwise the VRAM address RAMIN_USERD and
 * the BAR1 poll page name (the RAMIN probe). */
int channel_create(struct channel *ch, struct gpu *g, unsigned id, uint64_t userd_override);
void channel_destroy(struct channel *ch);
int channel_bind(struct channel *ch, unsigned subc, uint32_t cls, uint32_t engine);
/* Emits a semaphore release after all work so far and submits it; *seq is its value. */
int channel_fence(struct channel *ch, uint32_t *seq);
int channel_wait(struct channel *ch, uint32_t seq);
int channel_wait_timeout(struct channel *ch, uint32_t seq, uint64_t timeout_ns);
int channel_sync(struct channel *ch);
/* One line describing why the channel stopped (after -E_FAULT). */
void channel_fault_text(struct channel *ch, char *buf, unsigned size);

#endif
