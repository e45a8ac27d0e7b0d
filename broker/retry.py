"""One retry policy for every loop that talks to Redis: which errors are retried, and how
long to wait between tries.

- A disconnect or a timeout is always retried: the call may never have reached Redis, or
  its reply was lost, and running it again is safe (a script call is atomic, and each
  step the loops retry is idempotent). An executor's claims are not: each is sent once
  (Steps._call), and a lost one rebuilds the executor from Redis, its in-flight tasks
  handed back through reclaim.
- A refusal (READONLY after a failover, OOM under maxmemory, LOADING, WRONGTYPE, a
  script's own error) is retried too, except by a step that holds work whose recovery is
  a rebuild: the returner raises it, and the executor restarts and hands the batch back
  (raise_refusals=True).
- Any other exception is a bug, raised to the caller.

Between tries: 0.1 s, doubling to 2 s (Backoff), each error logged.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import redis
from kombu.exceptions import OperationalError

from tandem.broker.errors import BrokerUnavailable

#: The call may never have run, or its reply was lost.
DISCONNECTS = (redis.ConnectionError, redis.TimeoutError)
#: Every Redis error: a disconnect, or a refusal.
REDIS_ERRORS = (redis.RedisError,)

T = TypeVar("T")


@contextlib.contextmanager
def unavailable_as_tandem(what: str = "cannot reach Redis") -> Iterator[None]:
    """Raise a disconnect or a timeout in the block as BrokerUnavailable: the error a
    caller of tandem gets from every method that talks to Redis."""
    try:
        yield
    except (*DISCONNECTS, OperationalError) as e:  # kombu's, for what goes through Celery
        raise BrokerUnavailable(f"{what}: {type(e).__name__}: {e}") from e


log = logging.getLogger("tandem.retry")


class Backoff:
    """Delays between tries: first_s, doubling up to cap_s; reset() after a success."""

    def __init__(self, first_s: float = 0.1, cap_s: float = 2.0) -> None:
        self.first_s, self.cap_s = first_s, max(cap_s, first_s)
        self.delay_s = first_s

    def next(self) -> float:
        delay, self.delay_s = self.delay_s, min(self.delay_s * 2, self.cap_s)
        return delay

    def reset(self) -> None:
        self.delay_s = self.first_s


def retry(
    step: Callable[[], T],
    *,
    what: str,
    stop: threading.Event | None = None,
    backoff: Backoff | None = None,
    each_try: Callable[[], None] | None = None,
    raise_refusals: bool = False,
) -> T | None:
    """Run step until it returns, waiting out each retried error with backoff (each one
    logged as `what`). With stop: give up, returning None, once it is set."""
    retried = DISCONNECTS if raise_refusals else REDIS_ERRORS
    delays = backoff  # made at the first error: most steps succeed at once
    while stop is None or not stop.is_set():
        if each_try is not None:
            each_try()
        try:
            done = step()
        except retried as e:
            if delays is None:
                delays = Backoff()
            delay = delays.next()
            log.warning(
                "%s: Redis error %s: %s; retrying in %.1fs", what, type(e).__name__, e, delay
            )
            if stop is None:
                time.sleep(delay)  # backoff between tries, not synchronisation
            else:
                stop.wait(delay)
        else:
            if backoff is not None:
                backoff.reset()
            return done
    return None
