#include "range.h"
#include "lib.h"

void range_init(struct range_alloc *ra, const char *name, uint64_t base, uint64_t size,
                struct range_block *storage, unsigned cap)
{
    ra->name = name;
    ra->base = base;
    ra->end = base + size;
    ra->count = 0;
    ra->cap = cap;
    ra->blocks = storage;
}

static int insert_at(struct range_alloc *ra, unsigned i, uint64_t start, uint64_t size)
{
    if (ra->count == ra->cap)
        return -E_NOMEM;
    memmove(&ra->blocks[i + 1], &ra->blocks[i], (ra->count - i) * sizeof(ra->blocks[0]));
    ra->blocks[i].start = start;
    ra->blocks[i].size = size;
    ra->count++;
    return 0;
}

int range_alloc(struct range_alloc *ra, uint64_t size, uint64_t align, uint64_t *out)
{
    if (!size || !align || (align & (align - 1)))
        return -E_INVAL;
    uint64_t gap = ra->base;
    for (unsigned i = 0; i <= ra->count; i++) {
        uint64_t gap_end = i < ra->count ? ra->blocks[i].start : ra->end;
        uint64_t start = ALIGN_UP(gap, align);
        if (start >= gap && start <= gap_end && gap_end - start >= size) {
            int err = insert_at(ra, i, start, size);
            if (err)
                return err;
            *out = start;
            return 0;
        }
        if (i < ra->count)
            gap = ra->blocks[i].start + ra->blocks[i].size;
    }
    return -E_NOMEM;
}

int range_reserve(struct range_alloc *ra, uint64_t start, uint64_t size)
{
    if (!size || start < ra->base || start + size > ra->end || start + size < start)
        return -E_INVAL;
    unsigned i = 0;
    while (i < ra->count && ra->blocks[i].start < start)
        i++;
    if (i > 0 && ra->blocks[i - 1].start + ra->blocks[i - 1].size > start)
        return -E_NOMEM;
    if (i < ra->count && start + size > ra->blocks[i].start)
        return -E_NOMEM;
    return insert_at(ra, i, start, size);
}

uint64_t range_free(struct range_alloc *ra, uint64_t start)
{
    for (unsigned i = 0; i < ra->count; i++) {
        if (ra->blocks[i].start == start) {
            uint64_t size = ra->blocks[i].size;
            memmove(&ra->blocks[i], &ra->blocks[i + 1],
                    (ra->count - i - 1) * sizeof(ra->blocks[0]));
            ra->count--;
            return size;
        }
    }
    return 0;
}

uint64_t range_find(const struct range_alloc *ra, uint64_t addr, uint64_t *start)
{
    for (unsigned i = 0; i < ra->count; i++) {
        const struct range_block *b = &ra->blocks[i];
        if (addr >= b->start && addr - b->start < b->size) {
            if (start)
                *start = b->start;
            return b->size;
        }
    }
    return 0;
}

uint64_t range_used(const struct range_alloc *ra)
{
    uint64_t used = 0;
    for (unsigned i = 0; i < ra->count; i++)
        used += ra->blocks[i].size;
    return used;
}
