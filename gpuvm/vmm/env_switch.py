"""One on/off switch in the environment, set for a block and restored after.

The VMM's before/after comparisons (KVM's coalesced ring, posted stores in one message)
are switched through environment variables, so VMM processes started inside the block
inherit the choice as the in-process runners see it."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def env_switch(name: str, on: bool) -> Iterator[None]:
    """$name is "1" or "0" inside the block, and as it was (or unset) after."""
    before = os.environ.get(name)
    os.environ[name] = "1" if on else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
