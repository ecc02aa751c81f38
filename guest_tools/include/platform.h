/*
 * Platform layer: the only code that differs between the KVM image and the in-process
 * shared library.  Everything above it sees BARs as (bar, offset) pairs, ports as
 * numbers, and guest memory as ordinary pointers with a virt<->phys translation.
 *
 * KVM: MMIO is a volatile load/store at bp->bar_base[bar] + offset (an exit), a port is
 *      an in/out instruction, and virtual == guest-physical.
 * Host: MMIO and ports call back into the VMM through the function pointers in the boot
 *      parameters; guest-physical memory is the VMM's buffer at bp->phys_offset.
 */
#ifndef GV_PLATFORM_H
#define GV_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "gpuvm_abi.h"

typedef int (*plat_main_fn)(struct gpuvm_boot_params *bp);

/* Exit status of a guest the VMM told to stop (host build; see platform_host.c). */
#define PLAT_ABORTED 125

/* Runs main(bp) and returns its status.  On the host build this is also where a stop
 * requested by the VMM (a failed callback) lands, returning PLAT_ABORTED. */
int plat_run(plat_main_fn main, struct gpuvm_boot_params *bp);

uint32_t plat_rd32(unsigned bar, uint64_t off);
void plat_wr32(unsigned bar, uint64_t off, uint32_t value);
uint64_t plat_rd64(unsigned bar, uint64_t off);
void plat_wr64(unsigned bar, uint64_t off, uint64_t value);
/* `count` stores of zero, `width` (4 or 8) bytes each, at off, off + width, ...: the
 * very stores of `count` plat_wr32/plat_wr64 calls, in order.  On KVM they are one
 * `rep stos`, which KVM's instruction emulator repeats inside the kernel while each
 * store lands in its coalesced-MMIO ring, so a page of zeroed entries costs a few exits
 * instead of one per store. */
void plat_zero(unsigned bar, uint64_t off, uint64_t count, unsigned width);
void plat_out(uint32_t port, uint32_t value);

/* Guest-physical address of a pointer into guest RAM (and back).  A pointer outside
 * guest RAM is a driver bug: the guest stops with a message. */
uint64_t plat_virt_to_phys(const void *p);
void *plat_phys_to_virt(uint64_t pa);

/* Ends the guest at once with `code` (after logging `why` when not NULL). */
__attribute__((noreturn)) void plat_exit(int code, const char *why);

#endif
