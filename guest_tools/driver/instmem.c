#include "instmem.h"
#include "lib.h"

void inst_zero(struct gpu *g, uint64_t bar3, uint64_t bytes)
{
    plat_zero(BAR3, bar3, bytes / 8, 8);
    g->stats.pt_zero_words += bytes / 8;
}

int inst_new(struct gpu *g, uint64_t size, int zero, struct instobj *o)
{
    o->size = ALIGN_UP(size, PAGE_SIZE);
    int err = vram_alloc(g, o->size, PAGE_SIZE, &o->vram);
    if (err)
        return err;
    if ((err = vm_va_alloc(&g->bar3, o->size, &o->bar3)))
        goto fail_vram;
    if ((err = vm_map(&g->bar3, o->bar3, o->vram, o->size, TARGET_VRAM, 0)) ||
        (err = vm_flush(&g->bar3)))
        goto fail_va;
    if (zero)
        plat_zero(BAR3, o->bar3, o->size / 8, 8);
    return 0;
fail_va:
    vm_unmap(&g->bar3, o->bar3, o->size);
    vm_va_free(&g->bar3, o->bar3);
fail_vram:
    vram_free(g, o->vram);
    o->size = 0;
    return err;
}

void inst_del(struct gpu *g, struct instobj *o)
{
    if (!o->size)
        return;
    vm_unmap(&g->bar3, o->bar3, o->size);
    vm_flush(&g->bar3);
    vm_va_free(&g->bar3, o->bar3);
    vram_free(g, o->vram);
    o->size = 0;
}
