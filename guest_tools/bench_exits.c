/* `gpuvm bench exits`: the cost of one trapped BAR store, three ways, in one run.
 *
 * params[0] = stores per trapped loop, params[1] = BAR1 offset of a page the host maps
 * with a memslot, params[2] = stores to that page.  Each loop is bracketed by phase
 * marks so the host's per-phase wall time and exit counts delimit it:
 *   HtoD   (a) raw:      BAR0 stores; the host re-enters without handling them
 *   Launch (b) dispatch: the same stores through the normal exit path to the device
 *   DtoH   (c) remap:    stores to the memslot-backed BAR1 page (no exits)
 *   Close  (d) posted:   params[0] stores into BAR0's PRAMIN window, which the host
 *                        registers with KVM's coalesced-MMIO ring: each is queued by
 *                        KVM without an exit to userspace, and handed to the device
 *                        at the next exit (the path of fv's page-table stores)
 */
#include "gpuvm_abi.h"
#include "fermi_regs.h"

static inline void out32(uint16_t port, uint32_t value)
{
    __asm__ volatile("outl %0, %1" : : "a"(value), "Nd"(port));
}

static void stores(volatile uint32_t *p, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        *p = (uint32_t)(i & PMC_INTR_EN_HW);
}

int guest_main(struct gpuvm_boot_params *bp)
{
    volatile uint32_t *reg = (volatile uint32_t *)(uintptr_t)(bp->bar_base[0] + PMC_INTR_EN);
    volatile uint32_t *page = (volatile uint32_t *)(uintptr_t)(bp->bar_base[1] + bp->params[1]);
    volatile uint32_t *window = (volatile uint32_t *)(uintptr_t)(bp->bar_base[0] + PRAMIN_WINDOW);
    uint64_t n = bp->params[0], m = bp->params[2];

    out32(PORT_PHASE, PHASE_HTOD);
    stores(reg, n);
    out32(PORT_PHASE, PHASE_LAUNCH);
    stores(reg, n);
    out32(PORT_PHASE, PHASE_DTOH);
    for (uint64_t i = 0; i < m; i++)
        *page = (uint32_t)i;
    out32(PORT_PHASE, PHASE_CLOSE);
    for (uint64_t i = 0; i < n; i++)
        window[i & 1023] = (uint32_t)i;  /* the first 4 KiB of VRAM */
    return 0;
}
