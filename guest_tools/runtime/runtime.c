/* The runtime: context, memory, copies, modules, launches, synchronization. */
#include "runtime.h"
#include "lib.h"
#include "pushbuf.h"

#define FI_BAD_HEADER 0xC0000000u    /* method header of type 6, which does not exist */
#define FI_BAD_CLASS 0xBEEFu         /* a class the GPU does not have */
#define FI_BAD_MAGIC 0xBAADC0DEu

struct devmem {
    uint64_t va, vram, size;
};

static struct {
    int up;
    struct gpu gpu;
    struct channel ch;
    struct hostmem bounce;
    uint64_t cb;
    struct devmem dev[RT_MAX_DEV];
    struct hostmem pinned[RT_MAX_PINNED];
    uint64_t ram_before;
    uint64_t vram_left, ram_left;
    char fault[256];
} rt;

struct gpu *rt_gpu(void) { return &rt.gpu; }
struct channel *rt_channel(void) { return &rt.ch; }
const char *rt_fault_text(void) { return rt.fault; }
uint64_t rt_vram_leak(void) { return rt.vram_left; }
uint64_t rt_ram_leak(void) { return rt.ram_left; }

/* Remembers the first fault's description (the registers are read once). */
static int check(int err)
{
    if (err == -E_FAULT && !rt.fault[0])
        channel_fault_text(&rt.ch, rt.fault, sizeof(rt.fault));
    return err;
}

static int wait_idle(void)
{
    return check(channel_sync(&rt.ch));
}

/*
 * Queues copy-engine launches for [src, src+bytes) -> dst (GPU VAs), the way nouveau's
 * nvc0_bo_move_copy does: lines of one page (pitch = line), at most COPY_YCNT_MASK lines
 * per launch, EXEC = SRC_LINEAR | DST_LINEAR (0x110); a tail shorter than a page is one
 * line.  With `fence`, the last launch also carries the channel's next fence the way
 * Gdev's nvc0_memcpy_pcopy0 and nvc0_fence_write do: the copy engine's query (address,
 * counter) names the fence, and EXEC 0x3110 (QUERY | QUERY_SHORT) writes it once the
 * copy is done.  *fence is then the sequence to wait for (0 if nothing was queued).
 */
static int copy_async(uint64_t dst, uint64_t src, uint64_t bytes, uint32_t *fence)
{
    if (fence)
        *fence = 0;
    while (bytes) {
        uint32_t line = PAGE_SIZE, lines;
        if (bytes >= PAGE_SIZE) {
            uint64_t pages = bytes / PAGE_SIZE;
            lines = pages > COPY_YCNT_MASK ? COPY_YCNT_MASK : (uint32_t)pages;
        } else {
            line = (uint32_t)bytes;
            lines = 1;
        }
        uint64_t n = (uint64_t)line * lines;
        int last = fence && n == bytes;
        int err = pb_begin(&rt.ch, 15);
        if (err)
            return check(err);
        if (last) {
            *fence = ++rt.ch.seq;
            pb_mthd(&rt.ch, SUBC_COPY, COPY_QUERY_ADDR_HI, 3);
            pb_word(&rt.ch, (uint32_t)(rt.ch.fence.va >> 32));
            pb_word(&rt.ch, (uint32_t)rt.ch.fence.va);
            pb_word(&rt.ch, *fence);
        }
        pb_mthd(&rt.ch, SUBC_COPY, COPY_SRC_HI, 8);
        pb_word(&rt.ch, (uint32_t)(src >> 32));
        pb_word(&rt.ch, (uint32_t)src);
        pb_word(&rt.ch, (uint32_t)(dst >> 32));
        pb_word(&rt.ch, (uint32_t)dst);
        pb_word(&rt.ch, line);   /* COPY_PITCH_IN */
        pb_word(&rt.ch, line);   /* COPY_PITCH_OUT */
        pb_word(&rt.ch, line);   /* COPY_LINE_BYTES (XCNT) */
        pb_word(&rt.ch, lines);  /* COPY_LINE_COUNT (YCNT) */
        pb_mthd1(&rt.ch, SUBC_COPY, COPY_LAUNCH, last ? COPY_LAUNCH_GDEV : COPY_LAUNCH_NOUVEAU);
        rt.gpu.stats.copies++;
        rt.gpu.stats.copy_bytes += n;
        src += n;
        dst += n;
        bytes -= n;
    }
    return 0;
}

int rt_copy_va(uint64_t dst, uint64_t src, uint64_t bytes)
{
    uint32_t seq;
    int err = copy_async(dst, src, bytes, &seq);
    if (err)
        return err;
    if (!seq)
        return wait_idle();
    pb_kick(&rt.ch);
    return check(channel_wait(&rt.ch, seq));
}

static int inject_init_faults(void)
{
    struct channel *ch = &rt.ch;
    int err = 0;
    if (rt.gpu.fi == FI_BAD_METHOD && !(err = pb_begin(ch, 1))) {
        con_puts("fault injection: a method header of a type that does not exist");
        pb_word(ch, FI_BAD_HEADER);
    } else if (rt.gpu.fi == FI_UNKNOWN_CLASS) {
        con_printf("fault injection: binding class %#x", FI_BAD_CLASS);
        err = channel_bind(ch, 2, FI_BAD_CLASS, ENGINE_PGRAPH);
    }
    return err;
}

int rt_init(const struct gpuvm_boot_params *bp)
{
    memset(&rt, 0, sizeof(rt));
    rt.ram_before = ram_used();
    rt.up = 1;
    int err = gpu_init(&rt.gpu, bp);
    if (!err)
        err = channel_create(&rt.ch, &rt.gpu, 0, 0);
    if (!err)
        err = channel_bind(&rt.ch, SUBC_COMPUTE, CLASS_COMPUTE, ENGINE_PGRAPH);
    if (!err)
        err = channel_bind(&rt.ch, SUBC_COPY, CLASS_COPY, ENGINE_PCOPY0);
    if (!err)
        err = inject_init_faults();
    if (!err)
        err = hostmem_alloc(&rt.ch.vm, RT_BOUNCE_BYTES, &rt.bounce);
    if (!err)
        err = rt_mem_alloc(&rt.cb, RT_CB_BYTES);
    if (!err)
        err = wait_idle();
    return err;
}

int rt_close(void)
{
    if (!rt.up)
        return 0;
    for (unsigned i = 0; i < RT_MAX_DEV; i++)
        if (rt.dev[i].size)
            rt_mem_free(rt.dev[i].va);
    for (unsigned i = 0; i < RT_MAX_PINNED; i++)
        if (rt.pinned[i].virt)
            hostmem_free(&rt.ch.vm, &rt.pinned[i]);
    if (rt.ch.gpu) {
        hostmem_free(&rt.ch.vm, &rt.bounce);
        channel_destroy(&rt.ch);
    }
    gpu_fini(&rt.gpu);
    rt.vram_left = rt.gpu.vram.end ? range_used(&rt.gpu.vram) : 0;
    rt.ram_left = ram_used() - rt.ram_before;
    rt.up = 0;
    return rt.vram_left || rt.ram_left ? -E_NOMEM : 0;
}

int rt_mem_alloc(uint64_t *dptr, uint64_t bytes)
{
    struct devmem *d = NULL;
    for (unsigned i = 0; i < RT_MAX_DEV && !d; i++)
        if (!rt.dev[i].size)
            d = &rt.dev[i];
    if (!d || !bytes)
        return -E_NOMEM;
    uint64_t size = ALIGN_UP(bytes, PAGE_SIZE);
    int err = vram_alloc(&rt.gpu, size, PAGE_SIZE, &d->vram);
    if (err)
        return err;
    if ((err = vm_va_alloc(&rt.ch.vm, size, &d->va))) {
        vram_free(&rt.gpu, d->vram);
        return err;
    }
    if ((err = vm_map(&rt.ch.vm, d->va, d->vram, size, TARGET_VRAM, 0)) ||
        (err = vm_flush(&rt.ch.vm))) {
        vm_unmap(&rt.ch.vm, d->va, size);
        vm_va_free(&rt.ch.vm, d->va);
        vram_free(&rt.gpu, d->vram);
        return err;
    }
    d->size = size;
    *dptr = d->va;
    return 0;
}

int rt_mem_free(uint64_t dptr)
{
    for (unsigned i = 0; i < RT_MAX_DEV; i++) {
        struct devmem *d = &rt.dev[i];
        if (d->size && d->va == dptr) {
            int err = vm_unmap(&rt.ch.vm, d->va, d->size);
            int ferr = vm_flush(&rt.ch.vm);
            vm_va_free(&rt.ch.vm, d->va);
            vram_free(&rt.gpu, d->vram);
            d->size = 0;
            return err ? err : ferr;
        }
    }
    return -E_INVAL;
}

int rt_mem_alloc_host(void **p, uint64_t bytes)
{
    for (unsigned i = 0; i < RT_MAX_PINNED; i++) {
        if (!rt.pinned[i].virt) {
            int err = hostmem_alloc(&rt.ch.vm, bytes, &rt.pinned[i]);
            if (!err)
                *p = rt.pinned[i].virt;
            return err;
        }
    }
    return -E_NOMEM;
}

int rt_mem_free_host(void *p)
{
    for (unsigned i = 0; i < RT_MAX_PINNED; i++) {
        if (p && rt.pinned[i].virt == p) {
            hostmem_free(&rt.ch.vm, &rt.pinned[i]);
            return 0;
        }
    }
    return -E_INVAL;
}

/* The GPU VA of a pinned host range, or 0 when it is (partly) pageable. */
uint64_t rt_host_va(const void *p, uint64_t bytes)
{
    for (unsigned i = 0; i < RT_MAX_PINNED; i++) {
        const struct hostmem *m = &rt.pinned[i];
        const char *base = m->virt;
        if (base && (const char *)p >= base && (const char *)p + bytes <= base + m->size)
            return m->va + (uint64_t)((const char *)p - base);
    }
    return 0;
}

int rt_memcpy_htod(uint64_t dst, const void *src, uint64_t bytes)
{
    uint64_t va = rt_host_va(src, bytes);
    if (rt.gpu.fi == FI_UNMAPPED_COPY) {
        con_printf("fault injection: copying from unmapped GPU VA %#x", RT_UNMAPPED_VA);
        return rt_copy_va(dst, RT_UNMAPPED_VA, bytes);
    }
    if (va)
        return rt_copy_va(dst, va, bytes);
    for (uint64_t off = 0; off < bytes; off += RT_BOUNCE_BYTES) {
        uint64_t n = bytes - off < RT_BOUNCE_BYTES ? bytes - off : RT_BOUNCE_BYTES;
        memcpy(rt.bounce.virt, (const char *)src + off, n);
        int err = rt_copy_va(dst + off, rt.bounce.va, n);
        if (err)
            return err;
    }
    return 0;
}

int rt_memcpy_dtoh(void *dst, uint64_t src, uint64_t bytes)
{
    uint64_t va = rt_host_va(dst, bytes);
    if (va)
        return rt_copy_va(va, src, bytes);
    for (uint64_t off = 0; off < bytes; off += RT_BOUNCE_BYTES) {
        uint64_t n = bytes - off < RT_BOUNCE_BYTES ? bytes - off : RT_BOUNCE_BYTES;
        int err = rt_copy_va(rt.bounce.va, src + off, n);
        if (err)
            return err;
        memcpy((char *)dst + off, rt.bounce.virt, n);
    }
    return 0;
}

int rt_module_load(struct rt_module *m, uint32_t kernel, uint32_t param_words,
                   const char *name)
{
    int err = rt_mem_alloc(&m->code, KOBJ_HEADER_BYTES);
    if (err)
        return err;
    m->kernel = kernel;
    m->param_words = param_words;
    uint32_t *obj = rt.bounce.virt;
    memset(obj, 0, KOBJ_HEADER_BYTES);
    obj[KOBJ_OFF_MAGIC / 4] = rt.gpu.fi == FI_BAD_KERNEL ? FI_BAD_MAGIC : KOBJ_MAGIC;
    obj[KOBJ_OFF_VERSION / 4] = KOBJ_VERSION;
    obj[KOBJ_OFF_KERNEL / 4] = kernel;
    obj[KOBJ_OFF_PARAM_WORDS / 4] = param_words;
    char *obj_name = (char *)obj + KOBJ_OFF_NAME;
    for (unsigned i = 0; name[i] && i < KOBJ_HEADER_BYTES - KOBJ_OFF_NAME - 1; i++)
        obj_name[i] = name[i];
    if (rt.gpu.fi == FI_BAD_KERNEL)
        con_printf("fault injection: kernel object %s with magic %#x", name, FI_BAD_MAGIC);
    return rt_copy_va(m->code, rt.bounce.va, KOBJ_HEADER_BYTES);
}

int rt_module_unload(struct rt_module *m)
{
    int err = m->code ? rt_mem_free(m->code) : 0;
    m->code = 0;
    return err;
}

int rt_launch(const struct rt_module *m, struct rt_dim grid, struct rt_dim block,
              const uint32_t *params, uint32_t nwords)
{
    struct channel *ch = &rt.ch;
    if (nwords * 4 > RT_CB_BYTES || nwords != m->param_words)
        return -E_INVAL;
    int err = pb_begin(ch, 20 + nwords);
    if (err)
        return check(err);
    pb_mthd(ch, SUBC_COMPUTE, COMPUTE_CODE_ADDR_HI, 2);
    pb_word(ch, (uint32_t)(m->code >> 32));
    pb_word(ch, (uint32_t)m->code);
    pb_mthd1(ch, SUBC_COMPUTE, COMPUTE_CODE_OFFSET, 0);
    pb_mthd(ch, SUBC_COMPUTE, COMPUTE_CB_SIZE, 3);
    pb_word(ch, RT_CB_BYTES);
    pb_word(ch, (uint32_t)(rt.cb >> 32));
    pb_word(ch, (uint32_t)rt.cb);
    pb_mthd1(ch, SUBC_COMPUTE, COMPUTE_CB_POS, 0);
    if (nwords) {
        pb_mthd_ni(ch, SUBC_COMPUTE, COMPUTE_CB_DATA, nwords);
        for (uint32_t i = 0; i < nwords; i++)
            pb_word(ch, params[i]);
    }
    pb_mthd(ch, SUBC_COMPUTE, COMPUTE_GRID_XY, 2);
    pb_word(ch, grid.y << 16 | grid.x);
    pb_word(ch, grid.z);
    pb_mthd(ch, SUBC_COMPUTE, COMPUTE_BLOCK_XY, 2);
    pb_word(ch, block.y << 16 | block.x);
    pb_word(ch, block.z);
    pb_mthd1(ch, SUBC_COMPUTE, COMPUTE_LAUNCH, 0);
    rt.gpu.stats.launches++;
    uint32_t seq;
    return check(channel_fence(ch, &seq));
}

int rt_synchronize(void)
{
    return check(channel_wait(&rt.ch, rt.ch.seq));
}
