"""The whole Redis key layout, in one place.

A model is named ``NAME:VERSION``. Names and versions use letters, digits,
``_`` and ``-`` only, so that they survive inside queue names and keys.
"""

from __future__ import annotations

import functools
import hashlib
import re

from tandem.broker.errors import BadArgument

#: Priority steps, as kombu's Redis transport lays them out. Lower is served first.
PRIORITY_STEPS = (0, 3, 6, 9)
#: Separator kombu puts between a queue name and its priority step.
PRIORITY_SEP = "\x06\x16"

#: SET of every model version a worker has ever served ("resnet18:1").
MODELS = "tandem:models"
#: HASH model -> bound on its L1 length (max_queue), set by its workers; absent = unbounded.
MAX_QUEUE = "tandem:max_queue"
#: HASH model -> its default deadline in ms (slo_ms), set by its workers; absent = none.
SLO = "tandem:slo"
#: HASH model -> its tensor signature as JSON (inputs, outputs, max_batch_size), set by its
#: workers from the model's config: what HTTP gateways describe and check requests by.
SPECS = "tandem:specs"
#: HASH of counters: redelivered (tasks reclaims moved back), duplicates (results kept).
STATS = "tandem:stats"
#: STREAM of executor state changes, written by the scripts, relayed by the coordinator.
#: Fields: executor, model, state, ms (when it changed, Redis's clock).
STATE_STREAM = "tandem:changes"
#: PUB/SUB channel where the coordinator publishes each state change as JSON.
STATE_CHANNEL = "tandem:state"
#: LIST of dead letters, newest first: JSON records (see broker/deadletter.py) of tasks
#: without a usable id and of quarantined poison tasks. Capped, and expiring.
DEAD = "tandem:dead"
#: ZSET of revoked task ids, scored by when the record expires (epoch ms). Written when
#: a revoke broadcast reaches a worker (or by Client.revoke); executors skip these tasks.
REVOKED = "tandem:revoked"
#: LIST of raw messages that reached max_deliveries, waiting for the coordinator to bury.
POISON = "tandem:poison"
#: LIST per message (by the SHA-1 of its bytes): the executors that died holding it.
DELIVERIES_PREFIX = "tandem:deliveries:"
#: ZSET of every executor id, scored by its heartbeat deadline (epoch ms): the
#: coordinator reads only the lapsed ones.
DEADLINES = "tandem:deadlines"
#: STRING: the coordinator's lease, "host:pid:token" of the one coordinator that works
#: on this Redis, expiring unless renewed; another coordinator stands by until it is free.
COORDINATOR = "tandem:coordinator"
#: STRING holding the last STATE_STREAM id the coordinator relayed.
RELAYED = "tandem:coordinator:relayed"
#: STRING an executor writes while it waits for replicas (min_replicas): WAIT after it
#: returns once the replicas hold every earlier write too. Any type is overwritten.
FENCE = "tandem:fence"
#: Celery result key of a task; Celery's Redis backend publishes on the same name.
RESULT_PREFIX = "celery-task-meta-"
#: HASH per executor: model, worker, state, cap (its room: how many more tasks its L2
#: takes now, 0 unless IDLE or WAITING), max_batch, expires_ms, batches, tasks,
#: `ready`, the key of its model's ready set, its latency model (base_ms,
#: per_item_ms, margin_ms, rate, lag_ms, extra_ms; see speed()), and `routed_ms` while a
#: route's WORKING is not yet in the changes stream (_lib.lua's settle_route).
EXECUTOR_PREFIX = "tandem:executor:"
#: LIST per executor: its second-level queue (L2). Producers LPUSH, the executor pops right.
L2_PREFIX = "tandem:l2:"
#: LIST per executor: every task it claimed and has not finished. Newest on the left.
INFLIGHT_PREFIX = "tandem:inflight:"
#: PUB/SUB channel per executor: route.lua says "full" there when a WAITING executor's
#: room reaches 0, which closes its batch window without polling.
FULL_PREFIX = "tandem:full:"

_PART = re.compile(r"^[A-Za-z0-9_-]+$")


def parse_model(model: str) -> tuple[str, str]:
    """Split ``NAME:VERSION`` and check both parts; raise BadArgument (a ValueError) if
    malformed. Names of up to 128 characters are remembered: a submit asks several
    times, and a fleet has few models."""
    if len(model) <= 128:
        return _parse_cached(model)
    return _parse(model)


def _parse(model: str) -> tuple[str, str]:
    name, sep, version = model.partition(":")
    if not sep or not _PART.match(name) or not _PART.match(version):
        raise BadArgument(
            f"model must look like NAME:VERSION (letters, digits, _ -), got {model!r}"
        )
    return name, version


#: How many model names a process remembers as checked.
MODELS_REMEMBERED = 1024
_parse_cached = functools.lru_cache(maxsize=MODELS_REMEMBERED)(_parse)


def l1(model: str) -> str:
    """LIST: the model's first-level queue, a real Celery queue ``tandem.l1.NAME.VERSION``."""
    name, version = parse_model(model)
    return f"tandem.l1.{name}.{version}"


def l1_keys(model: str) -> list[str]:
    """The L1 lists of every priority step, served first to last."""
    base = l1(model)
    return [base if p == 0 else f"{base}{PRIORITY_SEP}{p}" for p in PRIORITY_STEPS]


def l1_for_priority(model: str, priority: int) -> str:
    """The L1 list that kombu would pick for a message of this priority (0-9)."""
    step = max(s for s in PRIORITY_STEPS if s <= min(max(priority, 0), 9))
    return l1_keys(model)[PRIORITY_STEPS.index(step)]


def retry(model: str) -> str:
    """LIST of the model's redelivered tasks; each is computed alone, before L1."""
    parse_model(model)
    return f"tandem:retry:{model}"


def claim_keys(model: str) -> list[str]:
    """Where executors claim from, first to last: the retry list, then L1 by priority."""
    return [retry(model), *l1_keys(model)]


#: SET per model of the ids of the executors serving it (see executors()).
EXECUTORS_PREFIX = "tandem:executors:"


def executors(model: str) -> str:
    """SET of executor ids serving this model."""
    parse_model(model)
    return f"{EXECUTORS_PREFIX}{model}"


def ready(model: str) -> str:
    """ZSET of the executors of this model that can take a task now: IDLE or WAITING with
    room. The lowest score is routed to first: a WAITING executor scores its room
    (the fullest first), an IDLE one READY_IDLE plus when it went idle, in epoch
    microseconds (the longest idle first). Kept by the scripts that change state;
    route.lua drops lapsed entries."""
    parse_model(model)
    return f"tandem:ready:{model}"


#: Added to an IDLE executor's ready score: above any WAITING executor's room.
READY_IDLE = 2**40


def executor(executor_id: str) -> str:
    return EXECUTOR_PREFIX + executor_id


def l2(executor_id: str) -> str:
    return L2_PREFIX + executor_id


def inflight(executor_id: str) -> str:
    return INFLIGHT_PREFIX + executor_id


def full(executor_id: str) -> str:
    return FULL_PREFIX + executor_id


def deliveries(raw: bytes) -> str:
    """LIST of the executors that died holding this message (reclaim.lua's own naming)."""
    return DELIVERIES_PREFIX + hashlib.sha1(raw).hexdigest()  # noqa: S324 - a name, not a MAC


def speed(model: str) -> str:
    """HASH of the model's speed over its live executors, kept by the scripts from each
    executor's latency model: rate (tasks/s at full batches, summed), rate_lag (the sum
    of rate x lag_ms, where lag_ms is the time from a claim to the stored result),
    rate_extra (of rate x extra_ms, the pipeline's wait for the compute in hand),
    rate_batch (of rate x max_batch) and batches (the sum of max_batch). route.lua
    predicts L1 waits from it."""
    parse_model(model)
    return f"tandem:speed:{model}"


def scale(model: str) -> str:
    """HASH of the model's scaling signal, written by the coordinator every 0.25 s
    (coordinator/scaling.py): offered_rps, capacity_rps (one executor's, at the SLO; kept
    once no executor runs), needed, wanted, running, at_ms."""
    parse_model(model)
    return f"tandem:scale:{model}"


def metrics(model: str) -> str:
    """HASH of the model's metric counters (see broker/metrics.py)."""
    return f"tandem:metrics:{model}"


def result(task_id: str) -> str:
    return RESULT_PREFIX + task_id


def version_key(version: str) -> tuple:
    """Numeric versions sort as numbers, and above any named version."""
    return (1, int(version), "") if version.isdigit() else (0, 0, version)
