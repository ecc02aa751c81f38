/* First-fit range allocator: VRAM, guest RAM pages and every GPU VA space use it.
 * Allocated blocks are kept sorted in a caller-provided array, so freeing merges the
 * gaps for free and there is no separate free list to keep consistent. */
#ifndef GV_RANGE_H
#define GV_RANGE_H

#include <stdint.h>

struct range_block {
    uint64_t start, size;
};

struct range_alloc {
    const char *name;
    uint64_t base, end;          /* managed range [base, end) */
    unsigned count, cap;
    struct range_block *blocks;  /* sorted by start */
};

void range_init(struct range_alloc *ra, const char *name, uint64_t base, uint64_t size,
                struct range_block *storage, unsigned cap);
/* First gap of `size` bytes at an `align` boundary; returns 0 or -E_NOMEM. */
int range_alloc(struct range_alloc *ra, uint64_t size, uint64_t align, uint64_t *out);
/* Claims [start, start+size) exactly; -E_NOMEM when it overlaps a block. */
int range_reserve(struct range_alloc *ra, uint64_t start, uint64_t size);
/* Frees the block starting at `start`; returns its size, or 0 when there is none. */
uint64_t range_free(struct range_alloc *ra, uint64_t start);
/* Size of the block holding `addr` and its start, or 0 when unallocated. */
uint64_t range_find(const struct range_alloc *ra, uint64_t addr, uint64_t *start);
uint64_t range_used(const struct range_alloc *ra);

#endif
