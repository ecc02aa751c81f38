/* Test guest for the KVM backend; bp->params[0] selects what it does (MODE_* below). */
#include "gpuvm_abi.h"
#include "fermi_regs.h"

enum { MODE_BARS = 0, MODE_UD2 = 1, MODE_BAD_PORT = 2, MODE_MEMSLOT = 3, MODE_SPIN = 4,
       MODE_PORT_IN = 5, MODE_READONLY = 6, MODE_COALESCE = 7, MODE_COALESCE_SPIN = 8 };

static inline void out32(uint16_t port, uint32_t value)
{
    __asm__ volatile("outl %0, %1" : : "a"(value), "Nd"(port));
}

static inline uint32_t in32(uint16_t port)
{
    uint32_t value;
    __asm__ volatile("inl %1, %0" : "=a"(value) : "Nd"(port));
    return value;
}

static inline uint8_t in8(uint16_t port)
{
    uint8_t value;
    __asm__ volatile("inb %1, %0" : "=a"(value) : "Nd"(port));
    return value;
}

static void say(const char *s) { out32(PORT_CONSOLE, (uint32_t)(uintptr_t)s); }
static void result(const char *s) { out32(PORT_RESULT, (uint32_t)(uintptr_t)s); }

#define REG32(base, off) (*(volatile uint32_t *)((base) + (off)))
#define REG16(base, off) (*(volatile uint16_t *)((base) + (off)))
#define REG8(base, off) (*(volatile uint8_t *)((base) + (off)))
#define REG64(base, off) (*(volatile uint64_t *)((base) + (off)))

/* Reads come back from the host handler; each is echoed (+1) to a write the test
 * checks, so a lost or truncated read value shows up as a wrong write. */
static int bars(struct gpuvm_boot_params *bp)
{
    uintptr_t bar0 = bp->bar_base[0], bar1 = bp->bar_base[1];
    say("hello from a CPL3 vCPU");
    REG32(bar0, PMC_INTR_EN) = 0xdead0001u;
    uint32_t v = REG32(bar0, 0x100);
    REG32(bar0, 0x104) = v + 1;
    uint8_t b = REG8(bar1, 0x10);
    uint16_t h = REG16(bar1, 0x20);
    uint64_t q = REG64(bar1, 0x40);
    REG8(bar1, 0x1010) = (uint8_t)(b + 1);
    REG16(bar1, 0x1020) = (uint16_t)(h + 1);
    REG64(bar1, 0x1040) = q + 1;
    /* SSE (needs CR4.OSFXSR): double arithmetic compiles to SSE2 at -O2 */
    volatile double d = (double)bp->params[1];
    d = d * 1.5;
    REG32(bar0, 0x108) = (uint32_t)d;
    result("check=PASS mode=bars");
    return 0;
}

static int memslot(struct gpuvm_boot_params *bp)
{
    volatile uint32_t *p = (volatile uint32_t *)(uintptr_t)(bp->bar_base[1] + bp->params[1]);
    *p = 0x11111111u;      /* mapped by the host before start: lands without an exit */
    out32(PORT_PHASE, 1);  /* the host unmaps the page here */
    *p = 0x22222222u;      /* exits as an MMIO write */
    out32(PORT_PHASE, 2);  /* the host maps it again later, from another thread */
    while (*p != 0xc0ffeeu) /* reads exit (value 0) until the page is mapped */
        ;
    *p = 0x33333333u;      /* mapped again: no exit */
    out32(PORT_PHASE, 3);
    result("check=PASS mode=memslot");
    return 0;
}

/* `in` values come from the host; echoed to BAR0 so the test sees them arrive. */
static int port_in(struct gpuvm_boot_params *bp)
{
    uintptr_t bar0 = bp->bar_base[0];
    REG32(bar0, 0x10c) = in32((uint16_t)bp->params[1]);
    REG32(bar0, 0x110) = in8((uint16_t)bp->params[1]);
    return 0;
}

/* A read-only memslot: reads hit host memory, writes exit. */
static int readonly(struct gpuvm_boot_params *bp)
{
    volatile uint32_t *p = (volatile uint32_t *)(uintptr_t)(bp->bar_base[1] + bp->params[1]);
    uint32_t v = *p;
    *p = v + 1;
    REG32(bp->bar_base[0], 0x114) = v;
    return 0;
}

/* params[1] stores through BAR3 and one into PRAMIN (coalesced: queued in the ring),
 * then a BAR0 read (exits: the queued stores must reach the device first), echoed. */
static void coalesce(struct gpuvm_boot_params *bp)
{
    uintptr_t bar0 = bp->bar_base[0], bar3 = bp->bar_base[3];
    for (uint64_t i = 0; i < bp->params[1]; i++)
        REG64(bar3, i * 8) = i + 1;
    REG32(bar0, PRAMIN_WINDOW + 0x40) = 0xabcd;
    REG32(bar0, 0x104) = REG32(bar0, 0x100) + 1;
}

int guest_main(struct gpuvm_boot_params *bp)
{
    if (bp->magic != BOOT_MAGIC)
        return 99;
    switch (bp->params[0]) {
    case MODE_BARS:
        return bars(bp);
    case MODE_UD2:
        say("about to execute ud2");
        __asm__ volatile("ud2");
        return 1;
    case MODE_BAD_PORT:
        out32(0x600, 1);
        return 1;
    case MODE_MEMSLOT:
        return memslot(bp);
    case MODE_PORT_IN:
        return port_in(bp);
    case MODE_READONLY:
        return readonly(bp);
    case MODE_COALESCE:
        coalesce(bp);
        return 0;
    case MODE_COALESCE_SPIN:  /* params[1] (at least 1) queued stores, then no exit */
        for (uint64_t i = 0; i < (bp->params[1] ? bp->params[1] : 1); i++)
            REG64(bp->bar_base[3], 0x80 + i * 8) = 0x5151 + i;
        for (;;)
            __asm__ volatile("pause");
    case MODE_SPIN:
        for (;;)
            __asm__ volatile("pause");
    }
    return 98;
}
