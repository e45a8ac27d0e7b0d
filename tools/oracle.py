"""The autoscale profile's oracle: the fewest executors, second by second, that answer
every task of a trace's own arrivals by its deadline.

It is computed, not run. Executors are simulated as tandem's are at their best: an
executor that is free takes the oldest waiting tasks at once, up to a batch, and a batch
of b costs base + per_item x b. Each second the oracle picks the fewest executors with
which everything that has arrived so far still meets its deadline, the backlog drained
with no more arrivals; an executor it drops finishes the batch it holds. It foresees
the load, so an executor it adds is ready at once: its cold start is paid ahead, and
counted in its executor-seconds.

Greedy second by second, it is not proven the least possible, but it is a schedule that
meets every deadline, which the rate alone (executors = ceil(rate / capacity)) is not:
one executor at 100 % of its capacity lets the queue wander without bound.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Executor:
    base_s: float
    per_item_s: float
    max_batch: int

    def batch_s(self, size: int) -> float:
        return self.base_s + self.per_item_s * size


@dataclass
class _State:
    free: list[float]  # when each executor the oracle keeps is next free
    queue: deque[float]  # arrivals waiting, oldest first
    next: int = 0  # the next arrival not yet queued

    def copy(self) -> _State:
        return _State(list(self.free), deque(self.queue), self.next)


def _advance(state: _State, arrivals, until: float, slo_s: float, unit: Executor, drain: bool):
    """Serve arrivals before `until`; with drain, serve the backlog to the end. Returns
    whether every task served met its deadline."""
    ok = True
    while True:
        slot = min(range(len(state.free)), key=state.free.__getitem__)
        t = state.free[slot]
        if not state.queue:
            if state.next >= len(arrivals) or arrivals[state.next] >= until:
                return ok
            t = max(t, arrivals[state.next])
        else:
            t = max(t, state.queue[0])
        if t >= until and not drain:
            return ok
        while state.next < len(arrivals):
            at = arrivals[state.next]
            if at > t or at >= until:
                break
            state.queue.append(at)
            state.next += 1
        size = min(unit.max_batch, len(state.queue))
        oldest = state.queue[0]
        for _ in range(size):
            state.queue.popleft()
        state.free[slot] = t + unit.batch_s(size)
        ok = ok and state.free[slot] - oldest <= slo_s


def plan(arrivals: list[float], seconds: int, slo_s: float, unit: Executor, most: int) -> list[int]:
    """Executors for each second of the trace, at least one, at most `most`."""
    state = _State(free=[0.0], queue=deque())
    counts = []
    for second in range(seconds):
        chosen = most
        for n in range(1, most + 1):
            trial = _resized(state.copy(), n, second)
            if _advance(trial, arrivals, second + 1, slo_s, unit, drain=True):
                chosen = n
                break
        state = _resized(state, chosen, second)
        _advance(state, arrivals, second + 1, slo_s, unit, drain=False)
        counts.append(chosen)
    return counts


def _resized(state: _State, n: int, now: float) -> _State:
    """Keep the n executors free soonest; new ones are ready now."""
    state.free = sorted(state.free)[:n] + [now] * max(0, n - len(state.free))
    return state


def executor_seconds(counts: list[int], cold_s: float) -> float:
    """Each executor started cold_s before the second it is needed: it is foreseen."""
    ahead = math.ceil(cold_s)
    return float(sum(max(counts[t : t + ahead + 1]) for t in range(len(counts))))
