/*
 * Platform layer of the in-process shared library: every BAR access and port write is a
 * call into the VMM (Python, through ctypes callbacks).
 *
 * Stopping: a callback must never unwind a Python exception through C.  When one fails,
 * the VMM records the failure, sets `gpuvm_host_abort` in this (per-guest) copy of the
 * library and returns a dummy value; every callback site checks the flag and, when set,
 * jumps back to plat_run(), which returns PLAT_ABORTED.  The entry stub then reports the
 * exit as usual; the VMM ignores callbacks from an aborted guest.
 *
 * BAR remap: bp->host_bar_pages[bar] may name a table with one u64 per 4 KiB page of
 * the BAR: 0 = trap (call back), else the host address the page is mapped to, which the
 * access then uses directly -- the in-process equivalent of a KVM memslot.  The VMM may
 * change entries while the guest runs; each access reads its page's entry once.
 */
#ifdef GPUVM_GUEST_HOST
#include "lib.h"
#include "platform.h"

__attribute__((visibility("default"))) volatile int gpuvm_host_abort;

static struct gpuvm_boot_params *boot;
static uint64_t phys_offset;
static gpuvm_host_mmio_read_fn mmio_read;
static gpuvm_host_mmio_write_fn mmio_write;
static gpuvm_host_port_out_fn port_out;
static const volatile uint64_t *bar_pages[BOOT_NUM_BARS];
static uint64_t bar_size[BOOT_NUM_BARS];
static void *landing[5];  /* __builtin_setjmp buffer */
static int exit_code;

int plat_run(plat_main_fn main, struct gpuvm_boot_params *bp)
{
    boot = bp;
    phys_offset = bp->phys_offset;
    mmio_read = (gpuvm_host_mmio_read_fn)(uintptr_t)bp->host_mmio_read;
    mmio_write = (gpuvm_host_mmio_write_fn)(uintptr_t)bp->host_mmio_write;
    port_out = (gpuvm_host_port_out_fn)(uintptr_t)bp->host_port_out;
    for (unsigned bar = 0; bar < BOOT_NUM_BARS; bar++) {
        bar_pages[bar] = (const volatile uint64_t *)(uintptr_t)bp->host_bar_pages[bar];
        bar_size[bar] = bp->bar_size[bar];
    }
    exit_code = PLAT_ABORTED;
    if (__builtin_setjmp(landing))
        return exit_code;
    return main(bp);
}

__attribute__((noinline, noreturn)) static void land(int code)
{
    exit_code = code;
    __builtin_longjmp(landing, 1);
}

static inline void check_abort(void)
{
    if (gpuvm_host_abort)
        land(PLAT_ABORTED);
}

/* The host address a remapped BAR page gives `off`, or NULL when the access traps. */
static inline volatile void *remapped(unsigned bar, uint64_t off)
{
    if (bar >= BOOT_NUM_BARS || !bar_pages[bar] || off >= bar_size[bar])
        return NULL;
    uint64_t host = bar_pages[bar][off >> 12];
    return host ? (volatile void *)(uintptr_t)(host + (off & 0xfff)) : NULL;
}

uint32_t plat_rd32(unsigned bar, uint64_t off)
{
    volatile void *p = remapped(bar, off);
    if (p)
        return *(volatile uint32_t *)p;
    uint32_t v = (uint32_t)mmio_read(bar, off, 4);
    check_abort();
    return v;
}

void plat_wr32(unsigned bar, uint64_t off, uint32_t value)
{
    volatile void *p = remapped(bar, off);
    if (p) {
        *(volatile uint32_t *)p = value;
        return;
    }
    mmio_write(bar, off, 4, value);
    check_abort();
}

uint64_t plat_rd64(unsigned bar, uint64_t off)
{
    volatile void *p = remapped(bar, off);
    if (p)
        return *(volatile uint64_t *)p;
    uint64_t v = mmio_read(bar, off, 8);
    check_abort();
    return v;
}

void plat_wr64(unsigned bar, uint64_t off, uint64_t value)
{
    volatile void *p = remapped(bar, off);
    if (p) {
        *(volatile uint64_t *)p = value;
        return;
    }
    mmio_write(bar, off, 8, value);
    check_abort();
}

void plat_zero(unsigned bar, uint64_t off, uint64_t count, unsigned width)
{
    for (uint64_t i = 0; i < count; i++) {
        if (width == 8)
            plat_wr64(bar, off + i * 8, 0);
        else
            plat_wr32(bar, off + i * 4, 0);
    }
}

void plat_out(uint32_t port, uint32_t value)
{
    port_out(port, value);
    check_abort();
}

uint64_t plat_virt_to_phys(const void *p)
{
    uint64_t pa = (uint64_t)(uintptr_t)p - phys_offset;
    if ((uint64_t)(uintptr_t)p < phys_offset || pa >= boot->ram_size)
        plat_exit(PLAT_ABORTED, "virt_to_phys: pointer outside guest RAM");
    return pa;
}

void *plat_phys_to_virt(uint64_t pa)
{
    return (void *)(uintptr_t)(pa + phys_offset);
}

void plat_exit(int code, const char *why)
{
    if (why)
        con_puts(why);
    land(code);
}
#endif
