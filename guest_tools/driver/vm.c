/* GPU address spaces: VA allocation and page-granular map/unmap over pt.h. */
#include "gpu.h"
#include "lib.h"
#include "pt.h"

int vm_init(struct gpu_vm *vm, struct gpu *g, enum vm_kind kind, const char *name,
            uint64_t va_base, uint64_t limit)
{
    memset(vm, 0, sizeof(*vm));
    vm->gpu = g;
    vm->kind = kind;
    vm->name = name;
    vm->limit = limit;
    range_init(&vm->va, name, va_base, limit + 1 - va_base, vm->va_blocks, VM_VA_BLOCKS);
    int err = vram_alloc(g, PD_BYTES, PAGE_SIZE, &vm->pd);
    if (err) {
        vm->gpu = NULL;
        return err;
    }
    if ((err = pt_space_init(vm))) {
        vram_free(g, vm->pd);
        vm->gpu = NULL;
    }
    return err;
}

void vm_fini(struct gpu_vm *vm)
{
    if (!vm->gpu)
        return;
    if (vm->va.count)
        con_printf("vm %s: %u VA ranges still allocated at teardown", vm->name, vm->va.count);
    pt_space_fini(vm);
    vram_free(vm->gpu, vm->pd);
    vm->gpu = NULL;
}

int vm_va_alloc(struct gpu_vm *vm, uint64_t size, uint64_t *va)
{
    int err = range_alloc(&vm->va, ALIGN_UP(size, PAGE_SIZE), PAGE_SIZE, va);
    if (err)
        con_printf("vm %s: out of VA for %lu bytes", vm->name, (unsigned long)size);
    return err;
}

void vm_va_free(struct gpu_vm *vm, uint64_t va)
{
    if (!range_free(&vm->va, va))
        con_printf("vm %s: freeing unallocated VA %#lx", vm->name, (unsigned long)va);
}

int vm_map(struct gpu_vm *vm, uint64_t va, uint64_t phys, uint64_t size, unsigned target,
           uint64_t flags)
{
    for (uint64_t off = 0; off < size; off += PAGE_SIZE) {
        int err = pt_set(vm, va + off, vm_pte(phys + off, target, flags));
        if (err)
            return err;
    }
    return 0;
}

int vm_unmap(struct gpu_vm *vm, uint64_t va, uint64_t size)
{
    int first = 0;
    for (uint64_t off = 0; off < size; off += PAGE_SIZE) {
        int err = pt_set(vm, va + off, 0);
        if (err && !first)
            first = err;
    }
    return first;
}

int vm_flush(struct gpu_vm *vm)
{
    return vm->dirty ? pt_commit(vm) : 0;
}
