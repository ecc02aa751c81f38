"""Choosing a policy by name, from code or from an experiment's config table.

    [scheduler]
    policy = "band"
    period_ms = 30
    band_wait_us = 500
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from scheduler.band import BandPolicy
from scheduler.credit import CreditPolicy
from scheduler.fifo import FifoPolicy
from scheduler.params import SchedulerParams
from scheduler.quantum import QuantumPolicy
from scheduler.policy import Policy

POLICIES: dict[str, type[Policy]] = {p.name: p for p in (FifoPolicy, CreditPolicy, BandPolicy,
                                                           QuantumPolicy)}


@dataclass(frozen=True)
class SchedulerConfig:
    """A policy name plus its parameters; `build()` gives a fresh policy object."""

    policy: str = "band"
    params: SchedulerParams = field(default_factory=SchedulerParams)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: unknown scheduler policy {self.policy!r} "
                             f"(known: {', '.join(POLICIES)})")

    @classmethod
    def from_dict(cls, config: Mapping[str, Any]) -> SchedulerConfig:
        """`policy` (default "band") plus SchedulerParams.from_dict keys."""
        rest = dict(config)
        policy = rest.pop("policy", "band")
        if not isinstance(policy, str):
            raise ValueError(f"policy: must be a name, got {policy!r}")
        return cls(policy=policy.lower(), params=SchedulerParams.from_dict(rest))

    def build(self) -> Policy:
        return POLICIES[self.policy](self.params)


def make_policy(name: str, params: SchedulerParams | None = None) -> Policy:
    """A fresh policy by name ("fifo", "credit", "band")."""
    return SchedulerConfig(name.lower() if isinstance(name, str) else name,
                           params or SchedulerParams()).build()
