/* What every benchmark shares: the result record, the close checks, input data, and the
 * three-buffer kernel harness. */
#include "bench.h"
#include "lib.h"

void rec_add(struct bench_run *r, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    if (r->len + 2 < REC_MAX) {
        r->rec[r->len++] = ' ';
        int n = vfmt(r->rec + r->len, REC_MAX - r->len, f, ap);
        r->len += (unsigned)n;
        if (r->len >= REC_MAX)
            r->len = REC_MAX - 1;
    }
    va_end(ap);
}

int bench_step(struct bench_run *r, int err, const char *what)
{
    if (err && !r->err) {
        r->err = err;
        con_printf("%s: %s failed: %s", r->name, what, err_name(err));
    }
    return err;
}

int bench_close(struct bench_run *r)
{
    int err = rt_close();
    if (err && err != -E_NOMEM)
        return bench_step(r, err, "close");
    if (rt_vram_leak() || rt_ram_leak()) {
        con_printf("%s: teardown left %lu bytes of VRAM and %lu of guest RAM allocated",
                   r->name, (unsigned long)rt_vram_leak(), (unsigned long)rt_ram_leak());
        if (!r->reason)
            r->reason = "leak";
        return -E_NOMEM;
    }
    return 0;
}

int bench_finish(struct bench_run *r, int passed)
{
    const struct drv_stats *s = &rt_gpu()->stats;
    const char *reason = r->err ? err_name(r->err) : r->reason;
    passed = passed && !r->err && !r->reason;
    char head[64];
    fmt(head, sizeof(head), "bench=%s", r->name);
    rec_add(r, "check=%s", passed ? "PASS" : "FAIL");
    if (!passed)
        rec_add(r, "reason=%s", reason ? reason : "mismatch");
    if (r->err == -E_FAULT && rt_fault_text()[0])
        rec_add(r, "%s", rt_fault_text());
    rec_add(r, "pte_writes=%lu pde_writes=%lu pt_zero_words=%lu tlb_flushes=%lu doorbells=%lu "
               "hypercalls=%lu hc_entries=%lu copies=%lu copy_bytes=%lu launches=%lu waits=%lu",
            (unsigned long)s->pte_writes, (unsigned long)s->pde_writes,
            (unsigned long)s->pt_zero_words, (unsigned long)s->tlb_flushes,
            (unsigned long)s->doorbells, (unsigned long)s->hypercalls,
            (unsigned long)s->hc_entries, (unsigned long)s->copies,
            (unsigned long)s->copy_bytes, (unsigned long)s->launches,
            (unsigned long)s->waits);
    result_printf("%s%s", head, r->rec);
    return passed ? 0 : 1;
}

void fill_floats(float *a, uint64_t n, uint32_t seed)
{
    uint32_t x = seed * 2654435761u + 12345u;
    for (uint64_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        a[i] = (float)((int32_t)(x >> 8) - (1 << 23)) / (float)(1 << 23);
    }
}

static double max_error(const float *got, const float *want, uint64_t n)
{
    double worst = 0;
    for (uint64_t i = 0; i < n; i++) {
        double d = (double)got[i] - (double)want[i];
        double w = want[i] < 0 ? -(double)want[i] : want[i];
        double e = (d < 0 ? -d : d) / (1.0 + w);
        if (e > worst || e != e)
            worst = e != e ? 1e300 : e;
    }
    return worst;
}

/* Pinned mode keeps pinned copies of the buffers next to the pageable ones that hold the
 * inputs and the reference, and copies to and from them with the CPU during Init/DtoH. */
int abc_run(struct bench_run *r, const struct abc_kernel *k, const char *kname)
{
    int pinned = r->param[1] != 0;
    uint64_t bytes[3] = {k->n_a * 4, k->n_b * 4, k->n_c * 4};
    float *host[3], *pin[3] = {0, 0, 0}, *out = NULL;
    uint64_t dev[3] = {0, 0, 0};
    struct rt_module mod = {0, 0, 0};
    int passed = 0;

    for (int i = 0; i < 3; i++) {
        host[i] = ram_alloc(bytes[i]);
        if (!host[i])
            return bench_step(r, -E_NOMEM, "input allocation"), bench_finish(r, 0);
        fill_floats(host[i], bytes[i] / 4, (uint32_t)i + 1);
    }
    out = ram_alloc(bytes[2]);
    if (!out)
        return bench_step(r, -E_NOMEM, "output allocation"), bench_finish(r, 0);
    rec_add(r, "pinned=%d", pinned);

    /* Init: context, module, device buffers */
    int err = bench_step(r, rt_init(r->bp), "init");
    if (!err)
        err = bench_step(r, rt_module_load(&mod, k->kernel, 6 + k->n_extra, kname), "module load");
    for (int i = 0; i < 3 && !err; i++)
        err = bench_step(r, rt_mem_alloc(&dev[i], bytes[i]), "device allocation");
    for (int i = 0; i < 3 && !err && pinned; i++) {
        err = bench_step(r, rt_mem_alloc_host((void **)&pin[i], bytes[i]), "pinned allocation");
        if (!err)
            memcpy(pin[i], host[i], bytes[i]);
    }
    float **src = pinned ? pin : host;

    /* HtoD */
    phase_mark(PHASE_HTOD);
    for (int i = 0; i < (k->c_is_input ? 3 : 2) && !err; i++)
        err = bench_step(r, rt_memcpy_htod(dev[i], src[i], bytes[i]), "memcpy HtoD");

    /* Launch */
    phase_mark(PHASE_LAUNCH);
    if (!err) {
        uint32_t p[8];
        for (int i = 0; i < 3; i++) {
            p[2 * i] = (uint32_t)dev[i];
            p[2 * i + 1] = (uint32_t)(dev[i] >> 32);
        }
        for (unsigned i = 0; i < k->n_extra; i++)
            p[6 + i] = k->extra[i];
        err = bench_step(r, rt_launch(&mod, k->grid, k->block, p, 6 + k->n_extra), "launch");
        if (!err)
            err = bench_step(r, rt_synchronize(), "synchronize");
    }

    /* DtoH */
    phase_mark(PHASE_DTOH);
    if (!err) {
        err = bench_step(r, rt_memcpy_dtoh(pinned ? pin[2] : out, dev[2], bytes[2]), "memcpy DtoH");
        if (!err && pinned)
            memcpy(out, pin[2], bytes[2]);
    }

    /* Close: everything is freed explicitly, then the context */
    phase_mark(PHASE_CLOSE);
    if (!r->err) {
        for (int i = 0; i < 3; i++) {
            bench_step(r, rt_mem_free(dev[i]), "free");
            if (pin[i])
                bench_step(r, rt_mem_free_host(pin[i]), "free pinned");
        }
        bench_step(r, rt_module_unload(&mod), "module unload");
    }
    bench_close(r);

    if (!r->err) {
        k->reference(k, host[0], host[1], host[2]);
        double err_max = max_error(out, host[2], k->n_c);
        passed = err_max <= k->tol;
        rec_add(r, "maxerr=%e tol=%e", err_max, k->tol);
    }
    for (int i = 0; i < 3; i++)
        ram_free(host[i]);
    ram_free(out);
    return bench_finish(r, passed);
}
