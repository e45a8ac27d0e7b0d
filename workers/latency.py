"""An executor's latency model, learned online from its own batches.

Compute time is fitted as base_ms + per_item_ms x n by exponentially weighted least
squares, so it follows the model or the device when their speed changes (the weight of
a batch halves every HALF_LIFE batches). The tail is a margin: a high quantile of how
much slower than the current fit the recent batches were (so the misfit of the first
batches, before their sizes spread, does not outlive them). Around the compute it
measures the gap between two back-to-back computes (claims, top-ups, and preparing when
the pipeline does not hide it), a mean, and the time from a compute's end to its stored
results, by the same high quantile: a result stored late is as late as one computed late.

The executor predicts with it when a batch would be stored (workers/deadlines.py) and
publishes it as a Speed, from which route.lua predicts the wait in L1.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Collection

from tandem.broker.state import Speed

#: Batches after which an observation weighs half as much.
HALF_LIFE = 32
#: Recent batches (size, ms) whose residuals against the fit make the margin.
RESIDUALS = 64
#: The quantile of those errors that the margin covers.
TAIL = 0.98
#: Below this spread of batch sizes (std dev) the slope cannot be fitted: keep the last one.
MIN_SPREAD = 0.5


class Fit:
    """Exponentially weighted least squares of y = a + b x, with b >= 0."""

    def __init__(self, half_life: float = HALF_LIFE) -> None:
        self.decay = 0.5 ** (1 / half_life)
        self.w = self.wx = self.wy = self.wxx = self.wxy = 0.0
        self.slope = 0.0  # the last slope the spread of x allowed fitting

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.w = self.w * d + 1
        self.wx = self.wx * d + x
        self.wy = self.wy * d + y
        self.wxx = self.wxx * d + x * x
        self.wxy = self.wxy * d + x * y
        mean_x = self.wx / self.w
        spread = self.wxx / self.w - mean_x * mean_x
        if spread >= MIN_SPREAD**2:
            covariance = self.wxy / self.w - mean_x * self.wy / self.w
            self.slope = max(0.0, covariance / spread)

    def line(self) -> tuple[float, float]:
        """(a, b); call after at least one add."""
        a = self.wy / self.w - self.slope * self.wx / self.w
        return max(0.0, a), self.slope


class Mean:
    """An exponentially weighted mean, 0 until the first value."""

    def __init__(self, half_life: float = HALF_LIFE) -> None:
        self.decay = 0.5 ** (1 / half_life)
        self.w = self.sum = 0.0

    def add(self, value: float) -> None:
        self.w = self.w * self.decay + 1
        self.sum = self.sum * self.decay + value

    @property
    def value(self) -> float:
        return self.sum / self.w if self.w else 0.0


class LatencyModel:
    """Thread-safe: the executor thread observes computes and gaps, the returner stores."""

    def __init__(self, half_life: float = HALF_LIFE) -> None:
        self._fit = Fit(half_life)
        self._recent: deque[tuple[int, float]] = deque(maxlen=RESIDUALS)
        self._margin = 0.0  # TAIL of the recent residuals, updated with each batch
        self._gap = Mean(half_life)
        self._returns: deque[float] = deque(maxlen=RESIDUALS)
        self._return = 0.0  # TAIL of the recent returns
        self._lock = threading.Lock()
        self.batches = 0

    def __repr__(self) -> str:
        if not self.ready:
            return "<LatencyModel no batches yet>"
        base, per_item = self.line()
        return (
            f"<LatencyModel {base:.2f} + {per_item:.3f} x n ms, margin {self.margin_ms:.2f} ms, "
            f"gap {self._gap.value:.2f} ms, return {self.return_ms:.2f} ms, "
            f"batches={self.batches}>"
        )

    @property
    def ready(self) -> bool:
        """True once a batch has been observed: before that, nothing is predicted."""
        return self.batches > 0

    def observe_compute(self, n: int, ms: float) -> None:
        """A forward pass of n tasks took ms of wall time."""
        with self._lock:
            self._fit.add(n, ms)
            self._recent.append((n, ms))
            self.batches += 1
            base, per_item = self._fit.line()  # once, not once per residual
            self._margin = _tail([took - base - per_item * size for size, took in self._recent])

    def observe_gap(self, ms: float) -> None:
        """The device was free for ms between two computes while work was in hand."""
        with self._lock:
            self._gap.add(ms)

    def observe_return(self, ms: float) -> None:
        """From a compute's end to its results stored, ms."""
        with self._lock:
            self._returns.append(ms)
            self._return = _tail(self._returns)

    def line(self) -> tuple[float, float]:
        """(base_ms, per_item_ms) of the compute fit."""
        with self._lock:
            return self._fit.line()

    def compute_ms(self, n: int) -> float:
        """The fitted compute time of a batch of n, without the margin."""
        with self._lock:
            return self._compute(n)

    @property
    def gap_ms(self) -> float:
        """The mean time the device was free between two back-to-back computes."""
        with self._lock:
            return self._gap.value

    @property
    def margin_ms(self) -> float:
        """How much slower than the fit a compute may be: TAIL of the recent residuals."""
        with self._lock:
            return self._margin

    @property
    def return_ms(self) -> float:
        """How long storing a batch's results may take: TAIL of the recent returns."""
        with self._lock:
            return self._return

    def finish_ms(self, n: int) -> float:
        """From a compute's start to its n results stored, with the tails."""
        with self._lock:
            return self._compute(n) + self._margin + self._return

    def speed(self, max_batch: int, *, pipeline: bool, ahead: int = 1) -> Speed:
        """The rate at full batches; the lag from a claim to the stored result; and, with
        the pipeline, the extra wait of a batch claimed early, as the ones before it start
        computing: a compute for each of the `ahead` batches an executor claims early."""
        with self._lock:
            base, per_item = self._fit.line()
            compute = self._compute(max_batch)
            cycle = compute + self._gap.value
            return Speed(
                base_ms=base,
                per_item_ms=per_item,
                margin_ms=self._margin,
                rate=max_batch * 1000 / cycle if cycle > 0 else 0.0,
                lag_ms=self._gap.value + compute + self._margin + self._return,
                max_batch=max_batch,
                extra_ms=compute * ahead if pipeline else 0.0,
            )

    def _compute(self, n: int) -> float:
        if not self.batches:
            return 0.0
        a, b = self._fit.line()
        return a + b * n


def _tail(values: Collection[float]) -> float:
    """The TAIL quantile of values (nearest rank), at least 0; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return max(0.0, ordered[min(len(ordered) - 1, int(TAIL * len(ordered)))])
