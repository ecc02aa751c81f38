"""Shadow channels: the instance block (RAMIN) the physical GPU really uses for a guest
channel.

The guest's RAMIN is copied and its pointers translated: the page directory becomes the
shadow directory, USERD becomes a hypervisor page (so the GPU never reads a GP_PUT the
guest wrote behind the scheduler's back), and the graphics-context pointer is confined
to the slice.  Later guest writes into its RAMIN page are reflected by rebuilding.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpuvm.device import layout, regs
from gpuvm.device.vram import Vram
from shadow.entries import EntryPolicy


class ChannelRefused(Exception):
    """The guest's channel cannot be shadowed (e.g. RAMIN outside its slice)."""


@dataclass
class GuestRamin:
    """What the mediator needs from a guest instance block."""

    inst: int  # guest VRAM address
    pd: int | None  # guest VRAM address of the page directory (None: refused/absent)
    words: np.ndarray  # the whole 4 KiB block, u32


def read_guest_ramin(vram: Vram, policy: EntryPolicy, inst: int) -> GuestRamin:
    if not policy.guest_vram_ok(inst, regs.RAMIN_SIZE):
        raise ChannelRefused(f"instance block {inst:#x} is outside the VM's VRAM")
    base = policy.host_vram(inst) >> 2
    words = vram.u32[base:base + regs.RAMIN_SIZE // 4].copy()
    pd_lo, pd_hi = int(words[regs.RAMIN_PD_LO // 4]), int(words[regs.RAMIN_PD_HI // 4])
    pd = layout.ramin_ptr(pd_lo, pd_hi)
    ok = layout.ramin_ptr_target(pd_lo) == regs.TARGET_VRAM and \
        policy.guest_vram_ok(pd, regs.PD_BYTES)
    return GuestRamin(inst, pd if ok else None, words)


def write_shadow_ramin(vram: Vram, guest: GuestRamin, shadow_inst: int, shadow_pd: int,
                       shadow_userd: int, policy: EntryPolicy) -> None:
    """Copy the guest block to shadow_inst with every pointer translated or confined."""
    w = guest.words.copy()
    w[regs.RAMIN_USERD_LO // 4], w[regs.RAMIN_USERD_HI // 4] = layout.ramin_ptr_words(shadow_userd)
    w[regs.RAMIN_PD_LO // 4], w[regs.RAMIN_PD_HI // 4] = layout.ramin_ptr_words(shadow_pd)
    ctx_lo = int(w[regs.RAMIN_GRCTX_LO // 4])
    ctx = layout.ramin_ptr(ctx_lo, int(w[regs.RAMIN_GRCTX_HI // 4]))
    if ctx and policy.guest_vram_ok(ctx, regs.SMALL_PAGE):
        w[regs.RAMIN_GRCTX_LO // 4], w[regs.RAMIN_GRCTX_HI // 4] = \
            layout.ramin_ptr_words(policy.host_vram(ctx), layout.ramin_ptr_flags(ctx_lo))
    else:
        w[regs.RAMIN_GRCTX_LO // 4] = w[regs.RAMIN_GRCTX_HI // 4] = 0
    vram.u32[shadow_inst >> 2:(shadow_inst >> 2) + regs.RAMIN_SIZE // 4] = w
