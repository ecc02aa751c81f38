"""Scheduling of non-preemptive GPU command submission: fair share (FIFO, CREDIT, BAND)
and exclusive time quanta (QUANTUM, for oversubscribed memory).

Clock-agnostic: policies and the Dispatcher take `now` (integer ns) on every call, so
the emulator's mediator drives them from the device clock and the simpy model from
`env.now`.  See policy.py for the protocol and dispatcher.py for the shared driver.
"""

from scheduler.band import BandPolicy
from scheduler.config import POLICIES, SchedulerConfig, make_policy
from scheduler.credit import CreditPolicy
from scheduler.decision import IDLE, Decision, Dispatch, Idle, VmId, Wait
from scheduler.dispatcher import Dispatcher, Running
from scheduler.fifo import FifoPolicy
from scheduler.meter import SlidingWindowMeter
from scheduler.metrics import VmMetrics
from scheduler.params import SchedulerParams
from scheduler.policy import Policy, PolicyCounters
from scheduler.quantum import QuantumPolicy

__all__ = [
    "BandPolicy", "CreditPolicy", "Decision", "Dispatch", "Dispatcher", "FifoPolicy",
    "IDLE", "Idle", "POLICIES", "Policy", "PolicyCounters", "QuantumPolicy", "Running",
    "SchedulerConfig",
    "SchedulerParams", "SlidingWindowMeter", "VmId", "VmMetrics", "Wait", "make_policy",
]
