/* In-process entry: the VMM calls this on the guest's own thread. */
#include "gpuvm_abi.h"

int guest_main(struct gpuvm_boot_params *bp);

__attribute__((visibility("default")))
int gpuvm_guest_entry(struct gpuvm_boot_params *bp)
{
    int rc = guest_main(bp);
    ((gpuvm_host_port_out_fn)(uintptr_t)bp->host_port_out)(PORT_EXIT, (uint32_t)rc);
    return rc;
}
