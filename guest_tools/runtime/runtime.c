/* The runtime: context, memory, copies, modules, launches, synchronization. */
#include "runtime.h"
#include "lib.h"
#include "platform.h"
#include "pushbuf.h"

#define FI_BAD_HEADER 0xC0000000u    /* method header of type 6, which does not exist */
#define FI_BAD_CLASS 0xBEEFu         /* a class the GPU does not have */
#define FI_BAD_MAGIC 0xBAADC0DEu

struct devmem {
    uint64_t va, vram, size;
};

/* A host allocation the runtime knows by id (issue 16): pageable ones from rt_host_alloc,
 * pinned ones point at their slot in rt.pinned. */
struct tracked {
    void *virt;
    uint64_t size;
    uint32_t id;
    int slot;  /* index in rt.pinned, or -1 when pageable */
};

static struct {
    int up;
    struct gpu gpu;
    struct channel ch;
    struct hostmem bounce;
    uint64_t cb;
    struct devmem dev[RT_MAX_DEV];
    struct hostmem pinned[RT_MAX_PINNED];
    uint32_t pinned_id[RT_MAX_PINNED];
    /* host memory (issue 16): events for the VMM, chunked pinning, the pin policy */
    int report, pin_chunks;
    uint64_t chunk_bytes, window;
    struct gpuvm_hostmem_event *event;  /* in guest RAM: the VMM reads it there */
    struct tracked tracked[RT_MAX_TRACKED];
    uint32_t next_id;
    unsigned pin_policy;
    uint64_t hot_mask;
    uint64_t ram_before;
    uint64_t vram_left, ram_left;
    char fault[256];
} rt;

struct gpu *rt_gpu(void) { return &rt.gpu; }
struct channel *rt_channel(void) { return &rt.ch; }
const char *rt_fault_text(void) { return rt.fault; }
uint64_t rt_vram_leak(void) { return rt.vram_left; }
uint64_t rt_ram_leak(void) { return rt.ram_left; }

/* Tells the VMM about one host-memory event (nothing unless reporting is on). */
static void hm_event(uint32_t op, uint32_t arg, uint32_t id, uint64_t gpa, uint64_t bytes)
{
    if (!rt.event)
        return;
    rt.event->op = op;
    rt.event->arg = arg;
    rt.event->alloc = id;
    rt.event->pad = 0;
    rt.event->gpa = gpa;
    rt.event->bytes = bytes;
    plat_out(PORT_HOSTMEM, (uint32_t)plat_virt_to_phys(rt.event));
}

/* The id of the allocation holding [p, p+bytes), 0 when the runtime did not hand it out. */
static uint32_t alloc_id(const void *p, uint64_t bytes)
{
    for (unsigned i = 0; i < RT_MAX_TRACKED; i++) {
        const char *base = rt.tracked[i].virt;
        if (base && (const char *)p >= base && (const char *)p + bytes <= base + rt.tracked[i].size)
            return rt.tracked[i].id;
    }
    for (unsigned i = 0; i < RT_MAX_PINNED; i++) {
        const char *base = rt.pinned[i].virt;
        if (base && (const char *)p >= base && (const char *)p + bytes <= base + rt.pinned[i].size)
            return rt.pinned_id[i];
    }
    return 0;
}

/* Remembers an allocation under `id` (a pinned one already got its id from
 * rt_mem_alloc_host). */
static struct tracked *track(void *p, uint64_t size, int slot, uint32_t id)
{
    for (unsigned i = 0; i < RT_MAX_TRACKED; i++) {
        struct tracked *t = &rt.tracked[i];
        if (!t->virt) {
            t->virt = p;
            t->size = size;
            t->id = id;
            t->slot = slot;
            return t;
        }
    }
    return NULL;
}

static struct tracked *tracked_at(const void *p)
{
    for (unsigned i = 0; i < RT_MAX_TRACKED; i++)
        if (p && rt.tracked[i].virt == p)
            return &rt.tracked[i];
    return NULL;
}

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
    rt.report = (bp->flags & BOOT_FLAG_HOSTMEM_REPORT) != 0;
    rt.pin_chunks = (bp->flags & BOOT_FLAG_PIN_CHUNKS) != 0;
    unsigned shift = (unsigned)(bp->flags >> BOOT_PIN_CHUNK_SHIFT) & BOOT_PIN_CHUNK_MASK;
    rt.chunk_bytes = 1ull << (shift ? shift : HM_DEFAULT_CHUNK_SHIFT);
    if (rt.chunk_bytes < PAGE_SIZE)
        rt.chunk_bytes = PAGE_SIZE;
    if (rt.report && !(rt.event = ram_alloc(sizeof(*rt.event))))
        return -E_NOMEM;
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
    /* chunked pinning maps each chunk (page-rounded) at one reserved VA window */
    if (!err && rt.pin_chunks)
        err = vm_va_alloc(&rt.ch.vm, rt.chunk_bytes + PAGE_SIZE, &rt.window);
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
    for (unsigned i = 0; i < RT_MAX_TRACKED; i++)
        if (rt.tracked[i].virt)
            rt_host_free(rt.tracked[i].virt);
    for (unsigned i = 0; i < RT_MAX_PINNED; i++)
        if (rt.pinned[i].virt)
            hostmem_free(&rt.ch.vm, &rt.pinned[i]);
    if (rt.window)
        vm_va_free(&rt.ch.vm, rt.window);
    if (rt.ch.gpu) {
        hostmem_free(&rt.ch.vm, &rt.bounce);
        channel_destroy(&rt.ch);
    }
    gpu_fini(&rt.gpu);
    if (rt.event)
        ram_free(rt.event);
    rt.event = NULL;
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
            if (!err) {
                *p = rt.pinned[i].virt;
                rt.pinned_id[i] = ++rt.next_id;
                hm_event(HM_ALLOC, 1, rt.pinned_id[i], rt.pinned[i].phys, rt.pinned[i].size);
                hm_event(HM_PIN, 1, rt.pinned_id[i], rt.pinned[i].phys, rt.pinned[i].size);
            }
            return err;
        }
    }
    return -E_NOMEM;
}

int rt_mem_free_host(void *p)
{
    for (unsigned i = 0; i < RT_MAX_PINNED; i++) {
        if (p && rt.pinned[i].virt == p) {
            hm_event(HM_UNPIN, 1, rt.pinned_id[i], rt.pinned[i].phys, rt.pinned[i].size);
            hm_event(HM_FREE, 1, rt.pinned_id[i], rt.pinned[i].phys, rt.pinned[i].size);
            hostmem_free(&rt.ch.vm, &rt.pinned[i]);
            rt.pinned_id[i] = 0;
            return 0;
        }
    }
    return -E_INVAL;
}

void rt_pin_policy(unsigned policy, uint64_t hot_mask)
{
    rt.pin_policy = policy;
    rt.hot_mask = hot_mask;
}

/* The smart-pinning allocator: allocation ids are handed out in call order (the same
 * program makes the same calls in the same order, so the ids of a profile run name the
 * same allocations in the next run); RT_PIN_HOT pins the ids set in the hot mask. */
int rt_host_alloc(void **p, uint64_t bytes)
{
    uint32_t next = rt.next_id + 1;
    int pin = rt.pin_policy == RT_PIN_ALL ||
              (rt.pin_policy == RT_PIN_HOT && next <= 64 && (rt.hot_mask >> (next - 1) & 1));
    if (pin) {
        int err = rt_mem_alloc_host(p, bytes);
        if (err)
            return err;
        for (unsigned i = 0; i < RT_MAX_PINNED; i++)
            if (rt.pinned[i].virt == *p &&
                !track(*p, rt.pinned[i].size, (int)i, rt.pinned_id[i])) {
                rt_mem_free_host(*p);
                return -E_NOMEM;
            }
        return 0;
    }
    void *m = ram_alloc(bytes);
    if (!m)
        return -E_NOMEM;
    struct tracked *t = track(m, ALIGN_UP(bytes, PAGE_SIZE), -1, next);
    if (!t) {
        ram_free(m);
        return -E_NOMEM;
    }
    rt.next_id = next;
    hm_event(HM_ALLOC, 0, t->id, plat_virt_to_phys(m), t->size);
    *p = m;
    return 0;
}

int rt_host_free(void *p)
{
    struct tracked *t = tracked_at(p);
    if (!t)
        return -E_INVAL;
    int err = 0;
    if (t->slot >= 0)
        err = rt_mem_free_host(p);
    else {
        hm_event(HM_FREE, 0, t->id, plat_virt_to_phys(p), t->size);
        ram_free(p);
    }
    t->virt = NULL;
    return err;
}

/* Pageable memory copied the way a hypervisor or proxy pins it: per chunk, the chunk's
 * guest pages are pinned (reported to the VMM), mapped into the GPU at the window, copied
 * and unmapped again.  The chunk grid starts at the user's pointer. */
static int copy_chunks(uint64_t dev, char *host, uint64_t bytes, int to_host)
{
    for (uint64_t off = 0; off < bytes; off += rt.chunk_bytes) {
        uint64_t n = bytes - off < rt.chunk_bytes ? bytes - off : rt.chunk_bytes;
        uint64_t pa = plat_virt_to_phys(host + off);
        uint64_t pa0 = pa & ~(uint64_t)(PAGE_SIZE - 1);
        uint64_t len = ALIGN_UP(pa + n, PAGE_SIZE) - pa0;
        hm_event(HM_PIN, (uint32_t)to_host, 0, pa0, len);
        int err = vm_map(&rt.ch.vm, rt.window, pa0, len, TARGET_SYSRAM, 0);
        if (!err)
            err = vm_flush(&rt.ch.vm);
        uint64_t va = rt.window + (pa - pa0);
        if (!err)
            err = to_host ? rt_copy_va(va, dev + off, n) : rt_copy_va(dev + off, va, n);
        int uerr = vm_unmap(&rt.ch.vm, rt.window, len);
        int ferr = vm_flush(&rt.ch.vm);
        hm_event(HM_UNPIN, (uint32_t)to_host, 0, pa0, len);
        if (err || (err = uerr) || (err = ferr))
            return err;
    }
    return 0;
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
    uint32_t how = va ? HM_HOW_PINNED : rt.pin_chunks ? HM_HOW_CHUNKS : HM_HOW_STAGED;
    hm_event(HM_HTOD, how, alloc_id(src, bytes), plat_virt_to_phys(src), bytes);
    if (va)
        return rt_copy_va(dst, va, bytes);
    if (rt.pin_chunks)
        return copy_chunks(dst, (char *)src, bytes, 0);
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
    uint32_t how = va ? HM_HOW_PINNED : rt.pin_chunks ? HM_HOW_CHUNKS : HM_HOW_STAGED;
    hm_event(HM_DTOH, how, alloc_id(dst, bytes), plat_virt_to_phys(dst), bytes);
    if (va)
        return rt_copy_va(va, src, bytes);
    if (rt.pin_chunks)
        return copy_chunks(src, dst, bytes, 1);
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
