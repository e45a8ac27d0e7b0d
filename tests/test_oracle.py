"""The autoscale profile's oracle (tools/oracle.py): a schedule that meets every deadline,
with no more executors than the arrivals need."""

import heapq

from hypothesis import given, settings
from hypothesis import strategies as st

from tandem.tools import oracle

UNIT = oracle.Executor(base_s=0.08, per_item_s=0.0025, max_batch=8)


def replay(arrivals, counts, slo_s, unit=UNIT):
    """Each task's lateness under `counts` executors a second, by a simulation of its own:
    a free executor takes the oldest waiting tasks at once, up to a batch."""
    free, waiting, late, i = [0.0], [], [], 0
    while i < len(arrivals) or waiting:
        t = free[0]
        n = counts[min(int(t), len(counts) - 1)]
        while len(free) < n:
            heapq.heappush(free, float(int(t)))
        if len(free) > n:
            heapq.heappop(free)  # it finishes its batch and takes no more
            continue
        t = heapq.heappop(free)
        if not waiting:
            t = max(t, arrivals[i])
        while i < len(arrivals) and arrivals[i] <= t:
            waiting.append(arrivals[i])
            i += 1
        batch, waiting = waiting[: unit.max_batch], waiting[unit.max_batch :]
        done = t + unit.batch_s(len(batch))
        late += [done - a - slo_s for a in batch if done - a > slo_s]
        heapq.heappush(free, done)
    return late


def test_a_trickle_needs_one_executor():
    arrivals = [k * 0.5 for k in range(20)]
    assert oracle.plan(arrivals, 10, 1.0, UNIT, 6) == [1] * 10


def test_a_burst_needs_as_many_executors_as_its_deadline_asks():
    # 24 tasks at once, due within two batches' time: three executors at once, then one.
    arrivals = [0.0] * 24
    counts = oracle.plan(arrivals, 3, 2 * UNIT.batch_s(8) - 0.01, UNIT, 6)
    assert counts == [3, 1, 1]
    assert replay(arrivals, counts, 2 * UNIT.batch_s(8) - 0.01) == []


def test_random_arrivals_at_full_capacity_get_a_plan_that_holds():
    import random

    rng, t, arrivals = random.Random(1), 0.0, []
    capacity = UNIT.max_batch / UNIT.batch_s(UNIT.max_batch)
    while t < 30:
        t += rng.expovariate(2 * capacity)
        arrivals.append(t)
    counts = oracle.plan(arrivals, 30, 1.0, UNIT, 6)
    assert 2 <= max(counts) <= 3
    assert replay(arrivals, counts, 1.0) == []
    # One executor fewer, the first second it asks for two, misses a deadline.
    busy = [s for s, n in enumerate(counts) if n > 1]
    fewer = [n - (s == busy[0]) for s, n in enumerate(counts)]
    assert replay(arrivals, fewer, 1.0) != []


def test_executor_seconds_start_each_executor_ahead_of_its_second():
    assert oracle.executor_seconds([1, 1, 2, 2], 0) == 6
    assert oracle.executor_seconds([1, 1, 2, 2], 2) == 8
    assert oracle.executor_seconds([3, 1, 1, 1], 1.5) == 3 + 1 + 1 + 1 + 0 + 2 - 2


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.floats(0, 9.99, allow_nan=False), max_size=300).map(sorted),
    st.floats(0.2, 3.0),
)
def test_every_plan_meets_every_deadline_when_it_can(arrivals, slo_s):
    # With enough executors on hand, the plan meets every deadline, checked by a
    # simulation of its own (which drops the executor free soonest: no kinder).
    counts = oracle.plan(arrivals, 10, slo_s, UNIT, 64)
    assert len(counts) == 10 and all(1 <= n <= 64 for n in counts)
    assert replay(arrivals, counts, slo_s) == []
