"""The fleet's size: how many executors each model wants, from what tandem knows.

Under overload tandem refuses at submit what it could not serve in time, so L1 holds
about one SLO's worth of work whatever the demand: its length says how strict the SLO
is, not how many executors are needed. The signal here is demand over capacity:

- offered: every task offered per second, answered or not: completed (success or
  failure, the shed included), refused at submit (Overloaded, QueueFull), and the growth
  of what waits (L1, the retry list, the executors' L2 and in-flight), so tasks that
  plain Celery clients publish count too. It is the largest of its rate over
  LONG_WINDOW_S, its rate over SHORT_WINDOW_S and, in a surge, the lower of its rates
  over the last two intervals between readings: it rises within half a second to two
  and falls slowly. A surge is when each of the last two intervals holds far more tasks
  than the rate before them explains (SURGE_Z standard deviations of a Poisson count);
  asking both, and taking the lower, keeps one burst (a large submit_many, counted in
  one interval) from counting as a change of demand. The short rates are read LOW_Z
  standard deviations low: wanted holds the highest of its readings for
  a whole window, and the highest of many noisy readings is their noise, so unbiased
  short rates would keep an executor more for each peak of noise.
- capacity: what one executor computes per second at the largest batch that still
  meets the model's SLO (a task that arrives just after a claim waits one cycle, then
  its batch's claim-to-result lag), from the latency model it publishes. Without an SLO,
  at its largest batch. The median over the live executors, remembered once they are
  gone, so a model scales from zero by its last known speed.
- wanted: ceil(offered x (1 + headroom) / capacity), at least 1 while anything waits or
  is offered; the highest of the last scale_down_window_s, so it rises at once and falls
  only once the demand stayed lower for the whole window; within min and max.

An executor loading or warming its model has not registered yet: it adds no capacity.
Beside the signal, the devices' busy share: the forward passes' time per second over
LONG_WINDOW_S, per live executor.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from tandem.broker.settings import Settings
from tandem.broker.state import ExecutorInfo

#: The windows the offered rate is measured over: the shorter lets it rise fast.
SHORT_WINDOW_S = 2.0
LONG_WINDOW_S = 10.0
#: A surge: each of the last two intervals between readings this many standard
#: deviations above the SHORT_WINDOW_S before them.
SURGE_Z = 4.0
#: How far below its count a short window's rate is read, in standard deviations.
LOW_Z = 2.0


def capacity_at_slo(executor: ExecutorInfo, slo_ms: float | None) -> float | None:
    """Tasks/s one executor computes at the largest batch whose wait and compute still
    meet slo_ms: one cycle (compute + the gap between computes) waiting for the claim,
    then the batch's lag from claim to stored result (with the pipeline, the compute in
    hand too). None before it has published a rate."""
    if executor.rate <= 0 or executor.max_batch < 1:
        return None
    full = executor.max_batch
    cycle_full = full * 1000 / executor.rate
    gap = max(0.0, cycle_full - (executor.base_ms + executor.per_item_ms * full))

    def cycle(b: int) -> float:
        return max(executor.base_ms + executor.per_item_ms * b + gap, 1e-3)

    def latency(b: int) -> float:
        shorter = executor.per_item_ms * (full - b)
        extra = executor.extra_ms - shorter if executor.extra_ms > 0 else 0.0
        return cycle(b) + executor.lag_ms - shorter + max(0.0, extra)

    best = full
    if slo_ms:
        best = next((b for b in range(full, 0, -1) if latency(b) <= slo_ms), 1)
    capacity = best * 1000 / cycle(best)
    return capacity if 0 < capacity < math.inf else None  # a rate too small to hold


def executors_for(load: float, headroom: float) -> int:
    """Executors for a load in executors' worth of capacity, with headroom over it:
    ceil(load x (1 + headroom)), rounded first so that an exact multiple asks no more."""
    return math.ceil(round(load * (1 + headroom), 6))


def low_rate(count: float, span_s: float, z: float) -> float:
    """A count's rate over span_s, read z standard deviations (of a Poisson count) low."""
    return max(0.0, count - z * math.sqrt(max(count, 0.0))) / span_s


def sample_at(samples: Sequence[tuple[float, float]], t_s: float) -> tuple[float, float] | None:
    """The newest of (t, total) samples, oldest first, taken at or before t_s."""
    return next((sample for sample in reversed(samples) if sample[0] <= t_s), None)


class Rate:
    """The rate of a counter that only grows, over a sliding window of samples; over a
    shorter span of them too (`over`)."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.samples: deque[tuple[float, float]] = deque()

    def add(self, t_s: float, total: float) -> float | None:
        """Add a sample; the rate over the window, or None before a span to measure."""
        self.samples.append((t_s, total))
        while len(self.samples) > 2 and t_s - self.samples[1][0] >= self.window_s:
            self.samples.popleft()  # keeps one at or before the window's start
        return self.over(self.window_s)

    def over(self, span_s: float, low_z: float = 0.0) -> float | None:
        """The rate over the last span_s (or all the samples, if they span less), read
        low_z standard deviations low; None before a span to measure."""
        t1, a1 = self.samples[-1]
        t0, a0 = sample_at(self.samples, t1 - span_s) or self.samples[0]
        return low_rate(a1 - a0, t1 - t0, low_z) if t1 > t0 else None


def surge_rate(samples: Sequence[tuple[float, float]]) -> float | None:
    """A step up in a counter's rate, seen within two readings: when each of the last two
    intervals between readings holds far more than the SHORT_WINDOW_S before them
    predicts, the lower of their two rates (read LOW_Z low); else None. samples: (t,
    total), oldest first, the last one now."""
    if len(samples) < 3:
        return None
    (t0, a0), (t1, a1), (t_s, total) = samples[-3], samples[-2], samples[-1]
    start = sample_at(samples, t0 - SHORT_WINDOW_S)
    if start is None or start[0] >= t0:
        return None  # too little history yet
    before = (a0 - start[1]) / (t0 - start[0])
    rates = []
    for (ta, aa), (tb, ab) in (((t0, a0), (t1, a1)), ((t1, a1), (t_s, total))):
        expected = before * (tb - ta)
        if tb <= ta or ab - aa <= expected + SURGE_Z * math.sqrt(max(expected, 1.0)):
            return None
        rates.append(low_rate(ab - aa, tb - ta, LOW_Z))
    return min(rates)


@dataclass(frozen=True)
class Reading:
    """One model's figures at one moment, as published (keys.scale)."""

    offered_rps: float
    capacity_rps: float  # per executor, at the SLO; 0 while unknown
    needed: int  # what the demand needs now, before the window and the bounds
    wanted: int
    running: int  # live executors
    busy: float = 0.0  # the share of time the live executors' devices computed


class Signal:
    """One model's scaling signal, fed a sample of its counters at every tick."""

    def __init__(self, settings: Settings, capacity_rps: float = 0.0) -> None:
        self.settings = settings
        self.offered = Rate(LONG_WINDOW_S)  # its samples serve the shorter spans too
        self.computing = Rate(LONG_WINDOW_S)  # ms of forward passes, per second
        self.capacity_rps = capacity_rps  # the last known, kept while no executor runs
        self.needs: deque[tuple[float, int]] = deque()  # (t, needed) over the down window

    def update(
        self,
        t_s: float,
        *,
        arrived: float,
        waiting: int,
        executors: list[ExecutorInfo],
        slo_ms: float | None,
        computed_ms: float = 0.0,
    ) -> Reading:
        """arrived: every task offered so far (completed + refused + waiting); waiting:
        how many wait now; executors: the live ones; computed_ms: the forward passes'
        time so far, all executors together."""
        rates = [
            self.offered.add(t_s, arrived),
            self.offered.over(SHORT_WINDOW_S, LOW_Z),
            surge_rate(self.offered.samples),
        ]
        offered = max((r for r in rates if r), default=0.0)
        known = [c for e in executors if (c := capacity_at_slo(e, slo_ms))]
        if known:
            self.capacity_rps = statistics.median(known)
        s = self.settings
        needed = 0
        if self.capacity_rps > 0:
            needed = executors_for(offered / self.capacity_rps, s.scale_headroom)
        if waiting or offered > 0:
            needed = max(needed, 1)  # demand and no executor: ask for one
        self.needs.append((t_s, needed))
        while self.needs and t_s - self.needs[0][0] > s.scale_down_window_s:
            self.needs.popleft()
        held = max(n for _, n in self.needs)
        wanted = min(max(held, s.scale_min_executors), s.scale_max_executors)
        computing = self.computing.add(t_s, computed_ms) or 0.0
        busy = min(1.0, computing / 1000 / len(executors)) if executors else 0.0
        return Reading(offered, self.capacity_rps, needed, wanted, len(executors), busy)
