/*
 * Page-table write path of the paravirtual build (-DGPUVM_PV): the hypervisor keeps the
 * page tables.  A space is named by the VRAM address of the PD the driver would have
 * used (HC_SET_PGD); entries are queued and sent as HC_MAP_BATCH / HC_UNMAP_BATCH
 * through one shared area in guest RAM, `pv_batch` entries at a time (1 = pv-naive);
 * HC_VM_FLUSH replaces the PFFB flush registers.  The driver never writes a PDE or PTE.
 */
#ifdef GPUVM_PV
#include "gpu.h"
#include "lib.h"
#include "pt.h"

static struct {
    struct gpu_vm *vm;  /* the space the queued entries belong to */
    uint32_t op;
    uint32_t count;     /* entries queued in the shared area */
} queue;

static struct gpuvm_hcall_entry *entries(struct gpu *g)
{
    return (struct gpuvm_hcall_entry *)((char *)g->hcall + HCALL_HEADER_BYTES);
}

static int call(struct gpu *g, struct gpu_vm *vm, uint32_t op, uint32_t count)
{
    struct gpuvm_hcall *hc = g->hcall;
    hc->op = op;
    hc->count = count;
    hc->args[0] = vm->pd;
    hc->args[1] = hc->args[2] = hc->args[3] = 0;
    g->stats.hypercalls++;
    g->stats.hc_entries += count;
    int32_t status = hypercall(hc);
    if (status != HC_OK) {
        vm->refused += (uint32_t)hc->args[3];
        con_printf("pv: hypercall %u on %s (pd %#lx, %u entries) returned %d", op, vm->name,
                   (unsigned long)vm->pd, count, status);
        return -E_REFUSED;
    }
    return 0;
}

static int send_queue(struct gpu *g)
{
    uint32_t count = queue.count;
    if (!queue.vm || !count)
        return 0;
    queue.count = 0;
    return call(g, queue.vm, queue.op, count);
}

int pt_setup(struct gpu *g)
{
    uint32_t batch = g->pv_batch;
    g->pv_batch = batch == 0 || batch > HC_MAX_ENTRIES ? HC_MAX_ENTRIES : batch;
    g->hcall = ram_alloc(HCALL_HEADER_BYTES + HC_MAX_ENTRIES * sizeof(struct gpuvm_hcall_entry));
    queue.vm = NULL;
    queue.count = 0;
    return g->hcall ? 0 : -E_NOMEM;
}

void pt_teardown(struct gpu *g)
{
    ram_free(g->hcall);
    g->hcall = NULL;
}

int pt_space_init(struct gpu_vm *vm)
{
    int err = send_queue(vm->gpu);
    return err ? err : call(vm->gpu, vm, HC_SET_PGD, 0);
}

void pt_space_fini(struct gpu_vm *vm)
{
    struct gpu *g = vm->gpu;
    send_queue(g);
    if (queue.vm == vm)
        queue.vm = NULL;
    call(g, vm, HC_FREE_PGD, 0);
}

int pt_set(struct gpu_vm *vm, uint64_t va, uint64_t pte)
{
    struct gpu *g = vm->gpu;
    uint32_t op = pte ? HC_MAP_BATCH : HC_UNMAP_BATCH;
    if (va > vm->limit)
        return -E_INVAL;
    if (queue.vm != vm || queue.op != op) {
        int err = send_queue(g);
        if (err)
            return err;
        queue.vm = vm;
        queue.op = op;
    }
    struct gpuvm_hcall_entry *e = &entries(g)[queue.count++];
    e->va = va;
    e->pte = pte;
    g->stats.pte_writes++;
    vm->dirty = 1;
    return queue.count >= g->pv_batch ? send_queue(g) : 0;
}

int pt_commit(struct gpu_vm *vm)
{
    struct gpu *g = vm->gpu;
    int err = send_queue(g);
    if (!err)
        err = call(g, vm, HC_VM_FLUSH, 0);
    if (!err) {
        g->stats.tlb_flushes++;
        vm->dirty = 0;
    }
    return err;
}
#endif
