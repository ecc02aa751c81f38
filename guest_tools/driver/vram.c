/* VRAM: the first-fit allocator over what the memory controller reports, and the
 * PRAMIN window (BAR0 0x700000, 1 MiB) onto any VRAM address, without translation. */
#include "gpu.h"
#include "lib.h"

int vram_alloc(struct gpu *g, uint64_t size, uint64_t align, uint64_t *addr)
{
    if (align < PAGE_SIZE)
        align = PAGE_SIZE;
    int err = range_alloc(&g->vram, ALIGN_UP(size, PAGE_SIZE), align, addr);
    if (err)
        con_printf("gpu: out of VRAM allocating %lu bytes", (unsigned long)size);
    return err;
}

void vram_free(struct gpu *g, uint64_t addr)
{
    if (!range_free(&g->vram, addr))
        con_printf("gpu: vram_free of unallocated %#lx", (unsigned long)addr);
}

static void pramin_move(struct gpu *g, uint64_t vram)
{
    uint32_t base = (uint32_t)(vram >> PBUS_PRAMIN_BASE_SHIFT);
    if (g->pramin_base != base) {
        gpu_wr32(g, PBUS_PRAMIN_BASE, base);
        g->pramin_base = base;
    }
}

void pramin_wr32(struct gpu *g, uint64_t vram, uint32_t v)
{
    pramin_move(g, vram);
    gpu_wr32(g, PRAMIN_WINDOW + (uint32_t)(vram & 0xffff), v);
}

uint32_t pramin_rd32(struct gpu *g, uint64_t vram)
{
    pramin_move(g, vram);
    return gpu_rd32(g, PRAMIN_WINDOW + (uint32_t)(vram & 0xffff));
}

void pramin_zero64(struct gpu *g, uint64_t vram, uint64_t count)
{
    uint64_t words = count * 2;  /* as pramin_wr64 stores them: two 32-bit halves */
    while (words) {
        pramin_move(g, vram);
        uint64_t in_window = (0x10000 - (vram & 0xffff)) / 4;
        uint64_t n = words < in_window ? words : in_window;
        plat_zero(BAR0, PRAMIN_WINDOW + (vram & 0xffff), n, 4);
        vram += n * 4;
        words -= n;
    }
}

void pramin_wr64(struct gpu *g, uint64_t vram, uint64_t v)
{
    pramin_wr32(g, vram, (uint32_t)v);
    pramin_wr32(g, vram + 4, (uint32_t)(v >> 32));
}
