/* Pushbuffer: method words written straight into pinned guest RAM; a kick appends one
 * GPFIFO entry and stores GP_PUT through BAR1 (the doorbell, the only exit). */
#include "lib.h"
#include "pushbuf.h"

static uint32_t header(uint32_t type, unsigned subc, uint32_t mthd, unsigned count)
{
    return type << MTHD_TYPE_SHIFT | (count & MTHD_COUNT_MASK) << MTHD_COUNT_SHIFT |
           (subc & MTHD_SUBC_MASK) << MTHD_SUBC_SHIFT | ((mthd >> 2) & MTHD_ADDR_MASK);
}

void pb_word(struct channel *ch, uint32_t word)
{
    *(uint32_t *)((char *)ch->pb.virt + ch->pb_pos) = word;
    ch->pb_pos += 4;
}

void pb_mthd(struct channel *ch, unsigned subc, uint32_t mthd, unsigned count)
{
    pb_word(ch, header(MTHD_TYPE_INC, subc, mthd, count));
}

void pb_mthd_ni(struct channel *ch, unsigned subc, uint32_t mthd, unsigned count)
{
    pb_word(ch, header(MTHD_TYPE_NONINC, subc, mthd, count));
}

void pb_fence(struct channel *ch, uint32_t seq)
{
    pb_mthd(ch, 0, HOST_SEMAPHORE_ADDR_HI, 5);
    pb_word(ch, (uint32_t)(ch->fence.va >> 32));
    pb_word(ch, (uint32_t)ch->fence.va);
    pb_word(ch, seq);
    pb_word(ch, SEM_RELEASE);  /* RELEASE_WFI EN, RELEASE_SIZE 16BYTE */
    pb_word(ch, 0);            /* HOST_NOTIFY_INTR: NON_STALL_INTERRUPT */
}

void pb_kick(struct channel *ch)
{
    if (ch->pb_pos == ch->pb_start)
        return;
    uint64_t va = ch->pb.va + ch->pb_start;
    uint32_t words = (ch->pb_pos - ch->pb_start) / 4;
    uint32_t *entry = (uint32_t *)ch->ring.virt + ch->gp_put * 2;
    entry[0] = (uint32_t)va & ~3u;
    entry[1] = (uint32_t)((va >> 32) & GPFIFO_VA_HI_MASK) | words << GPFIFO_LEN_SHIFT;
    ch->gp_put = (ch->gp_put + 1) & (CH_RING_ENTRIES - 1);
    ch->gp_inflight++;
    ch->pb_start = ch->pb_pos;
    __asm__ volatile("" : : : "memory");  /* entries are in memory before the doorbell */
    plat_wr32(BAR1, ch->userd_bar1 + USERD_GP_PUT, ch->gp_put);
    ch->gpu->stats.doorbells++;
}

int pb_begin(struct channel *ch, unsigned words)
{
    if (ch->faulted)
        return -E_FAULT;
    uint32_t need = (words + FENCE_WORDS) * 4;
    if (need > CH_PB_BYTES / 2)
        return -E_INVAL;
    if (ch->pb_pos + need <= CH_PB_BYTES && ch->gp_inflight + 2 < CH_RING_ENTRIES)
        return 0;
    /* Out of pushbuffer or ring: let the channel drain, then start from the top. */
    uint32_t seq = ++ch->seq;
    pb_fence(ch, seq);
    pb_kick(ch);
    int err = channel_wait(ch, seq);
    if (err)
        return err;
    ch->pb_pos = ch->pb_start = 0;
    return 0;
}
