/* The isolation probe: see probe.h for the vectors and the record. */
#include "bench.h"
#include "lib.h"
#include "params.h"
#include "probe.h"
#include "pushbuf.h"

struct probe {
    struct gpu *g;
    uint64_t addr, len;
    int faulted, wrote, changed, have_data;
    uint32_t refused;
    uint8_t *buf, *marker;    /* pinned: where reads land, what writes store */
    uint8_t data[PROBE_MAX_LEN];
    char fault[160];
};

/* Reads [at, at+len) with aligned 32-bit loads (BAR0 takes nothing else). */
static void read_bytes(uint8_t *out, uint64_t at, uint64_t len,
                       uint32_t (*rd)(const void *ctx, uint64_t off), const void *ctx)
{
    for (uint64_t a = at & ~3ull; a < at + len; a += 4) {
        uint32_t w = rd(ctx, a);
        for (unsigned b = 0; b < 4; b++)
            if (a + b >= at && a + b < at + len)
                out[a + b - at] = (uint8_t)(w >> (8 * b));
    }
}

static uint32_t rd_bar(const void *ctx, uint64_t off)
{
    return plat_rd32(*(const unsigned *)ctx, off);
}

static uint32_t rd_pramin(const void *ctx, uint64_t off)
{
    return pramin_rd32((struct gpu *)ctx, off);
}

static const char *vector_name(uint64_t v)
{
    static const char *names[] = {"none", "channel_pt", "bar1", "bar3", "pramin", "ramin",
                                  "sysram", "pv_map"};
    return v < ARRAY_SIZE(names) ? names[v] : "unknown";
}

/* The page-aligned span covering [addr, addr+len). */
static uint64_t span_of(const struct probe *p, uint64_t *page)
{
    *page = p->addr & ~(uint64_t)(PAGE_SIZE - 1);
    return ALIGN_UP((p->addr - *page) + p->len, PAGE_SIZE);
}

static int bar_fault_pending(struct gpu *g, unsigned unit)
{
    uint32_t mask = gpu_rd32(g, PFIFO_FAULT_UNIT_MASK) & (1u << unit);
    if (mask)
        gpu_wr32(g, PFIFO_FAULT_UNIT_MASK, mask);
    return mask != 0;
}

/* A GPU copy that may fault: a fault is recorded as the outcome, other errors returned. */
static int probe_copy(struct probe *p, uint64_t dst, uint64_t src, int *done)
{
    int err = rt_copy_va(dst, src, p->len);
    *done = !err;
    if (err == -E_FAULT) {
        p->faulted = 1;
        return 0;
    }
    return err;
}

/* The copy engine through the channel's own page table (VRAM or sysram PTE). */
static int probe_channel(struct probe *p, unsigned target)
{
    struct gpu_vm *vm = &rt_channel()->vm;
    uint64_t page, span = span_of(p, &page), va;
    int err = vm_va_alloc(vm, span, &va);
    if (err)
        return err;
    err = vm_map(vm, va, page, span, target, 0);
    if (!err)
        err = vm_flush(vm);
    if (err == -E_REFUSED)
        err = 0;  /* the hypervisor said no: an outcome; the copy shows what it means */
    p->refused = vm->refused;
    uint64_t at = va + (p->addr - page);
    int done = 0;
    if (!err)
        err = probe_copy(p, rt_host_va(p->buf, p->len), at, &p->have_data);
    if (!err && p->have_data) {
        memcpy(p->data, p->buf, p->len);
        err = probe_copy(p, at, rt_host_va(p->marker, p->len), &done);
        p->wrote = done;
    }
    vm_unmap(vm, va, span);
    vm_flush(vm);
    vm_va_free(vm, va);
    return err;
}

/* CPU loads and stores through a BAR VM mapping. */
static int probe_bar(struct probe *p, struct gpu_vm *vm, unsigned bar, unsigned unit)
{
    uint64_t page, span = span_of(p, &page), va;
    int err = vm_va_alloc(vm, span, &va);
    if (err)
        return err;
    err = vm_map(vm, va, page, span, TARGET_VRAM, 0);
    if (!err)
        err = vm_flush(vm);
    if (err == -E_REFUSED)
        err = 0;
    p->refused = vm->refused;
    if (!err) {
        uint64_t at = va + (p->addr - page);
        bar_fault_pending(p->g, unit);
        read_bytes(p->data, at, p->len, rd_bar, &bar);
        p->faulted = bar_fault_pending(p->g, unit);
        p->have_data = 1;
        for (uint64_t i = 0; i + 4 <= p->len; i += 4)
            plat_wr32(bar, at + i, PROBE_MARKER);
        p->wrote = !bar_fault_pending(p->g, unit);
        p->faulted |= !p->wrote;
    }
    vm_unmap(vm, va, span);
    vm_flush(vm);
    vm_va_free(vm, va);
    return err;
}

static int probe_pramin(struct probe *p)
{
    read_bytes(p->data, p->addr, p->len, rd_pramin, p->g);
    p->have_data = 1;
    for (uint64_t i = 0; i + 4 <= p->len; i += 4)
        pramin_wr32(p->g, p->addr + i, PROBE_MARKER);
    p->wrote = 1;
    return 0;
}

/* GP_GET and GP_PUT of the probe channel's USERD page, read through its poll page. */
static uint64_t read_gp(const struct channel *ch)
{
    return plat_rd64(BAR1, ch->userd_bar1 + USERD_GP_GET);
}

static int probe_ramin(struct probe *p)
{
    static struct channel ch;
    static const unsigned bar1 = BAR1;
    if ((p->addr & (PAGE_SIZE - 1)) + p->len > PAGE_SIZE)
        p->len = PAGE_SIZE - (p->addr & (PAGE_SIZE - 1));
    int err = channel_create(&ch, p->g, 1, p->addr);
    if (err)
        return err;
    bar_fault_pending(p->g, FAULT_UNIT_BAR1);
    read_bytes(p->data, ch.userd_bar1 + (p->addr & (PAGE_SIZE - 1)), p->len, rd_bar, &bar1);
    uint64_t gp_before = read_gp(&ch);
    p->have_data = 1;
    p->faulted = bar_fault_pending(p->g, FAULT_UNIT_BAR1);
    uint32_t seq;
    err = channel_fence(&ch, &seq);  /* the doorbell stores GP_PUT at the page + 0x8c */
    if (!err) {
        err = channel_wait_timeout(&ch, seq, PROBE_WAIT_NS);
        p->wrote = !err;
        if (err == -E_FAULT)
            channel_fault_text(&ch, p->fault, sizeof(p->fault));
        if (err == -E_FAULT || err == -E_TIMEDOUT) {
            p->faulted |= err == -E_FAULT;
            err = 0;
        }
    }
    p->changed = read_gp(&ch) != gp_before;
    p->faulted |= bar_fault_pending(p->g, FAULT_UNIT_BAR1);
    channel_destroy(&ch);
    return err;
}

int bench_probe(struct bench_run *r)
{
    static struct probe p;
    uint64_t vector = r->param[0];
    memset(&p, 0, sizeof(p));
    p.addr = r->param[1];
    p.len = r->param[2] > PROBE_MAX_LEN ? PROBE_MAX_LEN : r->param[2];
    rec_add(r, "vector=%s addr=%#lx len=%lu", vector_name(vector), (unsigned long)p.addr,
            (unsigned long)p.len);

    int err = bench_step(r, rt_init(r->bp), "init");
    p.g = rt_gpu();
    if (!err)
        err = bench_step(r, rt_mem_alloc_host((void **)&p.buf, PROBE_MAX_LEN), "pinned buffer");
    if (!err)
        err = bench_step(r, rt_mem_alloc_host((void **)&p.marker, PROBE_MAX_LEN), "pinned marker");
    if (!err) {
        for (unsigned i = 0; i < PROBE_MAX_LEN; i += 4)
            *(uint32_t *)(p.marker + i) = PROBE_MARKER;
    }

    phase_mark(PHASE_LAUNCH);
    if (!err) {
        switch (vector) {
        case PROBE_CHANNEL_PT: err = probe_channel(&p, TARGET_VRAM); break;
        case PROBE_BAR1: err = probe_bar(&p, &p.g->bar1, BAR1, FAULT_UNIT_BAR1); break;
        case PROBE_BAR3: err = probe_bar(&p, &p.g->bar3, BAR3, FAULT_UNIT_BAR3); break;
        case PROBE_PRAMIN: err = probe_pramin(&p); break;
        case PROBE_RAMIN: err = probe_ramin(&p); break;
        case PROBE_SYSRAM: err = probe_channel(&p, TARGET_SYSRAM); break;
        case PROBE_PV_MAP:
            if (GPUVM_PV_BUILD)
                err = probe_channel(&p, TARGET_VRAM);
            else
                r->reason = "pv_map_needs_the_pv_build";
            break;
        default:
            r->reason = "unknown_vector";
        }
        bench_step(r, err, "probe");
    }

    char hex[2 * 16 + 1];
    unsigned shown = p.have_data ? (unsigned)(p.len < 16 ? p.len : 16) : 0;
    for (unsigned i = 0; i < shown; i++)
        fmt(hex + 2 * i, 3, "%02x", p.data[i]);
    hex[2 * shown] = 0;
    rec_add(r, "faulted=%d refused=%u data=%s wrote=%d", p.faulted, p.refused,
            shown ? hex : "-", p.wrote);
    if (vector == PROBE_RAMIN)
        rec_add(r, "changed=%d", p.changed);
    if (p.faulted && (p.fault[0] || rt_fault_text()[0]))
        rec_add(r, "%s", p.fault[0] ? p.fault : rt_fault_text());

    phase_mark(PHASE_CLOSE);
    bench_close(r);
    return bench_finish(r, !r->err);
}
