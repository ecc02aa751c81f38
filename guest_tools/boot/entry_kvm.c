/* KVM entry: the host has set up long mode at CPL3, rsp, and rdi = boot params. */
#include "gpuvm_abi.h"

int guest_main(struct gpuvm_boot_params *bp);

static inline void out32(uint16_t port, uint32_t value)
{
    __asm__ volatile("outl %0, %1" : : "a"(value), "Nd"(port));
}

__attribute__((section(".text.entry"), noreturn, used))
void _start(struct gpuvm_boot_params *bp)
{
    int rc = guest_main(bp);
    out32(PORT_EXIT, (uint32_t)rc);
    for (;;)
        out32(PORT_EXIT, (uint32_t)rc);
}
