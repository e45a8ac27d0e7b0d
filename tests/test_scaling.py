"""The scaling signal's arithmetic (coordinator/scaling.py), on executors as they publish
their latency models: capacity at the SLO, the offered rate, and executors wanted."""

from __future__ import annotations

import dataclasses
import math
import random

from hypothesis import given
from hypothesis import strategies as st

from helpers import fast_settings
from tandem.broker.state import ExecutorInfo
from tandem.coordinator.scaling import (
    LOW_Z,
    Rate,
    Signal,
    capacity_at_slo,
    low_rate,
    surge_rate,
)


def executor(base_ms=20.0, per_item_ms=0.5, max_batch=32, gap_ms=1.0, margin_ms=2.0, **kw):
    """An executor that published this latency model, as the sim model's would be."""
    compute = base_ms + per_item_ms * max_batch
    return ExecutorInfo(
        id=kw.get("id", "e"), model="sim:1", worker="w", state="IDLE", room=max_batch,
        max_batch=max_batch, expires_ms=0, batches=10, tasks=100, l2_depth=0,
        inflight_depth=0, base_ms=base_ms, per_item_ms=per_item_ms, margin_ms=margin_ms,
        rate=max_batch * 1000 / (compute + gap_ms),
        lag_ms=gap_ms + compute + margin_ms + 1.0, extra_ms=kw.get("extra_ms", compute),
    )  # fmt: skip


def test_without_an_slo_capacity_is_the_rate_at_full_batches():
    e = executor()
    assert capacity_at_slo(e, None) == e.rate


def test_a_tight_slo_takes_the_largest_batch_that_still_meets_it():
    e = executor(base_ms=20, per_item_ms=5, max_batch=32, gap_ms=0, margin_ms=0, extra_ms=0)
    # A task waits one cycle, then its batch's lag: (20 + 5b) + (20 + 5b + 1) <= 121 ms.
    b = 8
    assert capacity_at_slo(e, 121) == b * 1000 / (20 + 5 * b)
    assert capacity_at_slo(e, 1) == 1000 / 25  # none meets it: a batch of one
    assert capacity_at_slo(e, 10_000) == e.rate


def test_an_executor_without_a_rate_has_no_capacity_yet():
    assert capacity_at_slo(executor(max_batch=0), None) is None
    assert capacity_at_slo(dataclasses.replace(executor(), rate=0.0), 250) is None


numbers = st.floats(min_value=0, max_value=1e6, allow_nan=False)


@given(numbers, numbers, st.integers(0, 4096), numbers, numbers, numbers, numbers, numbers)
def test_capacity_is_total(base, per_item, max_batch, margin, rate, lag, extra, slo):
    """Whatever an executor published, the capacity is None or a positive finite rate."""
    e = dataclasses.replace(
        executor(), base_ms=base, per_item_ms=per_item, max_batch=max_batch,
        margin_ms=margin, rate=rate, lag_ms=lag, extra_ms=extra,
    )  # fmt: skip
    capacity = capacity_at_slo(e, slo or None)
    assert capacity is None or (math.isfinite(capacity) and capacity > 0)


def test_a_rate_is_measured_over_its_window():
    rate = Rate(2.0)
    assert rate.add(0.0, 0) is None
    assert rate.add(1.0, 100) == 100
    rate.add(2.0, 200)
    assert rate.add(3.0, 500) == 200  # (500 - 100) over the last 2 s
    low = Rate(2.0)
    low.add(0.0, 0)
    low.add(1.0, 100)
    assert low.over(1.0, low_z=2) == 100 - 2 * 10  # two standard deviations of 100 below


@given(st.floats(-1e9, 1e9), st.floats(1e-3, 1e3), st.floats(0, 10))
def test_a_low_rate_is_never_negative_nor_above_the_rate(count, span, z):
    rate = low_rate(count, span, z)
    assert 0 <= rate <= max(count, 0) / span


def signal(**overrides) -> Signal:
    settings = fast_settings("redis://unused", **overrides)
    return Signal(settings)


def feed(sig: Signal, seconds: int, rate: float, start: float = 0, arrived: float = 0, **kw):
    """One sample a second at a steady offered rate; returns the last reading."""
    reading = None
    for t in range(seconds):
        arrived += rate
        reading = sig.update(start + t + 1, arrived=arrived, waiting=0, **kw)
    return reading, start + seconds, arrived


def test_wanted_is_the_offered_rate_with_headroom_over_one_executors_capacity():
    sig = signal(scale_headroom=0.15)
    e = executor()
    reading, *_ = feed(sig, 12, 2000, executors=[e], slo_ms=250)
    assert reading.offered_rps == 2000  # over the long window, read as it is
    assert reading.capacity_rps == capacity_at_slo(e, 250)
    assert reading.wanted == math.ceil(2000 * 1.15 / reading.capacity_rps) == 3


def test_it_rises_at_once_and_falls_only_after_the_window_and_never_flaps():
    sig = signal(scale_headroom=0.15, scale_down_window_s=30)
    e = executor()
    low, t, a = feed(sig, 12, 500, executors=[e], slo_ms=None)
    assert low.wanted == 1
    high, t, a = feed(sig, 3, 3000, start=t, arrived=a, executors=[e], slo_ms=None)
    assert high.wanted == math.ceil(3000 * 1.15 / e.rate)  # within the short window
    wanted = []
    for _ in range(40):  # back to low: held for the window, then down, once
        reading, t, a = feed(sig, 1, 500, start=t, arrived=a, executors=[e], slo_ms=None)
        wanted.append(reading.wanted)
    assert wanted[:25] == [high.wanted] * 25 and wanted[-1] == 1
    assert wanted == sorted(wanted, reverse=True)  # no way back up: no flap
    steady = [feed(sig, 1, 500, start=t + n, arrived=a + 500 * n, executors=[e], slo_ms=None)[0]
              for n in range(60)]  # fmt: skip
    assert {r.wanted for r in steady} == {1}


def test_it_stays_within_min_and_max():
    sig = signal(scale_min_executors=2, scale_max_executors=3)
    assert feed(sig, 5, 0, executors=[executor()], slo_ms=None)[0].wanted == 2
    assert feed(sig, 5, 1e6, start=5, executors=[executor()], slo_ms=None)[0].wanted == 3


def test_demand_with_no_executor_asks_for_one_and_scales_from_the_last_capacity():
    sig = signal()
    reading = sig.update(1.0, arrived=0, waiting=3, executors=[], slo_ms=None)
    assert reading.wanted == 1 and reading.running == 0  # tasks wait: ask for one
    e = executor()
    sig.update(2.0, arrived=3, waiting=3, executors=[e], slo_ms=None)  # learns its capacity
    reading, *_ = feed(sig, 12, 5000, start=2, arrived=3, executors=[], slo_ms=None)
    assert reading.wanted == math.ceil(5000 * 1.15 / e.rate)  # all of them, not just one


def feed_every(sig: Signal, seconds: float, rate: float, t: float, arrived: float, step=0.25, **kw):
    """A sample every `step` s, as the coordinator takes them, at a steady rate."""
    reading = None
    for _ in range(round(seconds / step)):
        t, arrived = t + step, arrived + rate * step
        reading = sig.update(t, arrived=arrived, waiting=0, **kw)
    return reading, t, arrived


def test_a_surge_counts_within_two_readings_and_one_burst_does_not():
    e = executor()
    sig = signal(scale_headroom=0.15)
    low, t, a = feed_every(sig, 12, 500, 0, 0, executors=[e], slo_ms=None)
    assert low.wanted == 1
    # Two readings (0.5 s) into a step from 500 to 3000 tasks/s, the 2 s window has seen
    # a quarter of it; the surge, each of the two intervals far above 500/s, counts it.
    high, t, a = feed_every(sig, 0.5, 3000, t, a, executors=[e], slo_ms=None)
    assert high.offered_rps == low_rate(750, 0.25, LOW_Z)
    assert high.wanted == math.ceil(high.offered_rps * 1.15 / e.rate)
    assert high.wanted > math.ceil((500 * 1.5 + 3000 * 0.5) / 2 * 1.15 / e.rate)

    sig = signal(scale_headroom=0.15)
    _, t, a = feed_every(sig, 12, 500, 0, 0, executors=[e], slo_ms=None)
    a += 2000  # one submit_many of 2,000 tasks: in one interval between readings
    for _ in range(4):  # each reading after it: no surge
        burst, t, a = feed_every(sig, 0.25, 500, t, a, executors=[e], slo_ms=None)
        assert surge_rate(sig.offered.samples) is None
    assert burst.offered_rps == low_rate(2000 + 500 * 2, 2, LOW_Z)  # the 2 s window's


def test_noise_at_a_steady_load_keeps_no_executor_more():
    """Poisson arrivals at a steady 3.2 executors' worth of an 80 tasks/s executor, 4
    readings a second for 10 minutes: ceil(3.2 x 1.15) = 4, and the noise never asks a
    fifth. Read as it is, the 2 s window's rate asks one now and then, and the down
    window would hold each for 30 s."""
    e = executor(base_ms=80, per_item_ms=2.5, max_batch=8, gap_ms=0)
    sig = signal(scale_headroom=0.15, scale_down_window_s=30)
    rng = random.Random(7)
    t, arrived, plain, wanted, plain_fifth = 0.0, 0, Rate(2.0), set(), 0
    while t < 600:
        t += 0.25
        arrived += poisson(rng, 3.2 * e.rate * 0.25)
        reading = sig.update(t, arrived=arrived, waiting=0, executors=[e], slo_ms=None)
        raw = plain.add(t, arrived) or 0.0
        if t > 10:  # once the long window is full
            wanted.add(reading.wanted)
            plain_fifth += math.ceil(raw * 1.15 / e.rate) > 4
    assert wanted == {4}
    assert plain_fifth >= 10


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson count (Knuth's method, in steps of at most 30 so exp() stays exact)."""
    count = 0
    while mean > 0:
        step, mean = min(mean, 30.0), mean - 30.0
        limit, product = math.exp(-step), rng.random()
        while product > limit:
            count += 1
            product *= rng.random()
    return count


@given(
    st.lists(
        st.tuples(st.floats(0, 5), st.floats(-1e12, 1e12), st.integers(0, 10**6)),
        min_size=1,
        max_size=80,
    )
)
def test_any_counters_give_a_reading_within_bounds(steps):
    """Whatever the counters read (a reset that moves them back, readings at one instant,
    huge jumps), the signal gives a finite rate and stays within min and max."""
    sig = signal(scale_min_executors=1, scale_max_executors=9)
    t = 0.0
    for dt, arrived, waiting in steps:
        t += dt
        reading = sig.update(
            t, arrived=arrived, waiting=waiting, executors=[executor()], slo_ms=None
        )
        assert math.isfinite(reading.offered_rps) and reading.offered_rps >= 0
        assert 1 <= reading.wanted <= 9
