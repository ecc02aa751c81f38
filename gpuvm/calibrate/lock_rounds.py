"""The lock's timed rounds (gpuvm.calibrate.lock_use) and the same VMs run untimed
(gpuvm.calibrate.untimed_growth), made among the runs they price: one round before each
of the first GROWTH_REPS repetitions, the rest after the last.

Both `gpuvm calibrate --emulator` (before each of its repetitions) and a scaling
experiment that asks for them (`lock_rounds`: before each of its rounds,
gpuvm.experiment.execute's `before_round`) time them this way, so a bundle and a run
directory hold rounds made alike.
"""

from __future__ import annotations

from typing import Callable, Sequence

from gpuvm.calibrate import lock_use, untimed_growth
from gpuvm.calibrate.lock_use import GROWTH_REPS, LockUse
from gpuvm.calibrate.untimed_growth import UntimedRun


class LockRounds:
    """The lock's timed rounds of one sitting or run, where VMs are threads under KVM:
    one before each of its first GROWTH_REPS repetitions (`before_rep`; numbered from
    `first_rep`: a `--more-of` sitting times its own rounds, pooled with its bundle's),
    and after the last (`after`) as many as fewer repetitions left untimed -- pv's runs
    too where `modes` has pv, and fv-opt's beside fv's where it has fv-opt.  `uses` holds
    their runs and `untimed` the same VMs untimed, each labelled with the repetition it
    was timed beside.

    Why GROWTH_REPS rounds every sitting: the growth is a ratio of a few runs' times,
    and more of them price it better -- over eight bundles of 2026-11-27, both rounds
    pooled put 83 of 96 points within 10% (mean |error| 5.5%), either round alone 78
    and 79 (6.3%, 6.0%; scratch `.scratch/ab_rounds.py`); and a one-repetition sitting
    on a lent machine (2026-11-28) timed one round, whose fv-opt 2-VM run of 37.5 us
    per exit against 28.0 priced fv-opt's growth to two VMs at 1.53x, and that sitting
    came within 10% at 6 of 12 points.  Since 2026-11-28 each count's fastest run of
    all the rounds is kept (lock_use.fastest_runs) rather than all pooled: over twelve
    bundles 109 of 144 points within 10%, pooled 100.

    Why before the repetitions, not minutes before or after all of them: the lent
    machine's speed drifts (one VM of fv took 2.4 s, then 2.0 s ten minutes later), and
    two rounds timed up front gave growths of 1.07x/1.24x at 4/8 VMs in one run and
    0.99x/1.15x in the next, the latter's 4- and 8-VM points 9-22% short (runs
    20261126-142007, -142902)."""

    def __init__(self, isolated: bool, modes: Sequence[str], counts: Sequence[int],
                 progress: Callable[[str], None], first_rep: int = 0,
                 untimed_benchmark: untimed_growth.Benchmark | None = None) -> None:
        from gpuvm.calibrate.validation import FIT_VMS
        from gpuvm.vmm.kvm import kvm_usable

        self.uses: list[LockUse] = []
        self.untimed: list[UntimedRun] = []
        self._first_rep = first_rep
        self._last_rep = first_rep  # the last repetition `before_rep` was called for
        self._rounds = 0
        self.among = 0  # the rounds made before a repetition (the rest: after the last)
        self._progress = progress
        self._grown = lock_use.round_counts(counts, FIT_VMS)
        # whether there is a lock to time: VMs as threads, on KVM
        self.times_the_lock = not isolated and kvm_usable()[0]
        self._modes = list(modes)
        # what the untimed VMs run: the runs' own benchmark where given, else the timed
        # rounds' (untimed_growth.untimed_round)
        self._untimed_benchmark = untimed_benchmark

    def before_rep(self, rep: int) -> None:
        """A round before repetition `rep` where it is one of the first GROWTH_REPS."""
        self._last_rep = rep
        if rep - self._first_rep < GROWTH_REPS and self._round(rep):
            self.among += 1

    def after(self) -> None:
        """The rounds fewer than GROWTH_REPS repetitions have not timed, labelled with
        the last."""
        while self.times_the_lock and self._rounds < GROWTH_REPS:
            self._round(self._last_rep)

    def _round(self, rep: int) -> bool:
        """One round labelled `rep`; whether it was made (VMs as threads on KVM)."""
        if not self.times_the_lock:
            return False
        self._rounds += 1
        self.uses.extend(lock_use.timed_round(self._modes, self._grown, rep, self._progress))
        self.untimed.extend(untimed_growth.untimed_round(self._modes, self._grown, rep,
                                                         self._progress,
                                                         self._untimed_benchmark))
        return True
