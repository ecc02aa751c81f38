/*
 * Benchmarks: each one runs the phases Init / HtoD / Launch / DtoH / Close (Init is
 * implicit: it lasts until the first phase mark), checks its output against a CPU
 * reference computed in the guest, and reports one result record:
 *   bench=<name> <sizes> check=PASS|FAIL [reason=...] <driver counts> ...
 * A benchmark returns 0 only when everything passed.
 */
#ifndef GV_BENCH_H
#define GV_BENCH_H

#include <stdint.h>

#include "gpuvm_abi.h"
#include "runtime.h"

#define REC_MAX 1024

struct bench_run {
    const struct gpuvm_boot_params *bp;
    const char *name;
    uint64_t param[8];        /* bp->params, with the benchmark's defaults applied */
    char rec[REC_MAX];        /* the result record being built */
    unsigned len;
    int err;                  /* the first runtime error (negative), 0 if none */
    const char *reason;       /* why the check failed, when it did */
};

struct bench {
    const char *name;
    uint64_t defaults[4];     /* params[0..3] when the boot parameter is 0 */
    int (*run)(struct bench_run *r);
};

/* Appends " key=value..." to the record. */
void rec_add(struct bench_run *r, const char *f, ...) __attribute__((format(printf, 2, 3)));
/* Records the first error of a runtime call; returns the error. */
int bench_step(struct bench_run *r, int err, const char *what);
/* rt_close plus the teardown checks (no VRAM or guest RAM left); returns the error. */
int bench_close(struct bench_run *r);
/* Sends the record (with check=, reason= and the driver's counts); returns the exit code. */
int bench_finish(struct bench_run *r, int passed);

/* Deterministic inputs in [-1, 1). */
void fill_floats(float *a, uint64_t n, uint32_t seed);

/* The three-buffer kernel benchmarks (vecadd, madd, mmul, fmadd). */
struct abc_kernel {
    uint32_t kernel;
    uint64_t n_a, n_b, n_c;   /* elements of each buffer */
    int c_is_input;           /* c is uploaded too (fmadd) */
    uint32_t extra[2];        /* parameter words after the three pointers */
    unsigned n_extra;
    struct rt_dim grid, block;
    double tol;               /* largest allowed |gpu - cpu| / (1 + |cpu|) */
    /* c = f(a, b, c) on the CPU */
    void (*reference)(const struct abc_kernel *k, const float *a, const float *b, float *c);
};
int abc_run(struct bench_run *r, const struct abc_kernel *k, const char *kname);

int bench_vecadd(struct bench_run *r);
int bench_madd(struct bench_run *r);
int bench_mmul(struct bench_run *r);
int bench_fmadd(struct bench_run *r);
int bench_memcpy(struct bench_run *r);
int bench_loop(struct bench_run *r);
int bench_idle(struct bench_run *r);
int bench_probe(struct bench_run *r);
int bench_hostmem(struct bench_run *r);

#define FLT_EPS 1.1920929e-7

#endif
