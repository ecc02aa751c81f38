/* vecadd, madd, mmul, fmadd: sizes in params[0], params[1] = 1 for pinned host memory. */
#include "bench.h"
#include "lib.h"

static struct rt_dim dim(uint32_t x, uint32_t y)
{
    struct rt_dim d = {x ? x : 1, y ? y : 1, 1};
    return d;
}

static uint32_t blocks(uint64_t n, uint32_t per)
{
    return (uint32_t)((n + per - 1) / per);
}

static void add_ref(const struct abc_kernel *k, const float *a, const float *b, float *c)
{
    for (uint64_t i = 0; i < k->n_c; i++)
        c[i] = a[i] + b[i];
}

static void fmadd_ref(const struct abc_kernel *k, const float *a, const float *b, float *c)
{
    for (uint64_t i = 0; i < k->n_c; i++) {
        float prod = a[i] * b[i];  /* rounded on its own, as the device computes it */
        c[i] = prod + c[i];
    }
}

/* i-k-j order, float accumulation; the device sums in another order, so the check allows
 * for the difference (tolerance grows with n). */
static void mmul_ref(const struct abc_kernel *k, const float *a, const float *b, float *c)
{
    uint64_t n = k->extra[0];
    for (uint64_t i = 0; i < n; i++) {
        float *row = c + i * n;
        for (uint64_t j = 0; j < n; j++)
            row[j] = 0;
        for (uint64_t kk = 0; kk < n; kk++) {
            float aik = a[i * n + kk];
            const float *brow = b + kk * n;
            for (uint64_t j = 0; j < n; j++)
                row[j] += aik * brow[j];
        }
    }
}

int bench_vecadd(struct bench_run *r)
{
    uint64_t n = r->param[0];
    struct abc_kernel k = {
        .kernel = KERNEL_VECADD, .n_a = n, .n_b = n, .n_c = n,
        .extra = {(uint32_t)n}, .n_extra = 1,
        .grid = dim(blocks(n, 256), 1), .block = dim(256, 1),
        .tol = 0, .reference = add_ref,
    };
    rec_add(r, "n=%lu", (unsigned long)n);
    return abc_run(r, &k, "vecadd");
}

int bench_madd(struct bench_run *r)
{
    uint64_t n = r->param[0];
    struct abc_kernel k = {
        .kernel = KERNEL_MADD, .n_a = n * n, .n_b = n * n, .n_c = n * n,
        .extra = {(uint32_t)n, (uint32_t)n}, .n_extra = 2,
        .grid = dim(blocks(n, 16), blocks(n, 16)), .block = dim(16, 16),
        .tol = 0, .reference = add_ref,
    };
    rec_add(r, "n=%lu", (unsigned long)n);
    return abc_run(r, &k, "madd");
}

int bench_mmul(struct bench_run *r)
{
    uint64_t n = r->param[0];
    struct abc_kernel k = {
        .kernel = KERNEL_MMUL, .n_a = n * n, .n_b = n * n, .n_c = n * n,
        .extra = {(uint32_t)n}, .n_extra = 1,
        .grid = dim(blocks(n, 16), blocks(n, 16)), .block = dim(16, 16),
        .tol = 8.0 * (double)n * FLT_EPS, .reference = mmul_ref,
    };
    rec_add(r, "n=%lu", (unsigned long)n);
    return abc_run(r, &k, "mmul");
}

int bench_fmadd(struct bench_run *r)
{
    uint64_t n = r->param[0];
    struct abc_kernel k = {
        .kernel = KERNEL_FMADD, .n_a = n, .n_b = n, .n_c = n, .c_is_input = 1,
        .extra = {(uint32_t)n}, .n_extra = 1,
        .grid = dim(blocks(n, 256), 1), .block = dim(256, 1),
        .tol = 2.0 * FLT_EPS, .reference = fmadd_ref,
    };
    rec_add(r, "n=%lu", (unsigned long)n);
    return abc_run(r, &k, "fmadd");
}
