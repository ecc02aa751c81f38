/* How the boot parameters are used beyond gpuvm_abi.h. */
#ifndef GV_PARAMS_H
#define GV_PARAMS_H

/* params[7] is the driver's, not the benchmark's: in the PV build, the number of
 * entries per map/unmap hypercall (1 = pv-naive; 0 = HC_MAX_ENTRIES).  Benchmarks use
 * params[0..6].  Mirrored in gpuvm/vmm/guest_programs.py (PARAM_PV_BATCH). */
#define PARAM_PV_BATCH 7
#define BENCH_NUM_PARAMS 7

#ifdef GPUVM_PV
#define GPUVM_PV_BUILD 1
#else
#define GPUVM_PV_BUILD 0
#endif

#endif
