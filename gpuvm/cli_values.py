"""Values more than one area's command line parses alike, each with the one error line a
bad value gets (`gpuvm calibrate --vms`, `gpuvm model --vms`)."""

from __future__ import annotations

from gpuvm.errors import UserError


def parse_counts(text: str) -> list[int]:
    """'1,8' -> [1, 8]: counts of at least 1, comma-separated."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise UserError(f"bad VM counts {text!r} (want e.g. 1,8)") from None
    if not counts or min(counts) < 1:
        raise UserError(f"bad VM counts {text!r}: each must be at least 1")
    return counts
