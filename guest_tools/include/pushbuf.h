/* Building method streams in a channel's pushbuffer and submitting them. */
#ifndef GV_PUSHBUF_H
#define GV_PUSHBUF_H

#include <stdint.h>

#include "channel.h"

/* nouveau's nvc0_fence_emit32: header + SEMAPHOREA-D (address hi/lo, sequence, a 16-byte
 * release) + NON_STALL_INTERRUPT */
#define FENCE_WORDS 6
/* nouveau's nouveau_channel_init pads a new channel with this many zero words (no-ops) */
#define NOUVEAU_DMA_SKIPS (128 / 4)

/* Makes room for `words` method words (plus a fence); may wait for the channel. */
int pb_begin(struct channel *ch, unsigned words);
void pb_word(struct channel *ch, uint32_t word);
/* Method headers: incrementing and non-incrementing. */
void pb_mthd(struct channel *ch, unsigned subc, uint32_t mthd, unsigned count);
void pb_mthd_ni(struct channel *ch, unsigned subc, uint32_t mthd, unsigned count);
/* A one-word incrementing method. */
static inline void pb_mthd1(struct channel *ch, unsigned subc, uint32_t mthd, uint32_t v)
{
    pb_mthd(ch, subc, mthd, 1);
    pb_word(ch, v);
}
/* The semaphore release of `seq` and the non-stall interrupt, as nvc0_fence_emit32
 * writes them (FENCE_WORDS words; room is always reserved). */
void pb_fence(struct channel *ch, uint32_t seq);
/* Queues the words written since the last kick as one GPFIFO entry, rings GP_PUT. */
void pb_kick(struct channel *ch);

#endif
