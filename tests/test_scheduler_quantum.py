"""QUANTUM (nvshare's time-quantum lock) on a hand-driven clock: the holder keeps the GPU
for its quantum, hands it over in request order when the quantum is over or when it has
been idle past the grace, and keeps it when nobody else waits."""

from hypothesis import given
from hypothesis import strategies as st

from scheduler import IDLE, Dispatch, QuantumPolicy, SchedulerConfig, SchedulerParams, Wait

MS = 1_000_000
PARAMS = SchedulerParams(quantum_ns=100 * MS, quantum_idle_ns=MS)


def charge_after(policy, vm, now, used):
    assert policy.pick(now) == Dispatch(vm)
    policy.charge(vm, used, now + used)
    return now + used


def test_holder_keeps_the_gpu_for_its_quantum_then_the_next_requester_gets_it():
    q = QuantumPolicy(PARAMS)
    for vm in "ABC":
        q.add_vm(vm, 1, 0)
    q.ready("B", 0, count=100)  # B asks first, then A, then C
    q.ready("A", 0, count=100)
    q.ready("C", 0, count=100)
    now, order = 0, []
    while now < 350 * MS:
        decision = q.pick(now)
        order.append(decision.vm)
        q.charge(decision.vm, 10 * MS, now + 10 * MS)
        now += 10 * MS
    # ten 10 ms kernels per 100 ms quantum, in request order B, A, C, then B again
    assert order == ["B"] * 10 + ["A"] * 10 + ["C"] * 10 + ["B"] * 5
    assert q.handovers == 4


def test_nobody_waiting_the_holder_keeps_the_gpu_past_its_quantum():
    q = QuantumPolicy(PARAMS)
    q.add_vm("A", 1, 0)
    q.add_vm("B", 1, 0)
    q.ready("A", 0, count=30)
    now = 0
    for _ in range(30):
        now = charge_after(q, "A", now, 10 * MS)
    assert q.handovers == 1 and q.pick(now) is IDLE


def test_an_idle_holder_gets_the_grace_then_lets_go_early():
    q = QuantumPolicy(PARAMS)
    q.add_vm("A", 1, 0)
    q.add_vm("B", 1, 0)
    q.ready("A", 0)
    now = charge_after(q, "A", 0, 5 * MS)  # A's quantum runs to 100 ms
    q.ready("B", now, count=2)
    assert q.pick(now) == Wait(now + MS)  # A may resubmit within the grace and keep it
    q.ready("A", now + MS // 2)
    now = charge_after(q, "A", now + MS // 2, 5 * MS)
    assert q.counters["A"].yield_waits == 1
    assert q.pick(now) == Wait(now + MS)
    assert q.pick(now + MS) == Dispatch("B")  # idle past the grace: B, long before 100 ms
    assert q.holder == "B" and q.counters["A"].demotions == 1


def test_removing_the_holder_frees_the_gpu():
    q = QuantumPolicy(PARAMS)
    q.add_vm("A", 1, 0)
    q.add_vm("B", 1, 0)
    q.ready("A", 0)
    q.ready("B", 0)
    assert q.pick(0) == Dispatch("A")
    q.remove_vm("A", 1)
    q.charge("A", 1, 1)  # its last submission ends after removal: accepted, ignored
    assert q.pick(2) == Dispatch("B")


def test_chosen_by_name_with_its_parameters():
    policy = SchedulerConfig.from_dict({"policy": "quantum", "quantum_s": 30,
                                        "quantum_idle_ms": 2}).build()
    assert isinstance(policy, QuantumPolicy)
    assert policy.params.quantum_ns == 30 * 1000 * MS and policy.params.quantum_idle_ns == 2 * MS


@given(st.lists(st.tuples(st.sampled_from("ABC"), st.integers(1, 30)), min_size=1,
                max_size=60))
def test_every_submission_runs_once_and_a_turn_never_outlasts_quantum_plus_a_kernel(subs):
    q = QuantumPolicy(PARAMS)
    for vm in "ABC":
        q.add_vm(vm, 1, 0)
    for vm, _ in subs:
        q.ready(vm, 0)
    lengths = {vm: [ms for v, ms in subs if v == vm] for vm in "ABC"}
    now, turn_start, current, ran = 0, 0, None, []
    while True:
        decision = q.pick(now)
        if decision is IDLE:
            break
        if isinstance(decision, Wait):
            now = decision.until
            continue
        if decision.vm != current:
            current, turn_start = decision.vm, now
        used = lengths[decision.vm].pop(0) * MS
        q.charge(decision.vm, used, now + used)
        ran.append(decision.vm)
        now += used
        others_waiting = any(q.pending(v) for v in "ABC" if v != current)
        if others_waiting:
            assert now - turn_start <= PARAMS.quantum_ns + 30 * MS
    assert sorted(ran) == sorted(vm for vm, _ in subs)
