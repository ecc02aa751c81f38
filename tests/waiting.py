"""Waiting in a test for what another thread does: one poll loop for every test that
needs it, so each says only what it waits for and for how long."""

from __future__ import annotations

import time
from typing import Callable


def wait_for(predicate: Callable[[], object], timeout: float = 10.0) -> bool:
    """Whether `predicate` came true within `timeout` seconds (polled every millisecond,
    and asked once more at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.001)
    return bool(predicate())
