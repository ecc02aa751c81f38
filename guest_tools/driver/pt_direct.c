/*
 * Page-table write path of the default build: the driver owns its page tables.
 * BAR VMs' tables are written through PRAMIN (BAR3 cannot map its own tables before it
 * exists); channel spaces' tables are instance memory written with 64-bit BAR3 stores.
 * After changes, the TLB flush sequence of PROGRAMMING.md names the space's PD.
 */
#ifndef GPUVM_PV
#include "gpu.h"
#include "instmem.h"
#include "lib.h"
#include "pt.h"

#define PT_BYTES (SMALL_PTES_PER_PT * PTE_SIZE)

int pt_setup(struct gpu *g)
{
    (void)g;
    return 0;
}

void pt_teardown(struct gpu *g)
{
    (void)g;
}

static int is_bar_vm(const struct gpu_vm *vm)
{
    return vm->kind != VM_CHANNEL;
}

/* Entries of a table (PDEs or one PT's PTEs) that lie below the space's limit: the rest
 * are never read by the walker, so they are not initialised. */
static uint64_t entries_below_limit(const struct gpu_vm *vm, uint64_t first_va, uint64_t span,
                                    uint64_t count)
{
    if (first_va > vm->limit)
        return 0;
    uint64_t n = (vm->limit - first_va) / span + 1;
    return n < count ? n : count;
}

static void write_entry(struct gpu_vm *vm, uint64_t vram, uint64_t bar3, uint64_t value)
{
    if (is_bar_vm(vm))
        pramin_wr64(vm->gpu, vram, value);
    else
        plat_wr64(BAR3, bar3, value);
}

static void zero_entries(struct gpu_vm *vm, uint64_t vram, uint64_t bar3, uint64_t count)
{
    struct gpu *g = vm->gpu;
    if (is_bar_vm(vm)) {
        pramin_zero64(g, vram, count);
        g->stats.pt_zero_words += count;
    } else {
        inst_zero(g, bar3, count * 8);
    }
}

/* Maps a page-table object of a channel space into BAR3. */
static int bar3_map(struct gpu *g, uint64_t vram, uint64_t size, uint64_t *bar3)
{
    int err = vm_va_alloc(&g->bar3, size, bar3);
    if (err)
        return err;
    if ((err = vm_map(&g->bar3, *bar3, vram, size, TARGET_VRAM, 0)) ||
        (err = vm_flush(&g->bar3))) {
        vm_unmap(&g->bar3, *bar3, size);
        vm_va_free(&g->bar3, *bar3);
    }
    return err;
}

static void bar3_unmap(struct gpu *g, uint64_t bar3, uint64_t size)
{
    vm_unmap(&g->bar3, bar3, size);
    vm_va_free(&g->bar3, bar3);
}

int pt_space_init(struct gpu_vm *vm)
{
    struct gpu *g = vm->gpu;
    uint64_t n = entries_below_limit(vm, 0, PDE_SPAN, PDE_COUNT);
    if (!is_bar_vm(vm)) {
        int err = bar3_map(g, vm->pd, PD_BYTES, &vm->pd_bar3);
        if (err)
            return err;
    }
    zero_entries(vm, vm->pd, vm->pd_bar3, n);
    return 0;
}

static struct vm_pt *find_pt(struct gpu_vm *vm, uint32_t pde)
{
    for (unsigned i = 0; i < vm->npts; i++)
        if (vm->pts[i].pde == pde)
            return &vm->pts[i];
    return NULL;
}

static int new_pt(struct gpu_vm *vm, uint32_t pde, struct vm_pt **out)
{
    struct gpu *g = vm->gpu;
    if (vm->npts == VM_MAX_PTS) {
        con_printf("vm %s: more than %d page tables", vm->name, VM_MAX_PTS);
        return -E_NOMEM;
    }
    struct vm_pt *pt = &vm->pts[vm->npts];
    pt->pde = pde;
    pt->bar3 = 0;
    int err = vram_alloc(g, PT_BYTES, PAGE_SIZE, &pt->vram);
    if (err)
        return err;
    if (!is_bar_vm(vm) && (err = bar3_map(g, pt->vram, PT_BYTES, &pt->bar3))) {
        vram_free(g, pt->vram);
        return err;
    }
    zero_entries(vm, pt->vram, pt->bar3,
                 entries_below_limit(vm, (uint64_t)pde << PDE_SPAN_SHIFT, SMALL_PAGE,
                                     SMALL_PTES_PER_PT));
    uint64_t value = PDE_SMALL_PRESENT | (pt->vram >> 12) << PDE_SMALL_ADDR_SHIFT;
    write_entry(vm, vm->pd + pde * PDE_SIZE, vm->pd_bar3 + pde * PDE_SIZE, value);
    g->stats.pde_writes++;
    vm->npts++;
    *out = pt;
    return 0;
}

int pt_set(struct gpu_vm *vm, uint64_t va, uint64_t pte)
{
    if (va > vm->limit)
        return -E_INVAL;
    uint32_t pde = (uint32_t)(va >> PDE_SPAN_SHIFT);
    struct vm_pt *pt = find_pt(vm, pde);
    if (!pt) {
        if (!pte)
            return 0;  /* nothing was ever mapped there */
        int err = new_pt(vm, pde, &pt);
        if (err)
            return err;
    }
    uint64_t off = ((va >> SMALL_PAGE_SHIFT) & (SMALL_PTES_PER_PT - 1)) * PTE_SIZE;
    write_entry(vm, pt->vram + off, pt->bar3 + off, pte);
    vm->gpu->stats.pte_writes++;
    vm->dirty = 1;
    return 0;
}

int pt_commit(struct gpu_vm *vm)
{
    struct gpu *g = vm->gpu;
    int err = gpu_bar_flush(g);
    if (!err)
        err = gpu_poll_any(g, PFFB_VM_CFG, PFFB_VM_CFG_SLOTS_MASK << PFFB_VM_CFG_SLOTS_SHIFT);
    if (err)
        return err;
    gpu_wr32(g, PFFB_FLUSH_PD, (uint32_t)(vm->pd >> PFFB_FLUSH_PD_ADDR_SHIFT));
    gpu_wr32(g, PFFB_FLUSH_TRIGGER, is_bar_vm(vm) ? PFFB_TRIGGER_BAR_VM
                                                  : PFFB_TRIGGER_GO | PFFB_TRIGGER_ALL_PAGES);
    if ((err = gpu_poll(g, PFFB_VM_CFG, PFFB_VM_CFG_FLUSH_DONE, PFFB_VM_CFG_FLUSH_DONE)))
        return err;
    g->stats.tlb_flushes++;
    vm->dirty = 0;
    return 0;
}

void pt_space_fini(struct gpu_vm *vm)
{
    struct gpu *g = vm->gpu;
    for (unsigned i = 0; i < vm->npts; i++) {
        if (!is_bar_vm(vm))
            bar3_unmap(g, vm->pts[i].bar3, PT_BYTES);
        vram_free(g, vm->pts[i].vram);
    }
    vm->npts = 0;
    if (!is_bar_vm(vm)) {
        bar3_unmap(g, vm->pd_bar3, PD_BYTES);
        vm_flush(&g->bar3);
    }
}
#endif
