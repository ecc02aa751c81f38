/*
 * A CUDA-driver-shaped runtime over one context: one channel with the COMPUTE class on
 * subchannel 0 and the COPY class on subchannel 1, device memory in VRAM mapped into the
 * channel's address space, pinned host memory, and pageable copies staged through a
 * pinned bounce buffer in 4 MiB chunks like the vendor driver.
 */
#ifndef GV_RUNTIME_H
#define GV_RUNTIME_H

#include <stdint.h>

#include "channel.h"
#include "gpu.h"

#define RT_BOUNCE_BYTES (4u << 20)
#define RT_CB_BYTES 0x1000        /* constant buffer for kernel parameters */
#define RT_MAX_DEV 64
#define RT_MAX_PINNED 16
#define RT_MAX_TRACKED 64
/* rt_host_alloc's pin policies: never, always, only the allocations in the hot mask */
#define RT_PIN_NONE 0
#define RT_PIN_ALL 1
#define RT_PIN_HOT 2
/* Where FI_UNMAPPED_COPY points the source of a copy: below CHANNEL_VA_BASE, never mapped. */
#define RT_UNMAPPED_VA 0x1000

struct rt_module {
    uint64_t code;         /* device address of the kernel object */
    uint32_t kernel;
    uint32_t param_words;
};

struct rt_dim {
    uint32_t x, y, z;
};

int rt_init(const struct gpuvm_boot_params *bp);   /* cuInit + cuCtxCreate */
int rt_close(void);                                 /* cuCtxDestroy: frees everything */
int rt_mem_alloc(uint64_t *dptr, uint64_t bytes);   /* cuMemAlloc (VRAM) */
int rt_mem_free(uint64_t dptr);
int rt_mem_alloc_host(void **p, uint64_t bytes);    /* cuMemAllocHost (pinned) */
int rt_mem_free_host(void *p);
/* Host allocations by id for smart pinning (issue 16): pinned or pageable by the policy;
 * bit i of hot_mask names allocation id i + 1 (ids count rt_host_alloc and
 * rt_mem_alloc_host calls from 1). */
void rt_pin_policy(unsigned policy, uint64_t hot_mask);
int rt_host_alloc(void **p, uint64_t bytes);
int rt_host_free(void *p);
/* Synchronous copies; the host side may be pinned (direct) or pageable (staged). */
int rt_memcpy_htod(uint64_t dst, const void *src, uint64_t bytes);
int rt_memcpy_dtoh(void *dst, uint64_t src, uint64_t bytes);
int rt_module_load(struct rt_module *m, uint32_t kernel, uint32_t param_words,
                   const char *name);
int rt_module_unload(struct rt_module *m);
/* Queues a launch (params are the constant-buffer words); rt_synchronize waits. */
int rt_launch(const struct rt_module *m, struct rt_dim grid, struct rt_dim block,
              const uint32_t *params, uint32_t nwords);
int rt_synchronize(void);

/* GPU VA of pinned host memory from rt_mem_alloc_host (0 when p is not pinned). */
uint64_t rt_host_va(const void *p, uint64_t bytes);
/* Raw copy between two GPU VAs of the context, waited for (the probe uses it). */
int rt_copy_va(uint64_t dst, uint64_t src, uint64_t bytes);

struct gpu *rt_gpu(void);
struct channel *rt_channel(void);
/* Why the context's channel stopped ("" when it did not). */
const char *rt_fault_text(void);
/* VRAM and guest RAM still held after rt_close (0 and 0 for a clean teardown). */
uint64_t rt_vram_leak(void);
uint64_t rt_ram_leak(void);

#endif
