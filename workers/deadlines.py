"""Which claimed tasks a batch computes, so that the most of them meet their deadlines.

A batch of n is stored at finish(n), later for a larger batch. The plan takes the
largest n for which at least n tasks would still meet their deadlines, and of those it
keeps n: priority first (0 is shed last), then the earliest deadline. A task that would
miss is shed: it fails at once with DeadlineExceeded and is never computed. A task that
would meet it but did not fit goes back to the head of L1, for a later batch.

With no deadlines at all every task is kept, as before.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Plan:
    """Indexes into the planned tasks, each in their given order. `finish` is when the
    kept batch would be stored (epoch s); shed tasks would miss it."""

    keep: list[int]
    shed: list[int]
    back: list[int]
    finish: float

    def miss_ms(self, deadline: float | None) -> float:
        """How late a shed task with this deadline would have been, in ms (only a task
        with a deadline is shed)."""
        return (self.finish - (self.finish if deadline is None else deadline)) * 1000


def plan(
    deadlines: Sequence[float | None],
    priorities: Sequence[int],
    finish: Callable[[int], float],
) -> Plan:
    """Plan one batch of the given tasks. deadlines: epoch s, or None for none;
    finish(n): when a batch of n would be stored, non-decreasing in n."""
    count = len(deadlines)
    known = sorted(d for d in deadlines if d is not None)
    unbounded = count - len(known)
    size = 0
    for n in range(count, 0, -1):
        if unbounded + len(known) - bisect.bisect_left(known, finish(n)) >= n:
            size = n
            break
    end = finish(max(size, 1)) if count else 0.0
    meets = [i for i, d in enumerate(deadlines) if d is None or d >= end] if size else []
    meets.sort(key=lambda i: (priorities[i], math.inf if deadlines[i] is None else deadlines[i]))
    chosen = set(meets)
    return Plan(
        keep=sorted(meets[:size]),
        shed=[i for i in range(count) if i not in chosen],
        back=sorted(meets[size:]),
        finish=end,
    )
