/* Platform layer of the flat KVM image: real loads, stores and port instructions. */
#ifdef GPUVM_GUEST_KVM
#include "lib.h"
#include "platform.h"

static struct gpuvm_boot_params *boot;

int plat_run(plat_main_fn main, struct gpuvm_boot_params *bp)
{
    boot = bp;
    return main(bp);
}

static inline volatile void *bar_ptr(unsigned bar, uint64_t off)
{
    return (volatile void *)(uintptr_t)(boot->bar_base[bar] + off);
}

/* Each access is counted once it has completed (bar_reads / bar_writes): an access
 * that exits is counted by the VMM as it handles it, one to a page the VMM mapped as
 * memory only here, and the VMM counts it from the difference at its next exit. */
uint32_t plat_rd32(unsigned bar, uint64_t off)
{
    uint32_t v = *(volatile uint32_t *)bar_ptr(bar, off);
    ((volatile uint64_t *)boot->bar_reads)[bar]++;
    return v;
}

void plat_wr32(unsigned bar, uint64_t off, uint32_t value)
{
    *(volatile uint32_t *)bar_ptr(bar, off) = value;
    ((volatile uint64_t *)boot->bar_writes)[bar]++;
}

uint64_t plat_rd64(unsigned bar, uint64_t off)
{
    uint64_t v = *(volatile uint64_t *)bar_ptr(bar, off);
    ((volatile uint64_t *)boot->bar_reads)[bar]++;
    return v;
}

void plat_wr64(unsigned bar, uint64_t off, uint64_t value)
{
    *(volatile uint64_t *)bar_ptr(bar, off) = value;
    ((volatile uint64_t *)boot->bar_writes)[bar]++;
}

void plat_zero(unsigned bar, uint64_t off, uint64_t count, unsigned width)
{
    void *dst = (void *)bar_ptr(bar, off);
    uint64_t n = count;
    if (width == 8)
        __asm__ volatile("rep stosq" : "+D"(dst), "+c"(n) : "a"(0ULL) : "memory");
    else
        __asm__ volatile("rep stosl" : "+D"(dst), "+c"(n) : "a"(0U) : "memory");
    ((volatile uint64_t *)boot->bar_writes)[bar] += count;
}

void plat_out(uint32_t port, uint32_t value)
{
    __asm__ volatile("outl %0, %w1" : : "a"(value), "Nd"((uint16_t)port) : "memory");
}

uint64_t plat_virt_to_phys(const void *p)
{
    uint64_t pa = (uint64_t)(uintptr_t)p;
    if (pa >= boot->ram_size)
        plat_exit(PLAT_ABORTED, "virt_to_phys: pointer outside guest RAM");
    return pa;
}

void *plat_phys_to_virt(uint64_t pa)
{
    return (void *)(uintptr_t)pa;
}

void plat_exit(int code, const char *why)
{
    if (why)
        con_puts(why);
    for (;;)
        plat_out(PORT_EXIT, (uint32_t)code);
}
#endif
