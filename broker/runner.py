"""The script runner under every role's table: one Redis client's scripts, the direct
connections of the low-load path, the named fault points, and the replica fence.

broker/routes.py (producers), broker/steps.py (executors) and broker/upkeep.py (the
coordinator) each add the calls of one caller; broker/table.py joins them.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, NoReturn

import redis

from tandem.broker import keys
from tandem.broker.direct import DirectCalls
from tandem.broker.errors import BrokerUnavailable, TandemError, UnknownModel
from tandem.broker.faults import Faults
from tandem.broker.retry import Backoff
from tandem.broker.scripts import Scripts
from tandem.broker.settings import Settings

log = logging.getLogger("tandem.table")


class Runner:
    """Scripts bound to one Redis client, run at named fault points (broker/faults.py:
    `faults`, given by the process that runs executors, for tests; else none), and held
    for min_replicas where they take custody. `settings` gives the delivery limit, the
    result and dead-letter lifetimes and the replica settings."""

    def __init__(
        self, client: redis.Redis, settings: Settings | None = None, faults: Faults | None = None
    ) -> None:
        self.redis = client
        self.settings = settings or Settings()
        self.scripts = Scripts(client)
        #: Connections of its own for the low-load path's round trips.
        self.direct = DirectCalls(client)
        self.faults = faults if faults is not None else Faults()
        self._patience = threading.local()  # per executor thread: see patience()

    def _step(self, name: str, call, *args):
        """call(*args), at the fault and trace point `name`."""
        faults = self.faults
        if not faults.active:
            return call(*args)
        faults.at(name, "before")
        reply = call(*args)
        faults.at(name, "after", reply)
        return reply

    def _held(self, name: str, step, holds) -> Any:
        """An executor's step that takes custody of tasks or results (a claim, a store):
        step(then) makes its call, with `then` (None, or a WAIT) sent after it in the same
        write, and returns its reply, or (its reply, WAIT's) (DirectCalls.script). With
        min_replicas, WAIT goes in the same round trip, and when the reply holds something
        (holds(reply)) that fewer replicas acknowledged, the step waits for them
        (await_replicas) before it returns: no task is computed, and no batch counted
        stored, that a failover could take back."""
        wanted = self.settings.min_replicas
        if not wanted:
            return self._step(name, step, None)
        acked = []

        def run():
            reply, count = step(("WAIT", wanted, self.settings.replica_timeout_ms))
            acked.append(count)
            return reply

        reply = self._step(name, run)
        if acked[0] < wanted and holds(reply):
            self.await_replicas(name, acked[0])
        return reply

    def patience(self, each_try, stop: threading.Event | None) -> None:
        """How steps on the calling thread wait for replicas (await_replicas): each_try()
        at every try, giving up once stop is set. Set once per executor thread."""
        self._patience.each_try, self._patience.stop = each_try, stop

    def await_replicas(self, name: str, acked: int) -> None:
        """Wait until min_replicas replicas hold this thread's writes: write the fence key
        and WAIT, again and again (a replica that holds the fence holds every write before
        it). A disconnect is raised: on a new primary the step may or may not have
        happened, and the caller rebuilds (a claim hands its batch back; a store runs
        again, which changes nothing it already made). Given up once the thread's stop
        is set: the write stays on the primary alone."""
        wanted, timeout_ms = self.settings.min_replicas, self.settings.replica_timeout_ms
        each_try = getattr(self._patience, "each_try", None)
        stop = getattr(self._patience, "stop", None)
        log.warning(
            "%s: %d of %d replica(s) acknowledged within %d ms; waiting for them before going on",
            name,
            acked,
            wanted,
            timeout_ms,
        )
        backoff = Backoff(cap_s=1.0)
        while acked < wanted:
            if stop is not None and stop.is_set():
                log.warning("%s: stopping; its write is on the primary alone", name)
                return
            if each_try is not None:
                each_try()
            acked = self._fenced(name)
            if acked < wanted:
                (stop.wait if stop is not None else time.sleep)(backoff.next())  # between tries
        log.warning("%s: %d replica(s) hold it now; going on", name, acked)

    def _fenced(self, name: str) -> int:
        """Write the fence key and WAIT for min_replicas: how many replicas hold every
        write made before it, by anyone."""
        with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.FENCE, name)
            pipe.execute_command(
                "WAIT", self.settings.min_replicas, self.settings.replica_timeout_ms
            )
            _, acked = pipe.execute()
        return acked


def cut_short(error: TandemError, routed: list) -> TandemError:
    """The error of a burst cut short, with `.routed`: the replies of what went before."""
    error.routed = routed
    return error


def raise_converted(e: redis.ResponseError, routed: list | None = None) -> NoReturn:
    """Raise convert_error(e) (with `.routed`, if given). A refusal such as UnknownModel
    says it all: no Redis error is chained under it."""
    error = convert_error(e)
    if routed is not None and isinstance(error, TandemError):
        cut_short(error, routed)
    raise error from (None if isinstance(error, UnknownModel) else e)


def convert_error(e: redis.ResponseError) -> TandemError | redis.ResponseError:
    """A script's error as tandem's own: an unknown model, or a Redis that refuses
    writes (BrokerUnavailable); any other stays Redis's."""
    text = str(e)
    if text.startswith("UNKNOWN_MODEL"):
        return UnknownModel(
            text.removeprefix("UNKNOWN_MODEL ") + "; start a worker with --model for it"
        )
    if refused := _REFUSED.search(text):
        return BrokerUnavailable(f"Redis refused the command: {refused.group(1)}")
    if isinstance(e, (redis.exceptions.ReadOnlyError, redis.exceptions.OutOfMemoryError)):
        return BrokerUnavailable(f"Redis refused the command: {type(e).__name__}: {text}")
    return e


#: Errors from a Redis that is up but refuses writes, also as a script reports them.
_REFUSED = re.compile(r"(?:^|-)((?:READONLY|OOM|LOADING|MASTERDOWN)\b.*)")
