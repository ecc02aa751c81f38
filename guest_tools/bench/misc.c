/* memcpy, loop and idle. */
#include "bench.h"
#include "lib.h"

static void fill_pattern(uint32_t *p, uint64_t words, uint32_t seed)
{
    for (uint64_t i = 0; i < words; i++)
        p[i] = (uint32_t)i * 2654435761u ^ seed;
}

/* params[0] = bytes, params[1] = 1 for pinned host buffers, params[2] = where the pageable
 * buffers start inside their allocations (bytes, page multiple; 0 = at the start): an
 * offset makes a chunk grid cut 2 MiB huge pages (issue 16). */
int bench_memcpy(struct bench_run *r)
{
    uint64_t bytes = ALIGN_UP(r->param[0], 4);
    int pinned = r->param[1] != 0;
    uint64_t offset = ALIGN_UP(r->param[2], PAGE_SIZE);
    char *src_mem = ram_alloc(bytes + offset), *dst_mem = ram_alloc(bytes + offset);
    uint32_t *src = (uint32_t *)(src_mem + offset), *dst = (uint32_t *)(dst_mem + offset);
    void *psrc = NULL, *pdst = NULL;
    uint64_t dev = 0;
    rec_add(r, "bytes=%lu pinned=%d", (unsigned long)bytes, pinned);
    if (offset)
        rec_add(r, "offset=%lu", (unsigned long)offset);
    if (!src_mem || !dst_mem)
        return bench_step(r, -E_NOMEM, "host allocation"), bench_finish(r, 0);
    fill_pattern(src, bytes / 4, 0x9e3779b9u);
    memset(dst, 0xa5, bytes);

    int err = bench_step(r, rt_init(r->bp), "init");
    if (!err)
        err = bench_step(r, rt_mem_alloc(&dev, bytes), "device allocation");
    if (!err && pinned) {
        err = bench_step(r, rt_mem_alloc_host(&psrc, bytes), "pinned allocation");
        if (!err)
            err = bench_step(r, rt_mem_alloc_host(&pdst, bytes), "pinned allocation");
        if (!err)
            memcpy(psrc, src, bytes);
    }

    phase_mark(PHASE_HTOD);
    if (!err)
        err = bench_step(r, rt_memcpy_htod(dev, pinned ? psrc : src, bytes), "memcpy HtoD");
    phase_mark(PHASE_DTOH);
    if (!err) {
        err = bench_step(r, rt_memcpy_dtoh(pinned ? pdst : dst, dev, bytes), "memcpy DtoH");
        if (!err && pinned)
            memcpy(dst, pdst, bytes);
    }

    phase_mark(PHASE_CLOSE);
    if (!r->err) {
        bench_step(r, rt_mem_free(dev), "free");
        if (pinned) {
            bench_step(r, rt_mem_free_host(psrc), "free pinned");
            bench_step(r, rt_mem_free_host(pdst), "free pinned");
        }
    }
    bench_close(r);
    int passed = !r->err && memcmp(src, dst, bytes) == 0;
    ram_free(src_mem);
    ram_free(dst_mem);
    return bench_finish(r, passed);
}

/* params[0] = iterations of the timed spin kernel. */
/* params[0] = iterations per kernel (device ns at 1 ns each), params[1] = kernels to run
 * one after another, each waited for (default 1): the isolation experiment's workload. */
int bench_loop(struct bench_run *r)
{
    uint64_t iterations = r->param[0];
    uint64_t kernels = r->param[1] ? r->param[1] : 1;
    uint32_t *word = ram_alloc(4);
    uint64_t out = 0;
    struct rt_module mod = {0, 0, 0};
    rec_add(r, "iterations=%lu kernels=%lu", (unsigned long)iterations, (unsigned long)kernels);
    if (!word)
        return bench_step(r, -E_NOMEM, "host allocation"), bench_finish(r, 0);

    int err = bench_step(r, rt_init(r->bp), "init");
    if (!err)
        err = bench_step(r, rt_module_load(&mod, KERNEL_LOOP, 4, "loop"), "module load");
    if (!err)
        err = bench_step(r, rt_mem_alloc(&out, 4), "device allocation");

    phase_mark(PHASE_HTOD);
    *word = 0xdeadbeefu;  /* a sentinel the kernel must overwrite */
    if (!err)
        err = bench_step(r, rt_memcpy_htod(out, word, 4), "memcpy HtoD");

    phase_mark(PHASE_LAUNCH);
    if (!err) {
        uint32_t p[4] = {(uint32_t)out, (uint32_t)(out >> 32), (uint32_t)iterations,
                         (uint32_t)(iterations >> 32)};
        struct rt_dim one = {1, 1, 1};
        for (uint64_t k = 0; k < kernels && !err; k++) {
            err = bench_step(r, rt_launch(&mod, one, one, p, 4), "launch");
            if (!err)
                err = bench_step(r, rt_synchronize(), "synchronize");
        }
    }

    phase_mark(PHASE_DTOH);
    *word = 0;
    if (!err)
        err = bench_step(r, rt_memcpy_dtoh(word, out, 4), "memcpy DtoH");

    phase_mark(PHASE_CLOSE);
    if (!r->err) {
        bench_step(r, rt_mem_free(out), "free");
        bench_step(r, rt_module_unload(&mod), "module unload");
    }
    bench_close(r);
    int passed = !r->err && *word == (uint32_t)iterations;
    rec_add(r, "result=%u", *word);
    ram_free(word);
    return bench_finish(r, passed);
}

/* Context creation and teardown only. */
int bench_idle(struct bench_run *r)
{
    bench_step(r, rt_init(r->bp), "init");
    phase_mark(PHASE_CLOSE);
    bench_close(r);
    return bench_finish(r, !r->err);
}
