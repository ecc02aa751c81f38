/*
 * The page-table write path: the one interface whose implementation differs between the
 * default build (pt_direct.c: the driver writes PDEs/PTEs into VRAM and flushes the TLB
 * through PFFB -- native and every full-virtualization mode run this) and the
 * paravirtual build (pt_pv.c, -DGPUVM_PV: the hypervisor owns the tables; the driver
 * names the space by its PD address and sends batches of {va, pte} by hypercall).
 */
#ifndef GV_PT_H
#define GV_PT_H

#include <stdint.h>

struct gpu_vm;
struct gpu;

int pt_setup(struct gpu *g);             /* once, before the first space */
void pt_teardown(struct gpu *g);
int pt_space_init(struct gpu_vm *vm);    /* vm->pd is allocated; make it an empty space */
void pt_space_fini(struct gpu_vm *vm);   /* release its tables (not vm->pd) */
int pt_set(struct gpu_vm *vm, uint64_t va, uint64_t pte);  /* pte 0 = unmap */
int pt_commit(struct gpu_vm *vm);        /* entries reach the device; TLB flushed */

#endif
