/* hostmem: the smart-pinning workload (issue 16).
 *
 * `allocations` host buffers of `bytes` each come from the runtime's host allocator
 * (rt_host_alloc) under a pin policy; every `stride`-th allocation is hot (copied to the
 * GPU and back in every one of `rounds` rounds), the others are copied once.  With
 * reporting on, the VMM records each allocation, pin and transfer: that history is what a
 * profile run produces and what picks the hot mask of the next run.
 *
 * params[0] = bytes per allocation, [1] = allocations (<= 16), [2] = policy (RT_PIN_*),
 * [3] = hot mask (RT_PIN_HOT), [4] = rounds (0 = 8), [5] = stride of hot allocations (0 = 4).
 */
#include "bench.h"
#include "lib.h"

#define HM_MAX_ALLOCS 16

static void fill(uint32_t *p, uint64_t words, uint32_t seed)
{
    for (uint64_t i = 0; i < words; i++)
        p[i] = (uint32_t)i * 2246822519u ^ seed;
}

static int intact(const uint32_t *p, uint64_t words, uint32_t seed)
{
    for (uint64_t i = 0; i < words; i++)
        if (p[i] != ((uint32_t)i * 2246822519u ^ seed))
            return 0;
    return 1;
}

int bench_hostmem(struct bench_run *r)
{
    uint64_t bytes = ALIGN_UP(r->param[0], 4);
    uint64_t n = r->param[1];
    uint64_t rounds = r->param[4] ? r->param[4] : 8, stride = r->param[5] ? r->param[5] : 4;
    unsigned policy = (unsigned)r->param[2];
    void *buf[HM_MAX_ALLOCS] = {0};
    uint64_t dev = 0;
    rec_add(r, "bytes=%lu allocations=%lu policy=%u hot_mask=%#lx rounds=%lu stride=%lu",
            (unsigned long)bytes, (unsigned long)n, policy, (unsigned long)r->param[3],
            (unsigned long)rounds, (unsigned long)stride);
    if (n > HM_MAX_ALLOCS || policy > RT_PIN_HOT) {
        r->reason = "bad_parameters";
        return bench_finish(r, 0);
    }

    int err = bench_step(r, rt_init(r->bp), "init");
    rt_pin_policy(policy, r->param[3]);
    if (!err)
        err = bench_step(r, rt_mem_alloc(&dev, bytes), "device allocation");
    for (uint64_t i = 0; i < n && !err; i++) {
        err = bench_step(r, rt_host_alloc(&buf[i], bytes), "host allocation");
        if (!err)
            fill(buf[i], bytes / 4, (uint32_t)i + 1);
    }

    phase_mark(PHASE_HTOD);
    for (uint64_t round = 0; round < rounds && !err; round++)
        for (uint64_t i = 0; i < n && !err; i++) {
            if (round && i % stride)
                continue;
            err = bench_step(r, rt_memcpy_htod(dev, buf[i], bytes), "memcpy HtoD");
            if (!err)
                err = bench_step(r, rt_memcpy_dtoh(buf[i], dev, bytes), "memcpy DtoH");
        }

    phase_mark(PHASE_CLOSE);
    int passed = !err;
    for (uint64_t i = 0; i < n; i++)
        if (buf[i]) {
            passed = passed && intact(buf[i], bytes / 4, (uint32_t)i + 1);
            if (!r->err)
                bench_step(r, rt_host_free(buf[i]), "host free");
        }
    if (!r->err && dev)
        bench_step(r, rt_mem_free(dev), "free");
    bench_close(r);
    return bench_finish(r, passed);
}
