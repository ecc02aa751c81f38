/*
 * GPU virtual address spaces (channel VMs and the BAR1/BAR3 VMs): a page directory in
 * VRAM, small page tables (4 KiB pages) created on demand, a VA allocator, and
 * map/unmap/flush on top of the page-table write path in pt.h.
 */
#ifndef GV_VM_H
#define GV_VM_H

#include <stdint.h>

#include "fermi_regs.h"
#include "range.h"

struct gpu;

enum vm_kind {
    VM_BAR1,     /* BAR1 aperture; tables written through PRAMIN */
    VM_BAR3,     /* BAR3 (instance memory) aperture; tables written through PRAMIN */
    VM_CHANNEL,  /* a channel's address space; tables written through BAR3 */
};

#define VM_MAX_PTS 32        /* page tables per space: 32 x 128 MiB of VA */
#define VM_VA_BLOCKS 128

struct vm_pt {
    uint32_t pde;            /* index in the page directory */
    uint64_t vram;           /* the small page table (SMALL_PTES_PER_PT entries) */
    uint64_t bar3;           /* its BAR3 address (channel spaces) */
};

struct gpu_vm {
    struct gpu *gpu;
    enum vm_kind kind;
    const char *name;
    uint64_t pd;             /* page directory in VRAM (the PV build's space key) */
    uint64_t pd_bar3;        /* its BAR3 address (channel spaces, direct build) */
    uint64_t limit;          /* last valid byte */
    unsigned npts;
    struct vm_pt pts[VM_MAX_PTS];
    int dirty;               /* entries changed since the last flush */
    uint32_t refused;        /* entries the hypervisor refused (PV build) */
    struct range_alloc va;
    struct range_block va_blocks[VM_VA_BLOCKS];
};

/* PTE flags for vm_map. */
#define VM_READ_ONLY PTE_READ_ONLY

int vm_init(struct gpu_vm *vm, struct gpu *g, enum vm_kind kind, const char *name,
            uint64_t va_base, uint64_t limit);
void vm_fini(struct gpu_vm *vm);
int vm_va_alloc(struct gpu_vm *vm, uint64_t size, uint64_t *va);
void vm_va_free(struct gpu_vm *vm, uint64_t va);
/* Maps [va, va+size) to physical pages at `phys` in memory `target` (TARGET_*). */
int vm_map(struct gpu_vm *vm, uint64_t va, uint64_t phys, uint64_t size, unsigned target,
           uint64_t flags);
int vm_unmap(struct gpu_vm *vm, uint64_t va, uint64_t size);
/* Makes the device see the changes (TLB flush or its hypercall). */
int vm_flush(struct gpu_vm *vm);

static inline uint64_t vm_pte(uint64_t phys, unsigned target, uint64_t flags)
{
    return PTE_PRESENT | flags | (phys >> 8) | ((uint64_t)target << PTE_TARGET_SHIFT);
}

#endif
