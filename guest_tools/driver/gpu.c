/* Bring-up and teardown, the BAR1/BAR3 VMs and the runlist. */
#include "gpu.h"
#include "instmem.h"
#include "lib.h"
#include "params.h"
#include "pt.h"

#define PMC_ENABLE_ALL (PMC_ENABLE_PFIFO | PMC_ENABLE_PGRAPH | PMC_ENABLE_PCOPY0 | \
                        PMC_ENABLE_PCOPY1 | PMC_ENABLE_PTIMER)

int gpu_poll(struct gpu *g, uint32_t reg, uint32_t mask, uint32_t want)
{
    for (int i = 0; i < POLL_LIMIT; i++)
        if ((gpu_rd32(g, reg) & mask) == want)
            return 0;
    con_printf("gpu: register %#x did not reach %#x under mask %#x", reg, want, mask);
    return -E_BUSY;
}

int gpu_poll_any(struct gpu *g, uint32_t reg, uint32_t mask)
{
    for (int i = 0; i < POLL_LIMIT; i++)
        if (gpu_rd32(g, reg) & mask)
            return 0;
    con_printf("gpu: register %#x stayed clear under mask %#x", reg, mask);
    return -E_BUSY;
}

int gpu_bar_flush(struct gpu *g)
{
    gpu_wr32(g, PFLUSH_FLUSH, PFLUSH_TRIGGER);
    return gpu_poll(g, PFLUSH_FLUSH, PFLUSH_BUSY, 0);
}

static uint64_t vram_size(struct gpu *g)
{
    uint32_t parts = gpu_rd32(g, PFB_PART_COUNT);
    uint64_t mib = 0;
    if (parts > PFB_MAX_PARTS)
        parts = PFB_MAX_PARTS;
    for (uint32_t p = 0; p < parts; p++)
        mib += gpu_rd32(g, PFBPA_PART_SIZE_MIB + p * PFBPA_PART_STRIDE);
    return mib << 20;
}

/* A BAR VM: an instance block whose PD and limit describe `vm`, then PBUS_BARn_VM. */
static int bar_vm_init(struct gpu *g, struct gpu_vm *vm, enum vm_kind kind, uint64_t window,
                       uint64_t *inst, uint32_t pbus_reg)
{
    int err = vram_alloc(g, RAMIN_SIZE, PAGE_SIZE, inst);
    if (err)
        return err;
    err = vm_init(vm, g, kind, kind == VM_BAR1 ? "bar1" : "bar3", 0, window - 1);
    if (err)
        return err;
    pramin_wr32(g, *inst + RAMIN_PD_LO, (uint32_t)vm->pd | TARGET_VRAM);
    pramin_wr32(g, *inst + RAMIN_PD_HI, (uint32_t)(vm->pd >> 32));
    pramin_wr32(g, *inst + RAMIN_LIMIT_LO, (uint32_t)vm->limit);
    pramin_wr32(g, *inst + RAMIN_LIMIT_HI, (uint32_t)(vm->limit >> 32));
    if ((err = gpu_bar_flush(g)))
        return err;
    gpu_wr32(g, pbus_reg, PBUS_BARVM_ENABLE | TARGET_VRAM << PBUS_BARVM_TARGET_SHIFT |
                          (uint32_t)(*inst >> 12));
    return 0;
}

static void bar_vm_fini(struct gpu *g, struct gpu_vm *vm, uint64_t inst, uint32_t pbus_reg)
{
    gpu_wr32(g, pbus_reg, 0);
    vm_fini(vm);
    vram_free(g, inst);
}

int gpu_init(struct gpu *g, const struct gpuvm_boot_params *bp)
{
    memset(g, 0, sizeof(*g));
    g->pramin_base = ~0u;
    g->fi = (uint32_t)(bp->flags >> BOOT_FI_SHIFT) & BOOT_FI_MASK;
    g->pv_batch = (uint32_t)bp->params[PARAM_PV_BATCH];

    uint32_t boot0 = gpu_rd32(g, PMC_BOOT_0);
    if (boot0 != PMC_BOOT_0_QUADRO_6000) {
        con_printf("gpu: PMC_BOOT_0 reads %#x, not a GF100 (%#x)", boot0,
                   PMC_BOOT_0_QUADRO_6000);
        return -E_NODEV;
    }
    gpu_wr32(g, PMC_ENABLE, gpu_rd32(g, PMC_ENABLE) | PMC_ENABLE_ALL);
    gpu_wr32(g, PFIFO_CTRL, PFIFO_CTRL_ENABLE);
    gpu_wr32(g, PFIFO_INTR_EN, PFIFO_INTR_VM_FAULT | PFIFO_INTR_PBDMA | PFIFO_INTR_SCHED |
                               PFIFO_INTR_RUNLIST);
    gpu_wr32(g, PMC_INTR_EN, PMC_INTR_EN_HW);

    g->vram_size = vram_size(g);
    if (!g->vram_size) {
        con_puts("gpu: the memory controller reports no VRAM");
        return -E_NODEV;
    }
    range_init(&g->vram, "vram", 0, g->vram_size, g->vram_blocks, VRAM_MAX_BLOCKS);

    uint64_t bar1 = bp->bar_size[BAR1], bar3 = bp->bar_size[BAR3];
    if (bar1 < BAR1_WINDOW || bar3 < (1u << 20)) {
        con_printf("gpu: BAR1 (%#lx) or BAR3 (%#lx) is too small", (unsigned long)bar1,
                   (unsigned long)bar3);
        return -E_NODEV;
    }
    int err = pt_setup(g);
    if (!err)
        err = bar_vm_init(g, &g->bar3, VM_BAR3, bar3 < BAR3_WINDOW_MAX ? bar3 : BAR3_WINDOW_MAX,
                          &g->bar3_inst, PBUS_BAR3_VM);
    if (!err)
        err = bar_vm_init(g, &g->bar1, VM_BAR1, BAR1_WINDOW, &g->bar1_inst, PBUS_BAR1_VM);
    if (!err)
        err = range_reserve(&g->bar1.va, BAR1_POLL_VA, BAR1_POLL_SIZE);
    if (err)
        return err;
    gpu_wr32(g, PFIFO_USERD_POLL, PFIFO_USERD_POLL_ENABLE | (BAR1_POLL_VA >> 12));

    struct instobj rl;
    if ((err = inst_new(g, MAX_CHANNELS * RUNLIST_ENTRY_SIZE, 1, &rl)))
        return err;
    g->runlist = rl.vram;
    g->runlist_bar3 = rl.bar3;
    g->runlist_size = rl.size;
    con_printf("gpu: GF100 %#x, %lu MiB VRAM, BAR1 %lu MiB, BAR3 %lu MiB%s", boot0,
               (unsigned long)(g->vram_size >> 20), (unsigned long)(bar1 >> 20),
               (unsigned long)(bar3 >> 20), GPUVM_PV_BUILD ? " (paravirtual)" : "");
    return 0;
}

void gpu_fini(struct gpu *g)
{
    if (g->runlist_size) {
        struct instobj rl = {g->runlist, g->runlist_bar3, g->runlist_size};
        inst_del(g, &rl);
        g->runlist_size = 0;
    }
    gpu_wr32(g, PFIFO_USERD_POLL, 0);
    if (g->bar1.gpu) {
        range_free(&g->bar1.va, BAR1_POLL_VA);
        bar_vm_fini(g, &g->bar1, g->bar1_inst, PBUS_BAR1_VM);
    }
    if (g->bar3.gpu)
        bar_vm_fini(g, &g->bar3, g->bar3_inst, PBUS_BAR3_VM);
    pt_teardown(g);
}

int gpu_runlist_update(struct gpu *g)
{
    uint32_t n = 0;
    for (unsigned id = 0; id < MAX_CHANNELS; id++) {
        if (!(g->runnable & (1u << id)))
            continue;
        plat_wr32(BAR3, g->runlist_bar3 + n * RUNLIST_ENTRY_SIZE, id);
        plat_wr32(BAR3, g->runlist_bar3 + n * RUNLIST_ENTRY_SIZE + 4, RUNLIST_ENTRY_WORD1);
        n++;
    }
    int err = gpu_bar_flush(g);
    if (err)
        return err;
    gpu_wr32(g, PFIFO_RUNLIST_ADDR, (uint32_t)(g->runlist >> 12) |
                                    TARGET_VRAM << PFIFO_RUNLIST_TARGET_SHIFT);
    gpu_wr32(g, PFIFO_RUNLIST_SUBMIT, n);
    return gpu_runlist_wait(g);
}

/*
 * What nouveau's gf100_fifo_runlist_commit sleeps on: the runlist event interrupt
 * (PFIFO_INTR bit 30), whose status (0x2a00) bit 28 says the update is done; the handler
 * acks it, and the waiter then sees the PENDING bit of 0x227c clear.  Without interrupts
 * the driver polls the same registers in the same order.
 */
int gpu_runlist_wait(struct gpu *g)
{
    int err = gpu_poll_any(g, PFIFO_INTR, PFIFO_INTR_RUNLIST);
    if (err)
        return err;
    uint32_t status = gpu_rd32(g, PFIFO_INTR_RUNLIST_STATUS);
    if (status & PFIFO_RUNLIST_EVENT_DONE)
        gpu_wr32(g, PFIFO_INTR_RUNLIST_STATUS, PFIFO_RUNLIST_EVENT_DONE);
    if (status & ~PFIFO_RUNLIST_EVENT_DONE) {
        con_printf("gpu: runlist event %#x", status);
        gpu_wr32(g, PFIFO_INTR_RUNLIST_STATUS, status);
    }
    return gpu_poll(g, PFIFO_RUNLIST_STATUS, PFIFO_RUNLIST_PENDING, 0);
}
