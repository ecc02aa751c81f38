/* Guest RAM pages: everything the GPU or the VMM reads (pushbuffers, fences, strings,
 * wait and hypercall records, benchmark data) lives here, in guest-physical memory. */
#include "lib.h"
#include "platform.h"
#include "range.h"

#define RAM_MAX_BLOCKS 256

static struct range_block blocks[RAM_MAX_BLOCKS];
static struct range_alloc heap;

void ram_init(const struct gpuvm_boot_params *bp)
{
    range_init(&heap, "ram", bp->heap_start, bp->ram_size - bp->heap_start, blocks,
               RAM_MAX_BLOCKS);
}

void *ram_alloc(uint64_t bytes)
{
    uint64_t pa;
    if (range_alloc(&heap, ALIGN_UP(bytes ? bytes : 1, PAGE_SIZE), PAGE_SIZE, &pa))
        return NULL;
    void *p = plat_phys_to_virt(pa);
    memset(p, 0, ALIGN_UP(bytes ? bytes : 1, PAGE_SIZE));
    return p;
}

void ram_free(void *p)
{
    if (p && !range_free(&heap, plat_virt_to_phys(p)))
        plat_exit(PLAT_ABORTED, "ram_free: not an allocated block");
}

uint64_t ram_used(void)
{
    return range_used(&heap);
}
