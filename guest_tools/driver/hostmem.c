/* Pinned host memory: guest RAM pages the GPU reaches through sysram PTEs. */
#include "channel.h"
#include "lib.h"

int hostmem_alloc(struct gpu_vm *vm, uint64_t size, struct hostmem *m)
{
    m->size = ALIGN_UP(size, PAGE_SIZE);
    m->virt = ram_alloc(m->size);
    if (!m->virt) {
        con_printf("hostmem: out of guest RAM for %lu bytes", (unsigned long)size);
        return -E_NOMEM;
    }
    m->phys = plat_virt_to_phys(m->virt);
    int err = vm_va_alloc(vm, m->size, &m->va);
    if (err)
        goto fail_ram;
    if ((err = vm_map(vm, m->va, m->phys, m->size, TARGET_SYSRAM, 0)) || (err = vm_flush(vm))) {
        vm_unmap(vm, m->va, m->size);
        vm_va_free(vm, m->va);
        goto fail_ram;
    }
    return 0;
fail_ram:
    ram_free(m->virt);
    m->virt = NULL;
    return err;
}

void hostmem_free(struct gpu_vm *vm, struct hostmem *m)
{
    if (!m->virt)
        return;
    vm_unmap(vm, m->va, m->size);
    vm_flush(vm);
    vm_va_free(vm, m->va);
    ram_free(m->virt);
    m->virt = NULL;
}
