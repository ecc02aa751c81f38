/* Channel creation and destruction (PROGRAMMING.md "Channels"), fences and waits. */
#include "channel.h"
#include "lib.h"
#include "pushbuf.h"

#define USERD_USED_BYTES 0x100  /* the words the device reads and writes */

static int fill_ramin(struct channel *ch)
{
    const struct instobj *r = &ch->ramin;
    inst_wr32(r, RAMIN_USERD_LO, ((uint32_t)ch->userd & RAMIN_ADDR_MASK) | TARGET_VRAM);
    inst_wr32(r, RAMIN_USERD_HI, (uint32_t)(ch->userd >> 32));
    inst_wr32(r, RAMIN_SIGNATURE, RAMIN_SIGNATURE_VALUE);
    inst_wr32(r, RAMIN_GPFIFO_LO, (uint32_t)ch->ring.va);
    inst_wr32(r, RAMIN_GPFIFO_HI, CH_RING_LOG2 << RAMIN_GPFIFO_LOG2_SHIFT |
                                  (uint32_t)((ch->ring.va >> 32) & GPFIFO_VA_HI_MASK));
    inst_wr32(r, RAMIN_PD_LO, (uint32_t)ch->vm.pd | TARGET_VRAM);
    inst_wr32(r, RAMIN_PD_HI, (uint32_t)(ch->vm.pd >> 32));
    inst_wr32(r, RAMIN_LIMIT_LO, (uint32_t)ch->vm.limit);
    inst_wr32(r, RAMIN_LIMIT_HI, (uint32_t)(ch->vm.limit >> 32));
    return gpu_bar_flush(ch->gpu);
}

static int map_userd(struct channel *ch)
{
    struct gpu *g = ch->gpu;
    ch->userd_bar1 = BAR1_POLL_VA + ch->id * USERD_STRIDE;
    int err = vm_map(&g->bar1, ch->userd_bar1, ch->userd & ~(uint64_t)(PAGE_SIZE - 1),
                     PAGE_SIZE, TARGET_VRAM, 0);
    if (!err) {
        ch->userd_mapped = 1;
        err = vm_flush(&g->bar1);
    }
    if (err || !ch->userd_owned)
        return err;
    for (uint32_t off = 0; off < USERD_USED_BYTES; off += 8)
        plat_wr64(BAR1, ch->userd_bar1 + off, 0);
    return 0;
}

int channel_create(struct channel *ch, struct gpu *g, unsigned id, uint64_t userd_override)
{
    memset(ch, 0, sizeof(*ch));
    ch->gpu = g;
    ch->id = id;
    if (id >= MAX_CHANNELS)
        return -E_INVAL;
    int err = vm_init(&ch->vm, g, VM_CHANNEL, "channel", CHANNEL_VA_BASE, CH_VM_LIMIT);
    if (err)
        return err;
    if ((err = inst_new(g, RAMIN_SIZE, 1, &ch->ramin)))
        goto fail;
    if (userd_override) {
        ch->userd = userd_override;
    } else {
        if ((err = vram_alloc(g, PAGE_SIZE, PAGE_SIZE, &ch->userd)))
            goto fail;
        ch->userd_owned = 1;
    }
    if ((err = map_userd(ch)) ||
        (err = hostmem_alloc(&ch->vm, CH_RING_ENTRIES * GPFIFO_ENTRY_SIZE, &ch->ring)) ||
        (err = hostmem_alloc(&ch->vm, CH_PB_BYTES, &ch->pb)) ||
        (err = hostmem_alloc(&ch->vm, PAGE_SIZE, &ch->fence)) ||
        (err = fill_ramin(ch)))
        goto fail;

    gpu_wr32(g, PFIFO_CHAN_TABLE + id * PFIFO_CHAN_STRIDE,
             PFIFO_CHAN_VALID | TARGET_VRAM << PFIFO_CHAN_TARGET_SHIFT |
             (uint32_t)(ch->ramin.vram >> 12));
    gpu_wr32(g, PFIFO_CHAN_STATE + id * PFIFO_CHAN_STRIDE, PFIFO_CHAN_STATE_CREATE);
    ch->created = 1;
    g->runnable |= 1u << id;
    if ((err = gpu_runlist_update(g)))
        goto fail;
    /* nouveau_channel_init: the first commands follow NOUVEAU_DMA_SKIPS zero words (they
     * go with the first kick; the pushbuffer is guest RAM, so they cost no exit) */
    for (unsigned i = 0; i < NOUVEAU_DMA_SKIPS; i++)
        pb_word(ch, 0);
    return 0;
fail:
    con_printf("channel %u: create failed (%s)", id, err_name(err));
    channel_destroy(ch);
    return err;
}

void channel_destroy(struct channel *ch)
{
    struct gpu *g = ch->gpu;
    if (!g)
        return;
    if (ch->created) {
        uint32_t state = PFIFO_CHAN_STATE + ch->id * PFIFO_CHAN_STRIDE;
        gpu_wr32(g, state, gpu_rd32(g, state) & ~PFIFO_CHAN_STATE_RUNNABLE);
        gpu_wr32(g, PFIFO_KICK, ch->id);
        gpu_poll(g, PFIFO_KICK, 0xffffffffu, ch->id);
        g->runnable &= ~(1u << ch->id);
        gpu_runlist_update(g);
        gpu_wr32(g, PFIFO_CHAN_TABLE + ch->id * PFIFO_CHAN_STRIDE, 0);
        ch->created = 0;
    }
    hostmem_free(&ch->vm, &ch->fence);
    hostmem_free(&ch->vm, &ch->pb);
    hostmem_free(&ch->vm, &ch->ring);
    if (ch->userd_mapped) {
        vm_unmap(&g->bar1, ch->userd_bar1, PAGE_SIZE);
        vm_flush(&g->bar1);
        ch->userd_mapped = 0;
    }
    if (ch->userd_owned)
        vram_free(g, ch->userd);
    ch->userd = 0;
    ch->userd_owned = 0;
    inst_del(g, &ch->ramin);
    vm_fini(&ch->vm);
    ch->gpu = NULL;
}

int channel_bind(struct channel *ch, unsigned subc, uint32_t cls, uint32_t engine)
{
    int err = pb_begin(ch, 2);
    if (err)
        return err;
    pb_mthd1(ch, subc, HOST_OBJECT, cls | engine << HOST_OBJECT_ENGINE_SHIFT);
    return 0;
}

int channel_fence(struct channel *ch, uint32_t *seq)
{
    int err = pb_begin(ch, 0);
    if (err)
        return err;
    *seq = ++ch->seq;
    pb_fence(ch, *seq);
    pb_kick(ch);
    return 0;
}

static int channel_stopped(struct channel *ch)
{
    struct gpu *g = ch->gpu;
    uint32_t err = gpu_rd32(g, PFIFO_CHAN_ERROR_EXT + ch->id * PFIFO_CHAN_ERROR_STRIDE_EXT);
    if (!(err & PFIFO_CHAN_ERROR_FAULTED_EXT))
        return 0;
    ch->faulted = 1;
    ch->error = err;
    return 1;
}

/*
 * Always sleeps through PORT_WAIT, even when the fence may already have passed: whether
 * it has depends on timing, and the exits a run makes must not.
 *
 * The VMM reports WAIT_FAULT for faults that happen *during* the wait, so a fault that
 * lands between the doorbell and the wait would go unnoticed until the wait timed out:
 * the channel's error word is read before every wait (one BAR0 read, deterministic),
 * and again whenever a wait ends without its fence.  With timeout_ns 0 a wait that hits
 * the VMM's limit while the channel is healthy simply waits again (a long kernel).
 */
int channel_wait_timeout(struct channel *ch, uint32_t seq, uint64_t timeout_ns)
{
    for (;;) {
        if (ch->faulted || channel_stopped(ch))
            return -E_FAULT;
        ch->gpu->stats.waits++;
        uint32_t status = wait_fence(ch->fence.phys, seq, timeout_ns);
        if (status == WAIT_OK) {
            if (seq == ch->seq)
                ch->gp_inflight = 0;
            return 0;
        }
        if (status == WAIT_TIMEOUT && timeout_ns)
            return channel_stopped(ch) ? -E_FAULT : -E_TIMEDOUT;
        /* WAIT_FAULT: this channel or another one of this VM; the loop checks which. */
    }
}

int channel_wait(struct channel *ch, uint32_t seq)
{
    return channel_wait_timeout(ch, seq, 0);
}

int channel_sync(struct channel *ch)
{
    uint32_t seq;
    int err = channel_fence(ch, &seq);
    return err ? err : channel_wait(ch, seq);
}

static const char *chan_err_name(uint32_t reason)
{
    switch (reason) {
    case CHAN_ERR_VM_FAULT_EXT: return "vm_fault";
    case CHAN_ERR_BAD_METHOD_HEADER_EXT: return "bad_method_header";
    case CHAN_ERR_UNKNOWN_CLASS_EXT: return "unknown_class";
    case CHAN_ERR_UNKNOWN_METHOD_EXT: return "unknown_method";
    case CHAN_ERR_BAD_GPFIFO_ENTRY_EXT: return "bad_gpfifo_entry";
    case CHAN_ERR_BAD_KERNEL_OBJECT_EXT: return "bad_kernel_object";
    case CHAN_ERR_SIZE_LIMIT_EXT: return "size_limit";
    case CHAN_ERR_NO_OBJECT_EXT: return "no_object";
    case CHAN_ERR_DMA_TARGET_EXT: return "dma_target";
    case CHAN_ERR_BAD_INSTANCE_EXT: return "bad_instance";
    case CHAN_ERR_TIMEOUT_EXT: return "watchdog";
    default: return "unknown";
    }
}

void channel_fault_text(struct channel *ch, char *buf, unsigned size)
{
    struct gpu *g = ch->gpu;
    uint32_t reason = ch->error & PFIFO_CHAN_ERROR_REASON_MASK_EXT;
    int n = fmt(buf, size, "chan=%u chan_err=%s", ch->id, chan_err_name(reason));
    if (reason != CHAN_ERR_VM_FAULT_EXT)
        return;
    /* Find the fault record naming this channel's instance block, report and clear it. */
    uint32_t units = gpu_rd32(g, PFIFO_FAULT_UNIT_MASK);
    for (unsigned unit = 0; unit < PFIFO_FAULT_UNITS; unit++) {
        if (!(units & (1u << unit)))
            continue;
        uint32_t rec = PFIFO_FAULT_RECORD + unit * PFIFO_FAULT_RECORD_STRIDE;
        if (gpu_rd32(g, rec + PFIFO_FAULT_INST) != (uint32_t)(ch->ramin.vram >> 12))
            continue;
        uint64_t addr = gpu_rd32(g, rec + PFIFO_FAULT_ADDR_LO) |
                        (uint64_t)gpu_rd32(g, rec + PFIFO_FAULT_ADDR_HI) << 32;
        uint32_t flags = gpu_rd32(g, rec + PFIFO_FAULT_FLAGS);
        if (n >= 0 && (unsigned)n < size)
            fmt(buf + n, size - (unsigned)n, " fault_unit=%#x fault_reason=%u fault_addr=%#lx",
                unit, flags & PFIFO_FAULT_FLAGS_REASON_MASK, (unsigned long)addr);
        gpu_wr32(g, PFIFO_FAULT_UNIT_MASK, 1u << unit);
        return;
    }
}
