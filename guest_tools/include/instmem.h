/* Instance memory: VRAM objects the driver writes with the CPU (RAMIN, page directories
 * and tables of channel spaces, the runlist), mapped into the BAR3 VM like nouveau's
 * instmem so they are written with plain (64-bit) stores instead of through PRAMIN. */
#ifndef GV_INSTMEM_H
#define GV_INSTMEM_H

#include <stdint.h>

#include "gpu.h"

struct instobj {
    uint64_t vram;   /* VRAM address */
    uint64_t bar3;   /* offset in BAR3 */
    uint64_t size;
};

int inst_new(struct gpu *g, uint64_t size, int zero, struct instobj *o);
void inst_del(struct gpu *g, struct instobj *o);
/* Zeroes [off, off+bytes) with 64-bit stores through BAR3. */
void inst_zero(struct gpu *g, uint64_t bar3, uint64_t bytes);

static inline void inst_wr32(const struct instobj *o, uint64_t off, uint32_t v)
{
    plat_wr32(BAR3, o->bar3 + off, v);
}

static inline uint32_t inst_rd32(const struct instobj *o, uint64_t off)
{
    return plat_rd32(BAR3, o->bar3 + off);
}

#endif
