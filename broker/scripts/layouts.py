"""Each script's KEYS and ARGV by name: one pair of NamedTuples per script, in the order
of the script's header (its `-- KEYS:` and `-- ARGV:` lines, which it binds to locals of
the same names at its top). The last field of a layout marked @rest takes the rest: a
header name ending in "...". tests/test_script_layouts.py holds both sides to each header.

pack() flattens a layout into the list the script reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeVar

Value = Any  # what redis-py encodes: str, bytes, int or float
T = TypeVar("T", bound=type)
#: The layouts whose last field takes the rest.
WITH_REST: set[type] = set()


def rest(layout: T) -> T:
    """Mark a layout whose last field takes the rest (a header name ending in "...")."""
    WITH_REST.add(layout)
    return layout


def pack(layout: tuple) -> list:
    """The layout's values in the script's order, its rest (if it has one) spread."""
    if type(layout) in WITH_REST:
        return [*layout[:-1], *layout[-1]]
    return list(layout)


# Producers: the two-level rule (_route.lua names both for route, route_one, requeue).


@rest
class RouteKeys(NamedTuple):
    ready_set: str
    models: str
    target: str  # the L1 list at the tasks' priority
    retry: str
    speed: str
    slo: str
    executors: str
    l1: Sequence[str]  # every priority, served first to last


@rest
class RouteArgs(NamedTuple):
    model: str
    executor_prefix: str
    l2_prefix: str
    max_queue_hash: str
    metrics: str
    full_prefix: str
    left_ms: float  # -1: no deadline given
    above: int  # how many L1 lists are at or above the tasks' priority
    messages: Sequence[Value]


@rest
class RequeueKeys(NamedTuple):
    dead: str
    deliveries: Value
    route_keys: Sequence[str]


@rest
class RequeueArgs(NamedTuple):
    letter: bytes
    route_args: Sequence[Value]


# The coordinator's feed, reclaim, bury and lease.


@rest
class FeedKeys(NamedTuple):
    ready_set: str
    l1: Sequence[str]


class FeedArgs(NamedTuple):
    executor_prefix: str
    l2_prefix: str
    full_prefix: str
    metrics: str


class ReclaimKeys(NamedTuple):
    executor: str
    executors: str
    l2: str
    inflight: str
    changes: str
    stats: str
    retry: str
    poison: str
    l1_0: str
    l1_3: str
    l1_6: str
    l1_9: str
    deadlines: str
    speed: str


class ReclaimArgs(NamedTuple):
    executor_id: str
    force: str  # "1" or "0"
    count_deliveries: str  # "1" or "0": each in-flight task gets a delivery
    max_deliveries: int
    deliveries_prefix: str
    deliveries_ttl: int
    metrics: str


@rest
class BuryKeys(NamedTuple):
    poison: str
    dead: str
    deliveries: Value
    stats: str
    result: Sequence[str]  # the result key, for a message with an id


@rest
class BuryArgs(NamedTuple):
    raw: bytes
    record: str
    dead_cap: int
    dead_ttl: int
    result_meta: Sequence[Value]  # the result JSON and its ttl s, with a result key


class LeaseKeys(NamedTuple):
    lease: str


class LeaseArgs(NamedTuple):
    holder: str
    ttl_ms: int  # 0 gives it up


# Executors: registration, heartbeats, claims, states and stores.


class RegisterKeys(NamedTuple):
    executor: str
    executors: str
    models: str
    changes: str
    stats: str
    deadlines: str
    speed: str


class RegisterArgs(NamedTuple):
    executor_id: str
    model: str
    worker: str
    max_batch: int
    ttl_ms: int
    max_wait_ms: float
    pid: int
    max_queue: int
    max_queue_hash: str
    ready: str
    slo_ms: float
    slo_hash: str


@rest
class HeartbeatKeys(NamedTuple):
    deadlines: str
    models: str
    executors: Sequence[str]  # the executor hashes


@rest
class HeartbeatArgs(NamedTuple):
    ttl_ms: int
    executors_prefix: str
    ids: Sequence[str]  # in the order of the hashes


@rest
class BeginKeys(NamedTuple):
    executor: str
    l2: str
    inflight: str
    changes: str
    retry: str
    l1: Sequence[str]


class BeginArgs(NamedTuple):
    executor_id: str
    room: int
    taken: int
    metrics: str


@rest
class ClaimKeys(NamedTuple):
    executor: str
    inflight: str
    retry: str
    l1: Sequence[str]


class ClaimArgs(NamedTuple):
    n: int
    alone: str  # "1": the batch is empty, so one redelivered task may come alone


@rest
class ClaimOrIdleKeys(NamedTuple):
    executor: str
    inflight: str
    changes: str
    retry: str
    l1: Sequence[str]


class ClaimOrIdleArgs(NamedTuple):
    executor_id: str
    max_batch: int
    metrics: str


#: claim_or_idle.lua's first reply word when it claimed nothing and went IDLE (or the
#: executor is STOPPING); otherwise it is a claim's reply (Batch.claimed).
WENT_IDLE = 2


@rest
class UnclaimKeys(NamedTuple):
    inflight: str
    l1: Sequence[str]


@rest
class UnclaimArgs(NamedTuple):
    messages: Sequence[bytes]


class StateKeys(NamedTuple):
    executor: str
    changes: str
    speed: str


class StateArgs(NamedTuple):
    executor_id: str
    state: str
    metrics: str


class CompleteKeys(NamedTuple):
    inflight: str
    dead: str
    stats: str
    metrics: str


@rest
class CompleteArgs(NamedTuple):
    result_ttl: int
    dead_cap: int
    dead_ttl: int
    #: (raw message, result key, result JSON) triples.
    batch: Sequence[Value]


@rest
class CountKeys(NamedTuple):
    executor: str
    metrics: str
    speed: Sequence[str]  # the speed hash, when a latency model is given


@rest
class CountArgs(NamedTuple):
    tasks: int
    batches: int
    bookkeeping: Sequence[Value]


#: Each script's layouts, (KEYS, ARGV), by script name.
LAYOUTS: dict[str, tuple[type, type]] = {
    "route": (RouteKeys, RouteArgs),
    "route_one": (RouteKeys, RouteArgs),
    "requeue": (RequeueKeys, RequeueArgs),
    "feed": (FeedKeys, FeedArgs),
    "reclaim": (ReclaimKeys, ReclaimArgs),
    "bury": (BuryKeys, BuryArgs),
    "lease": (LeaseKeys, LeaseArgs),
    "register": (RegisterKeys, RegisterArgs),
    "heartbeat": (HeartbeatKeys, HeartbeatArgs),
    "begin": (BeginKeys, BeginArgs),
    "claim": (ClaimKeys, ClaimArgs),
    "claim_or_idle": (ClaimOrIdleKeys, ClaimOrIdleArgs),
    "unclaim": (UnclaimKeys, UnclaimArgs),
    "state": (StateKeys, StateArgs),
    "complete": (CompleteKeys, CompleteArgs),
    "count": (CountKeys, CountArgs),
}
