"""`tandem bench --profile autoscale`: how well each scaling policy follows the demand.

A local stack (Redis, a coordinator, worker processes) serves `sim` with a cold start:
a worker takes cold_s to load its model before its executor registers. Open-loop Poisson
arrivals follow a trace in multiples of one executor's capacity, every task due within
the SLO of its scheduled arrival; results are recorded by a process of their own
(harness.Recorder). Every TICK_S a policy sets how many worker processes run; one
scale-in stops the idlest worker, warmly (shell/autoscale.py). As `tandem up
--max-workers --standby STANDBY` does, the stack keeps STANDBY standby workers
(shell/stack.py), their imports done and no model loaded: a scale-out of up to STANDBY
workers waits for the cold start alone. Holding no model, they count as no executors.
Policies:

- static: the trace's peak, all the time;
- keda: KEDA's Redis trigger through an HPA, ceil(L1 length / LIST_LENGTH), read every
  sync; down only after the HPA's stabilization window;
- ray: Ray Serve's autoscaler, (ongoing + queued) / a target per replica, a change held
  for its upscale or downscale delay first;
- tandem: the coordinator's executors wanted (coordinator/scaling.py);
- churn: 3 workers, then 1, every CHURN_S, whatever the load: scale-ins under load, to
  count what they lose or answer twice (none may be).

One executor's capacity is measured first (a burst against one worker, no deadlines);
the traces are multiples of it. The oracle is computed, not run (tools/oracle.py): each
second, the fewest executors that answer every one of the trace's arrivals by its
deadline, each started its cold start ahead. Beside it, what tandem's formula costs with
no delay and no down window (`formula_executor_s`): the price of the headroom alone.

Time runs COMPRESS times faster than on a real cluster: traces of minutes, HPA's 15 s
sync and 300 s window, Ray's 30 s and 600 s delays, tandem's 120 s window and a 60 s flap
window are each divided by COMPRESS. The injected cold start is not.
"""

from __future__ import annotations

import math
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from tandem.autoscale import LocalScaler
from tandem.broker.errors import Overloaded, QueueFull
from tandem.broker.settings import Settings
from tandem.broker.table import Table
from tandem.coordinator.scaling import executors_for
from tandem.producers.client import Client
from tandem.stack import Stack
from tandem.tools import harness, oracle
from tandem.tools.harness import Recorder, Report, burst_rate
from tandem.tools.plots import figure, save_figure

MODEL = "sim:1"
#: One executor: 80 ms + 2.5 ms a task, 8 a batch: about 80 tasks/s at its largest batch.
COST = {"sim_base_ms": 80.0, "sim_per_item_ms": 2.5, "max_batch": 8, "slo_ms": 1000.0}
NOMINAL_CAPACITY = 8 * 1000 / (80.0 + 2.5 * 8)
COMPRESS = 5
TICK_S = 0.5  # as `tandem up` steps its scaler
MAX_WORKERS = 6
#: Standby workers: enough for the step's scale-out, from 2 workers at 1x to 5 at 4x.
STANDBY = 3
HEADROOM = 0.15
LIST_LENGTH = 2 * 8  # KEDA's listLength: two batches waiting per worker
HPA_SYNC_S, HPA_DOWN_S = 15 / COMPRESS, 300 / COMPRESS
RAY_UP_S, RAY_DOWN_S = 30 / COMPRESS, 600 / COMPRESS
TANDEM_DOWN_S = 120 / COMPRESS
FLAP_S = 60 / COMPRESS


@dataclass(frozen=True)
class Trace:
    name: str
    seconds: float
    load: Callable[[float], float]  # t (s) -> multiple of one executor's capacity
    step_at: float | None = None  # a step up, whose reaction is timed


def _ramp(t: float) -> float:
    if t < 10:
        return 0.5
    if t < 60:
        return 0.5 + 3.5 * (t - 10) / 50
    if t < 80:
        return 4.0
    return max(0.5, 4.0 - 3.5 * (t - 80) / 50)


TRACES = {
    "step": Trace("step", 140, lambda t: 4.0 if 20 <= t < 80 else 1.0, step_at=20),
    "ramp": Trace("ramp", 140, _ramp),
    "sawtooth": Trace("sawtooth", 120, lambda t: 1.0 + 2.0 * ((t % 20) / 20)),
}
QUICK_TRACE = Trace("step-quick", 60, lambda t: 4.0 if 10 <= t < 35 else 1.0, step_at=10)
#: Scale-in safety under churn: a steady 2x, while the churn policy flips between 3 and 1
#: workers every CHURN_S, stopping two busy workers a cycle.
CHURN_TRACE = Trace("churn", 1200, lambda t: 2.0)
CHURN_S = 6.0
POLICIES = ("static", "keda", "ray", "tandem")


def arrivals(trace: Trace, capacity: float, seed: int) -> list[float]:
    """Poisson arrivals at the trace's rate."""
    return harness.arrivals(lambda t: trace.load(t) * capacity, trace.seconds, seed)


def measure_capacity(settings: Settings, tasks: int = 1200) -> float:
    """One executor's throughput at saturation, tasks/s: a burst with no deadlines, timed
    between the 10th and the 90th percentile of its results' arrivals."""
    with (
        tempfile.TemporaryDirectory(prefix="tandem-capacity-") as folder,
        Stack(
            _settings(settings, 0.0).replace(slo_ms=0.0), workers=1, data_dir=Path(folder)
        ) as stack,
    ):
        recorder = Recorder(stack.url)
        producer = Client(settings=stack.settings)
        try:
            burst = producer.submit_many(MODEL, [[n] for n in range(tasks)])
            recorder.wait(len(burst), 120, stack.check)
        finally:
            arrived = recorder.collect()
            producer.close()
    done = [arrived[r.id] for r in burst if r.id in arrived]
    return burst_rate([a.at for a in done if a.status == "SUCCESS"])


def _settings(settings: Settings, cold_s: float) -> Settings:
    return settings.replace(
        models=(MODEL,),
        sim_load_s=cold_s,
        scale_down_window_s=TANDEM_DOWN_S,
        scale_headroom=HEADROOM,
        scale_max_executors=MAX_WORKERS,
        scale_min_executors=1,
        loglevel="WARNING",
        **COST,
    )


class Policy:
    """The worker count a policy asks for, asked every TICK_S."""

    def __init__(self, name: str, trace: Trace, table: Table) -> None:
        self.name, self.trace, self.table = name, trace, table
        self.peak = max(trace.load(s / 10) for s in range(int(trace.seconds * 10)))
        self.history: deque[tuple[float, int]] = deque()  # (t, desired) for the windows
        self.last = 1
        self.next_sync = 0.0
        self.direction, self.since = 0, 0.0  # ray: the way desired points, and since when

    def __call__(self, t: float, running: int) -> int:
        if self.name == "static":  # the peak, with the same headroom as tandem's signal
            return executors_for(self.peak, HEADROOM)
        if self.name == "churn":
            return 3 if (t // CHURN_S) % 2 == 0 else 1
        if self.name == "tandem":
            wanted = self.table.scale(MODEL).get("wanted")
            return running if wanted is None else int(wanted)
        if self.name == "keda":
            if t < self.next_sync:
                return self.last
            self.next_sync = t + HPA_SYNC_S
            desired = max(1, math.ceil(self.table.l1_depth(MODEL) / LIST_LENGTH))
            self.history.append((t, desired))
            while self.history and t - self.history[0][0] > HPA_DOWN_S:
                self.history.popleft()
            self.last = max(d for _, d in self.history)  # up at once, down after the window
            return self.last
        # ray: (ongoing + queued) over the target per replica; a change is made once it
        # was wanted for the whole upscale (or downscale) delay.
        held = sum(e.l2_depth + e.inflight_depth for e in self.table.executors(MODEL))
        queued = self.table.l1_depth(MODEL) + self.table.retry_depth(MODEL)
        desired = max(1, math.ceil((held + queued) / COST["max_batch"]))
        direction = (desired > self.last) - (desired < self.last)
        if direction != self.direction:
            self.direction, self.since = direction, t
        delay = RAY_UP_S if direction > 0 else RAY_DOWN_S
        if direction and t - self.since >= delay:
            self.last, self.direction = desired, 0
        return self.last


class PolicyScaler(LocalScaler):
    """The local scaler, its target set by a policy rather than by tandem's signal."""

    def __init__(self, stack: Stack, client: redis.Redis, policy: Policy, start: float) -> None:
        super().__init__(stack, client, min_workers=1, max_workers=MAX_WORKERS)
        self.policy, self.start = policy, start

    def target(self) -> int:
        wanted = self.policy(time.monotonic() - self.start, len(self.stack.running_workers))
        return min(max(wanted, self.min_workers), self.max_workers)


def run(
    policy_name: str,
    trace: Trace,
    *,
    cold_s: float,
    settings: Settings,
    capacity: float = NOMINAL_CAPACITY,
    seed: int = 1,
    standby: int = STANDBY,
) -> dict[str, Any]:
    """One policy on one trace at multiples of `capacity` (one executor's, tasks/s), on a
    stack of its own, with `standby` standby workers (with none, a start is also a new
    process's and its imports). Returns its row, with its timeline."""
    with (
        tempfile.TemporaryDirectory(prefix="tandem-autoscale-") as folder,
        Stack(
            _settings(settings, cold_s), workers=1, data_dir=Path(folder), standby=standby
        ) as stack,
    ):
        return _measure(stack, policy_name, trace, cold_s, capacity, seed)


def _measure(
    stack: Stack, policy_name: str, trace: Trace, cold_s: float, capacity: float, seed: int
) -> dict:
    client = redis.Redis.from_url(stack.url)
    table = Table(client)
    recorder = Recorder(stack.url)
    producer = Client(settings=stack.settings)
    try:
        _warm(producer, recorder)
        warm = recorder.count.value
        schedule = arrivals(trace, capacity, seed)
        start = time.monotonic()
        scaler = PolicyScaler(stack, client, Policy(policy_name, trace, table), start)
        timeline: list[tuple[float, int, int, int]] = []  # t, processes, live, target
        stop = threading.Event()
        steering = threading.Thread(
            target=_steer, args=(stack, scaler, table, start, timeline, stop), daemon=True
        )
        steering.start()
        sent = _drive(producer, schedule, stack)
        due = sent.due
        recorder.wait(warm + len(due), 30 + COST["slo_ms"] / 1000, stack.check)
        stop.set()
        steering.join(10)
        stats = table.stats()
        estimated = table.scale(MODEL).get("capacity_rps")
    finally:
        arrived = recorder.collect()
        producer.close()
        client.close()
    row = _row(policy_name, trace, cold_s, sent, arrived, timeline, stats)
    row["capacity_rps"] = capacity
    row["oracle_executor_s"] = oracle_executor_s(trace, cold_s, capacity, seed)
    row["vs_oracle"] = round(row["executor_s"] / row["oracle_executor_s"], 2)
    formula = formula_executor_s(trace, cold_s)
    row["formula_vs_oracle"] = round(formula / row["oracle_executor_s"], 2)
    row["signal_capacity_rps"] = estimated  # one executor's capacity at the SLO, as tandem saw it
    return row


def _warm(producer: Client, recorder: Recorder) -> None:
    """Batches large and small, so the latency model knows the executor's speed."""
    sent = producer.submit_many(MODEL, [[n] for n in range(32)])
    recorder.wait(len(sent), 60)
    for n in range(4):
        producer.submit(MODEL, [n])
        recorder.wait(len(sent) + n + 1, 10)


def _steer(stack, scaler, table, start, timeline, stop) -> None:
    """Every TICK_S: the policy's step, and a sample of the fleet."""
    while not stop.is_set():
        target = scaler.step()
        stack.exited()  # reaps the retired workers that have stopped
        now_ms = table.now_ms()
        live = sum(e.expires_ms > now_ms for e in table.executors(MODEL))
        alive = len(stack.running_workers) + len(stack.retiring)
        timeline.append((time.monotonic() - start, alive, live, target))
        stop.wait(TICK_S)


def _drive(producer: Client, schedule: list[float], stack: Stack) -> harness.Sent:
    """The open-loop arrivals, each due by its scheduled arrival plus the SLO."""
    slo_s = COST["slo_ms"] / 1000

    def submit(batch: list, at: float) -> tuple[list[str], int]:
        try:
            results = producer.submit_many(
                MODEL, batch, deadline_s=max(1e-3, at + slo_s - time.time())
            )
        except (Overloaded, QueueFull) as e:
            results = list(e.accepted)
        return [r.id for r in results], len(batch) - len(results)

    return harness.drive(schedule, submit, stack.check)


def oracle_executor_s(trace: Trace, cold_s: float, capacity: float, seed: int = 1) -> float:
    """The fewest executor-seconds that meet every deadline of the trace's arrivals
    (tools/oracle.py), each executor started cold_s ahead (it is foreseen)."""
    slow = NOMINAL_CAPACITY / capacity  # the measured executor against the nominal cost
    unit = oracle.Executor(
        COST["sim_base_ms"] / 1000 * slow,
        COST["sim_per_item_ms"] / 1000 * slow,
        int(COST["max_batch"]),
    )
    schedule = arrivals(trace, capacity, seed)
    counts = oracle.plan(
        schedule, math.ceil(trace.seconds), COST["slo_ms"] / 1000, unit, MAX_WORKERS
    )
    return oracle.executor_seconds(counts, cold_s)


def formula_executor_s(trace: Trace, cold_s: float, headroom: float = HEADROOM) -> float:
    """Executor-seconds of tandem's formula, ceil(load x (1 + headroom)), applied each
    second to the trace's own load with no delay and no down window, each executor
    foreseen as the oracle's are. At a load of exactly n executors' capacity any headroom
    asks for n + 1, where the oracle runs n at 100 %."""
    counts = []
    for second in range(math.ceil(trace.seconds)):
        most = max(trace.load(second), trace.load(second + 0.999))  # the second's peak
        counts.append(min(MAX_WORKERS, max(1, executors_for(most, headroom))))
    return oracle.executor_seconds(counts, cold_s)


def _row(policy, trace, cold_s, sent, arrived, timeline, stats) -> dict[str, Any]:
    """sent: what harness.drive sent (scheduled arrivals, in epoch s)."""
    due, refused, began = sent.due, sent.refused, sent.began
    slo_s = COST["slo_ms"] / 1000
    to_enough = _to_enough(trace, timeline)
    # The reaction to a step: from it until enough executors served (or the trace's end).
    react = (trace.step_at or 0.0, (trace.step_at or 0.0) + (to_enough or trace.seconds))
    good = late = shed = failed = 0
    outside = [0, 0]  # tasks offered outside the reaction, and those answered in time
    for task_id, at in due.items():
        got = arrived.get(task_id)
        in_time = got is not None and got.status == "SUCCESS" and got.at - at <= slo_s
        if trace.step_at is not None and not react[0] <= at - began < react[1]:
            outside[0] += 1
            outside[1] += in_time
        if got is None:
            continue
        if got.status == "SUCCESS":
            good += in_time
            late += not in_time
        elif got.error == "DeadlineExceeded" or got.status == "REVOKED":
            shed += 1
        else:
            failed += 1
    if trace.step_at is not None:
        outside[0] += sum(not react[0] <= at - began < react[1] for at in refused)
    offered = len(due) + len(refused)
    executor_s = sum(alive * (t1 - t0) for (t0, alive, _, _), (t1, *_) in spans_of(timeline))
    return {
        "policy": policy,
        "trace": trace.name,
        "cold_s": cold_s,
        "offered": offered,
        "attainment": round(good / offered, 4) if offered else None,
        # Outside the reaction to the step (step traces): what the policy holds once scaled.
        "attainment_after": round(outside[1] / outside[0], 4) if outside[0] else None,
        "goodput_rps": round(good / trace.seconds, 1),
        "refused": len(refused),
        "shed": shed,
        "late": late,
        "failed": failed,
        "lost": sum(1 for t in due if t not in arrived),
        "duplicated": stats.get("duplicates", 0),
        "executor_s": round(executor_s, 1),
        "to_enough_s": to_enough,
        "flaps": _flaps(timeline),
        "scale_ins": sum(max(0, a - b) for (_, a, _, _), (_, b, _, _) in spans_of(timeline)),
        "timeline": timeline,
    }


def spans_of(timeline: list) -> zip:
    """Each sample of a timeline with the next."""
    return zip(timeline, timeline[1:], strict=False)


def _to_enough(trace: Trace, timeline) -> float | None:
    """Seconds from the trace's step up to enough live executors for its new rate."""
    if trace.step_at is None:
        return None
    enough = math.ceil(round(trace.load(trace.step_at), 6))
    after = [t for t, _, live, _ in timeline if t >= trace.step_at and live >= enough]
    return round(after[0] - trace.step_at, 1) if after else None


def _flaps(timeline) -> int:
    """Scale-ins followed by a scale-out within FLAP_S."""
    flaps, last_in = 0, None
    for (_, before, _, _), (t, after, _, _) in spans_of(timeline):
        if after < before:
            last_in = t
        elif after > before and last_in is not None and t - last_in <= FLAP_S:
            flaps += 1
            last_in = None
    return flaps


COLUMNS = (
    "policy",
    "trace",
    "cold_s",
    "attainment",
    "attainment_after",
    "goodput_rps",
    "refused",
    "shed",
    "late",
    "executor_s",
    "vs_oracle",
    "formula_vs_oracle",
    "to_enough_s",
    "flaps",
    "scale_ins",
    "lost",
    "duplicated",
)


def plot(rows: list[dict[str, Any]], path: str) -> None:
    """Workers and offered load (in executors' worth) over time, one panel per trace and
    cold start, a line per policy."""
    groups = sorted({(r["trace"], r["cold_s"]) for r in rows})
    fig, axes = figure(len(groups), width=9, height=3.2, stacked=True)
    for ax, (trace_name, cold_s) in zip(axes, groups, strict=True):
        trace = TRACES.get(trace_name, QUICK_TRACE)
        span = max(t for r in rows if r["trace"] == trace_name for t, *_ in r["timeline"])
        xs = [x / 10 for x in range(int(span * 10))]
        ax.plot(xs, [trace.load(x) for x in xs], color="black", lw=1, label="offered (x one)")
        for r in rows:
            if (r["trace"], r["cold_s"]) == (trace_name, cold_s):
                ts = [t for t, *_ in r["timeline"]]
                ax.step(
                    ts,
                    [alive for _, alive, _, _ in r["timeline"]],
                    where="post",
                    label=f"{r['policy']} workers",
                )
        ax.set(
            title=f"{trace_name}, cold start {cold_s:g} s (time compressed {COMPRESS}x)", xlabel="s"
        )
    save_figure(fig, path)


def report(settings: Settings, *, quick: bool, churn: bool, progress) -> Report:
    """Every policy on every trace, each on a stack of its own; quick: a short step,
    tandem's signal and the KEDA-like policy, a 1 s cold start; churn: 20 minutes of
    scale-ins under load, counting what they lose."""
    if churn:
        plan = [("churn", CHURN_TRACE, 1.0)]
    elif quick:
        plan = [(p, QUICK_TRACE, 1.0) for p in ("tandem", "keda")]
    else:
        colds = (("step", (1.0, 4.0)), ("ramp", (4.0,)), ("sawtooth", (4.0,)))
        plan = [(p, TRACES[t], c) for t, cs in colds for c in cs for p in POLICIES]
    progress("measuring one executor's capacity ...")
    capacity = measure_capacity(settings)
    rows = []
    for policy, trace, cold in plan:
        progress(f"{policy} on {trace.name}, cold start {cold:g} s ...")
        rows.append(run(policy, trace, cold_s=cold, settings=settings, capacity=capacity))
        progress("  " + ", ".join(f"{c} {rows[-1][c]}" for c in COLUMNS[3:]))
    title = (
        f"tandem bench, profile autoscale: {MODEL}, one executor {capacity:g} "
        f"tasks/s, SLO {COST['slo_ms']:g} ms, time compressed {COMPRESS}x"
    )
    return Report(rows, draw=lambda path: plot(rows, path)).table(title, COLUMNS, rows)
