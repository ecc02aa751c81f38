"""The emulator against itself: a point measured twice the same way, beside the model.

The validation table holds the model to the fastest repetition of each point.  On the
lent machines a point measured again by the same procedure minutes later comes out
differently, so before a miss is read as the model's, it is worth knowing how far the
emulator misses itself there.  A bundle's repetitions are split by parity -- the even
ones and the odd ones, taken by turns, so the machine's drift reaches both halves alike
-- and with each half as the reference:

- `other_pct`: the other half's fastest run against the reference's fastest -- the
  emulator predicting the point from its own second measurement;
- `model_pct`: the model's replay of the other half's fastest trace (with the profile
  the whole bundle fitted) against the reference's fastest -- the model predicting it
  from that same second measurement's trace.

Each half has half the repetitions, so both are noisier than the table's errors.  That
they are measured alike is the point: where the other half misses a point by more than
the goal, no prediction of that point can be held to the goal either; where the other
half is close and the model is not, the miss is the model's.

Run over the thirteen bundles of 2026-11-26 (`gpuvm calibrate --emulator --from ...`),
the other half had every point within 10% in none of the 26 halves
(docs/model-validation.md, "The emulator against itself").
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, Sequence

from gpuvm.calibrate.emulator import GOAL_ERROR_PCT

HALVES = 2  # even and odd repetitions


class Repetition(Protocol):
    """What a half is made of (gpuvm.calibrate.validation.Measured is one)."""

    mode: str
    vms: int
    rep: int
    makespan_ns: int
    trace: Mapping


@dataclass(frozen=True)
class HalfPick:
    """One (mode, VMs) point with one half as its reference: what the other half says
    about it, and the repetition whose replay is the model's prediction."""

    mode: str
    vms: int
    reference: int  # 0: the even repetitions; 1: the odd
    reference_ns: int  # the reference half's fastest makespan
    other_ns: int  # the other half's fastest makespan
    replay: Repetition  # the other half's run of this point with its fastest trace


@dataclass(frozen=True)
class HalfPoint:
    mode: str
    vms: int
    reference: int
    other_pct: float  # the other half's fastest run against the reference's, %
    model_pct: float  # the model from the other half's fastest trace against it, %


def picks(measured: Sequence[Repetition], trace_ns: Callable[[Mapping], int]
          ) -> list[HalfPick]:
    """Per point and reference half, where the other half ran it too: the makespans to
    compare and the repetition to replay (the other half's of this point whose trace --
    one per mode and repetition -- took the least time, `trace_ns`).  A point measured
    in one half only has none."""
    out = []
    for mode, vms in sorted({(m.mode, m.vms) for m in measured}):
        runs = [m for m in measured if (m.mode, m.vms) == (mode, vms)]
        for reference in range(HALVES):
            mine = [m for m in runs if m.rep % HALVES == reference]
            other = [m for m in runs if m.rep % HALVES != reference]
            if not mine or not other:
                continue
            replay = min(other, key=lambda m: (trace_ns(m.trace), m.rep))
            out.append(HalfPick(mode, vms, reference, min(m.makespan_ns for m in mine),
                                min(m.makespan_ns for m in other), replay))
    return out


def points(chosen: Sequence[HalfPick], model_ns: Callable[[Repetition], int]
           ) -> list[HalfPoint]:
    """The picks with the model's makespan of each one's replay (`model_ns`)."""
    return [HalfPoint(p.mode, p.vms, p.reference,
                      100 * (p.other_ns / p.reference_ns - 1),
                      100 * (model_ns(p.replay) / p.reference_ns - 1)) for p in chosen]


@dataclass(frozen=True)
class HalvesScore:
    """How often the other half, and the model, had every point of a reference half
    within the goal, and how many points they had within it in all."""

    halves: int  # reference halves with every point of the bundle
    other_all_within: int
    model_all_within: int
    points: int
    other_within: int
    model_within: int
    other_mean_abs_pct: float
    model_mean_abs_pct: float


def score(per_bundle: Sequence[Sequence[HalfPoint]]) -> HalvesScore:
    """The halves of every bundle together (a half counts where it has all of its
    bundle's points: a point run in one half only leaves that half out)."""
    halves = other_all = model_all = 0
    every = [p for half_points in per_bundle for p in half_points]
    for half_points in per_bundle:
        keys = {(p.mode, p.vms) for p in half_points}
        for reference in range(HALVES):
            mine = [p for p in half_points if p.reference == reference]
            if not mine or len(mine) < len(keys):
                continue
            halves += 1
            other_all += all(abs(p.other_pct) <= GOAL_ERROR_PCT for p in mine)
            model_all += all(abs(p.model_pct) <= GOAL_ERROR_PCT for p in mine)
    return HalvesScore(
        halves, other_all, model_all, len(every),
        sum(abs(p.other_pct) <= GOAL_ERROR_PCT for p in every),
        sum(abs(p.model_pct) <= GOAL_ERROR_PCT for p in every),
        statistics.mean(abs(p.other_pct) for p in every) if every else 0.0,
        statistics.mean(abs(p.model_pct) for p in every) if every else 0.0)


def summary(per_bundle: Sequence[Sequence[HalfPoint]]) -> str:
    """One line: the emulator against itself, the model beside it."""
    s = score(per_bundle)
    if not s.points:
        return "the emulator against itself: one repetition per point, no halves to compare"
    goal = f"{GOAL_ERROR_PCT:g}%"
    return (f"the emulator against itself (each half of the repetitions, even and odd, "
            f"against the other's fastest): {s.other_within}/{s.points} points within "
            f"{goal}, mean |difference| {s.other_mean_abs_pct:.1f}%, every point within "
            f"{goal} in {s.other_all_within} of {s.halves} halves; the model from the "
            f"other half's trace: {s.model_within}/{s.points}, mean |error| "
            f"{s.model_mean_abs_pct:.1f}%, every point in {s.model_all_within} of "
            f"{s.halves}")
