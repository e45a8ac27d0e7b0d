"""Traces: real producer, worker and gateway processes export their spans with
OpenTelemetry's own OTLP exporter to a receiver in the test (tests/otlp.py), as they would
to a collector or Jaeger; the real clients carry the caller's trace context."""

from __future__ import annotations

import gc
import json
import os
import re
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("opentelemetry.sdk")
from otlp import Receiver, Span  # noqa: E402

from conftest import Processes  # noqa: E402
from helpers import fast_settings, hide_modules, plain_celery, tandem  # noqa: E402
from tandem.broker import keys, message, tracing  # noqa: E402
from tandem.broker.errors import BadArgument  # noqa: E402
from tandem.producers.client import stop_result_listener  # noqa: E402
from tandem.server import RedisServer  # noqa: E402

#: The plain Celery apps of these tests, on the module's Redis.
APPS: list = []
#: OTLP's SpanKind values.
SERVER, PRODUCER, CONSUMER = 2, 4, 5
ERROR = 2  # OTLP's status code


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """A Redis, an OTLP receiver, a traced worker (sim:1 at zero cost) and a traced gateway."""
    folder = tmp_path_factory.mktemp("tracing")
    server = RedisServer(folder / "redis").start()
    receiver = Receiver()
    client = redis.Redis.from_url(server.url)
    procs = Processes(fast_settings(server.url), client, folder / "logs")
    try:
        procs.worker(
            "traced", models=("sim:1",), sim_base_ms=0, sim_per_item_ms=0, env=receiver.env()
        )
        procs.url = procs.gateway("gateway", env=receiver.env())
        procs.receiver = receiver
        yield procs
    finally:
        # The Celery results of the tests unsubscribe when collected: while Redis answers.
        gc.collect()
        for app in APPS:
            stop_result_listener(app)
        procs.stop_all()
        receiver.close()
        client.close()
        server.stop()


def produce(stack: Processes, script: str, env: dict[str, str] | None = None) -> dict:
    """Run a producer process (`client` is a tandem Client on the stack's Redis); what it
    prints last, as JSON."""
    code = "import json\nfrom tandem.producers.client import Client\n"
    code += "client = Client()\n" + textwrap.dedent(script)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TANDEM_"))}
    environ.update(env or {}, TANDEM_REDIS_URL=stack.settings.redis_url)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1]) | {"stderr": done.stderr}


def child_of(span: Span, parent: Span) -> bool:
    return span.trace_id == parent.trace_id and span.parent_id == parent.span_id


def test_a_task_yields_one_trace_from_its_producer_to_its_stored_result(stack):
    receiver = stack.receiver
    out = produce(
        stack,
        """
        result = client.submit("sim:1", [1, 2])
        print(json.dumps({"id": result.id, "value": result.get(timeout=30)}))
        """,
        receiver.env(),
    )
    assert out["value"] == [1, 2]
    send = receiver.one("send ", **{"messaging.message.id": out["id"]})
    process = receiver.one("process ", **{"messaging.message.id": out["id"]})
    assert (send.service, send.kind) == ("tandem-producer", PRODUCER)
    assert send.attributes["tandem.route"] in ("L1", "L2")
    assert send.attributes["tandem.executor"].startswith("traced@test/sim:1/")
    assert send.attributes["messaging.destination.name"] == keys.l1("sim:1")
    # The worker's span is the child of the producer's: the context came in the message.
    assert (process.service, process.kind) == ("tandem-worker", CONSUMER)
    assert child_of(process, send)
    assert process.attributes["tandem.outcome"] == "success"
    (wait,) = [s for s in receiver.trace(send.trace_id) if s.name == "queue wait"]
    assert child_of(wait, process)
    # The batch: a trace of its own, linked both ways with the task's span.
    (link,) = process.links
    batch = receiver.by_id(link[1])
    assert batch.name == "batch sim:1" and (process.trace_id, process.span_id) in batch.links
    assert batch.attributes["tandem.batch.size"] == len(batch.links)
    steps = {s.name: s for s in receiver.trace(batch.trace_id) if child_of(s, batch)}
    assert set(steps) == {"prepare", "compute", "store"}
    assert "tandem.compute_ms" in steps["compute"].attributes
    # In order: sent, waited, claimed and prepared, computed, stored; the task ends there.
    order = [
        send.start, wait.start, wait.end, steps["prepare"].start, steps["prepare"].end,
        steps["compute"].start, steps["store"].start, steps["store"].end,
    ]  # fmt: skip
    assert order == sorted(order), order
    assert steps["compute"].end <= steps["store"].start + 1_000_000  # float rounding: 1 ms
    assert process.start == wait.start and process.end == steps["store"].end == batch.end


def test_a_batch_span_links_each_of_its_tasks(stack):
    receiver = stack.receiver
    out = produce(
        stack,
        """
        results = client.submit_many("sim:1", [[n] for n in range(6)])
        values = [r.get(timeout=30) for r in results]
        print(json.dumps({"ids": [r.id for r in results], "values": values}))
        """,
        receiver.env(),
    )
    assert out["values"] == [[n] for n in range(6)]
    send = receiver.one("send ", **{"messaging.batch.message_count": 6})
    assert send.attributes["tandem.routed.l1"] + send.attributes["tandem.routed.l2"] == 6
    for task_id in out["ids"]:
        process = receiver.one("process ", **{"messaging.message.id": task_id})
        assert child_of(process, send)
        batch = receiver.by_id(process.links[0][1])
        assert (process.trace_id, process.span_id) in batch.links


def test_a_shed_task_s_trace_says_it_was_shed(stack):
    """A task whose deadline passed before its claim is shed, never computed; its span,
    in the trace its plain Celery publisher's traceparent named, says so and why."""
    app = plain_celery(stack.settings)
    APPS.append(app)
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    past = datetime.now(timezone.utc) - timedelta(seconds=5)
    result = app.send_task(
        "tandem.infer",
        kwargs={"model": "sim:1", "inputs": [1]},
        queue=keys.l1("sim:1"),
        expires=past,
        headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
    )
    with pytest.raises(Exception, match="expired"):
        result.get(timeout=30)
    process = stack.receiver.one("process ", **{"messaging.message.id": result.id})
    assert (process.trace_id, process.parent_id) == (trace_id, parent_id)
    assert process.attributes["tandem.outcome"] == "shed"
    assert process.attributes["error.type"] == "DeadlineExceeded"
    assert process.status[0] == ERROR and "expired" in process.status[1]
    assert [name for name, _ in process.events] == ["shed"]
    batch = stack.receiver.by_id(process.links[0][1])
    assert batch.attributes["tandem.batch.shed"] >= 1


def test_a_buried_poison_task_s_trace_says_it_was_quarantined(stack):
    """A task whose deliveries killed every executor that held it: the coordinator buries
    it, and the span it makes, in the trace its message named, says so and names them."""
    trace_id, parent_id = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
    task_id, raw = message.encode(
        "sim:1", [1], queue=keys.l1("sim:1"),
        trace={"traceparent": f"00-{trace_id}-{parent_id}-01"},
    )  # fmt: skip
    took = ["gone@a/sim:1/1", "gone@b/sim:1/2", "gone@c/sim:1/3"]
    # Where reclaim leaves a message that reached max_deliveries: on the poison list,
    # with the executors that died holding it.
    stack.client.rpush(keys.deliveries(raw.encode()), *took)
    stack.client.lpush(keys.POISON, raw)
    stack.coordinator(env=stack.receiver.env())
    process = stack.receiver.one("process ", **{"messaging.message.id": task_id})
    assert (process.service, process.kind) == ("tandem-coordinator", CONSUMER)
    assert (process.trace_id, process.parent_id) == (trace_id, parent_id)
    assert process.attributes["tandem.outcome"] == "failure"
    assert process.attributes["error.type"] == "PoisonMessage"
    assert process.status[0] == ERROR and "quarantined after 3 deliveries" in process.status[1]
    ((event, attributes),) = process.events
    assert event == "quarantined" and attributes["tandem.executors"] == took
    stored = json.loads(stack.client.get(keys.result(task_id)))
    assert stored["status"] == "FAILURE" and stored["result"]["exc_type"] == "PoisonMessage"


def test_a_purged_task_s_trace_says_it_was_purged(stack):
    """`tandem purge` answers each task it removes from L1 REVOKED, and the span it makes,
    in the trace the task's message named, says why; a task answered already keeps its
    result and gets none."""
    model = "purged:1"  # a model no worker here serves: its L1 stays as it is put
    trace_id, parent_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    traced = {"traceparent": f"00-{trace_id}-{parent_id}-01"}
    task_id, raw = message.encode(model, [1], queue=keys.l1(model), trace=traced)
    done_id, done_raw = message.encode(model, [2], queue=keys.l1(model), trace=traced)
    stack.client.set(keys.result(done_id), json.dumps({"status": "SUCCESS", "result": [2]}))
    stack.client.lpush(keys.l1(model), raw, done_raw)  # as a plain Celery client would
    env = {**os.environ, **stack.receiver.env()}
    done = tandem("purge", model, "--yes", redis_url=stack.settings.redis_url, env=env)
    assert done.returncode == 0 and "purged 2 task(s)" in done.stdout, done.stderr
    process = stack.receiver.one("process ", **{"messaging.message.id": task_id})
    assert (process.service, process.kind) == ("tandem-purge", CONSUMER)
    assert (process.trace_id, process.parent_id) == (trace_id, parent_id)
    assert process.attributes["tandem.outcome"] == "revoked"
    assert process.attributes["error.type"] == "Revoked"
    assert process.status[0] == ERROR and "purged from the first-level queue" in process.status[1]
    ((event, _),) = process.events
    assert event == "purged"
    assert json.loads(stack.client.get(keys.result(task_id)))["status"] == "REVOKED"
    assert not stack.receiver.find("process ", **{"messaging.message.id": done_id})


def test_a_refused_task_s_trace_says_why(stack):
    """A model no worker serves: refused at once, and the send span is the error that
    says so."""
    out = produce(
        stack,
        """
        try:
            client.submit("sim:9", [1], deadline_s=5)
        except Exception as e:
            print(json.dumps({"error": type(e).__name__}))
        """,
        {**stack.receiver.env(), "OTEL_SERVICE_NAME": "checkout"},
    )
    send = stack.receiver.one("send ", **{"tandem.model": "sim:9"})
    assert send.service == "checkout"  # OTEL_SERVICE_NAME, else tandem-producer
    assert send.status[0] == ERROR
    assert send.attributes["error.type"] == out["error"]
    assert out["error"] in send.status[1]


def test_a_plain_celery_publisher_with_opentelemetry_joins_the_trace(stack):
    """opentelemetry-instrumentation-celery writes the publisher's context into the
    message's headers; the worker's spans join that trace."""
    pytest.importorskip("opentelemetry.instrumentation.celery")
    code = f"""
        import json
        from celery import Celery
        from opentelemetry import trace
        from opentelemetry.instrumentation.celery import CeleryInstrumentor
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
            endpoint="{stack.receiver.url}/v1/traces")))
        trace.set_tracer_provider(provider)
        CeleryInstrumentor().instrument()
        url = "{stack.settings.redis_url}"
        app = Celery("plain", broker=url, backend=url)
        with trace.get_tracer("caller").start_as_current_span("caller") as span:
            kwargs = {{"model": "sim:1", "inputs": [7]}}
            result = app.send_task("tandem.infer", kwargs=kwargs, queue="{keys.l1("sim:1")}")
            trace_id = format(span.get_span_context().trace_id, "032x")
        print(json.dumps({{"id": result.id, "trace": trace_id, "value": result.get(timeout=30)}}))
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert out["value"] == [7]
    process = stack.receiver.one("process ", **{"messaging.message.id": out["id"]})
    publish = stack.receiver.by_id(process.parent_id)
    assert publish.trace_id == process.trace_id == out["trace"]
    assert publish.kind == PRODUCER and publish.name == "apply_async/tandem.infer"


def test_http_and_grpc_requests_with_a_traceparent_join_its_trace(stack):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    rows = np.arange(4, dtype=np.float32).reshape(2, 2)
    for n, (client, module) in enumerate(
        [
            (httpclient.InferenceServerClient(stack.url.removeprefix("http://")), httpclient),
            (grpcclient.InferenceServerClient(stack.grpc["gateway"]), grpcclient),
        ]
    ):
        trace_id, parent_id = f"{n + 1:032x}", f"{n + 1:016x}"
        x = module.InferInput("x", list(rows.shape), "FP32")
        x.set_data_from_numpy(rows)
        got = client.infer(
            "sim", [x], model_version="1", headers={"traceparent": f"00-{trace_id}-{parent_id}-01"}
        )
        assert np.array_equal(got.as_numpy("y"), rows)
        spans = wait_for_trace(stack.receiver, trace_id, count=1 + 1 + 2 * 2)
        (server,) = [s for s in spans if s.kind == SERVER]
        assert server.parent_id == parent_id and server.service == "tandem-gateway"
        (send,) = [s for s in spans if s.kind == PRODUCER]
        assert child_of(send, server) and send.attributes["messaging.batch.message_count"] == 2
        processes = [s for s in spans if s.kind == CONSUMER]
        assert len(processes) == 2 and all(child_of(p, send) for p in processes)
        if module is httpclient:
            assert server.name.startswith("POST /v2/models/{name}") and server.name.endswith(
                "/infer"
            )
            assert server.attributes["http.response.status_code"] == 200
        else:
            assert server.name == "inference.GRPCInferenceService/ModelInfer"
            assert server.attributes["rpc.grpc.status_code"] == 0


def wait_for_trace(receiver: Receiver, trace_id: str, count: int) -> list[Span]:
    from helpers import wait_until

    return wait_until(
        lambda: (spans := receiver.trace(trace_id)) and len(spans) >= count and spans,
        30,
        f"{count} spans of trace {trace_id}",
    )


_SENT = """
import sys
sent = []  # each message as submit routes it
route = client.table.route
client.table.route = lambda model, msg, **kw: sent.append(msg) or route(model, msg, **kw)
value = client.submit("%s", [3]).get(timeout=30)
tracing = ("tandem.producers.tracing", "opentelemetry.sdk.trace")
ours = [m for m in sys.modules if m.startswith(tracing)]
print(json.dumps({"value": value, "sent": sent, "ours": ours}))
"""


def test_without_the_extra_or_the_variables_nothing_is_recorded(stack, tmp_path):
    """Without the extra (hidden, as if not installed) a worker and a producer serve as
    ever; with it but without the variables, tandem imports none of its tracing either.
    Neither sends a trace context. (redis-py imports OpenTelemetry's API by itself where
    it is installed: its own metrics, off unless set up.)"""
    hidden = hide_modules(tmp_path, "opentelemetry")
    stack.worker("untraced", models=("sim:5",), sim_base_ms=0, sim_per_item_ms=0, env=hidden)
    for env in (hidden, {}):
        out = produce(stack, _SENT % "sim:5", env)
        assert out["value"] == [3] and out["ours"] == []
        (sent,) = out["sent"]
        assert "traceparent" not in json.loads(sent)["headers"]
    assert not stack.receiver.find("send ", **{"tandem.model": "sim:5"})


def test_with_the_variables_but_no_sdk_it_says_so_and_serves(stack, tmp_path):
    env = {**hide_modules(tmp_path, "opentelemetry"), **stack.receiver.env()}
    stack.worker("no-sdk", models=("sim:7",), sim_base_ms=0, sim_per_item_ms=0, env=env)
    out = produce(
        stack,
        'print(json.dumps({"value": client.submit("sim:7", [5]).get(timeout=30)}))',
        env,
    )
    assert out["value"] == [5]
    for said in (out["stderr"], stack.log("no-sdk")):
        assert "OpenTelemetry's SDK is not installed" in said and "tandem-serve[otel]" in said
    assert not stack.receiver.find("send ", **{"tandem.model": "sim:7"})


def test_a_misconfigured_exporter_stops_a_worker_with_the_reason(stack):
    env = {**os.environ, "OTEL_TRACES_EXPORTER": "nonesuch"}
    done = tandem("worker", "--model", "sim:1", redis_url=stack.settings.redis_url, env=env)
    assert done.returncode != 0
    assert "OTEL_TRACES_EXPORTER names 'nonesuch'" in done.stderr and "[otel]" in done.stderr


_TEXT = st.text(max_size=12)


@given(st.dictionaries(st.sampled_from([*tracing.ASKING, "OTEL_SDK_DISABLED", "PATH"]), _TEXT))
def test_whether_the_variables_ask_for_traces(env):
    asked = tracing.asked(env)
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        assert not asked
    elif "OTEL_TRACES_EXPORTER" in env:
        assert asked == (env["OTEL_TRACES_EXPORTER"].strip().lower() not in ("", "none"))
    else:
        assert asked == any(env.get(name) for name in tracing.ASKING[1:])


def test_an_exporter_that_is_not_installed_is_named():
    with pytest.raises(BadArgument, match="'zipkin'"):
        tracing.exporters({"OTEL_TRACES_EXPORTER": "console,zipkin"})
    with pytest.raises(BadArgument, match="'thrift'"):
        tracing.exporters({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"})
    (console,) = tracing.exporters({"OTEL_TRACES_EXPORTER": " console "})
    assert type(console).__name__ == "ConsoleSpanExporter"


def test_a_producer_that_samples_nothing_sends_its_decision_and_nothing_is_recorded(stack):
    """OTEL_TRACES_SAMPLER=always_off at the producer: its message carries an unsampled
    traceparent, and the worker's parent-based sampler records nothing for it."""
    out = produce(
        stack, _SENT % "sim:1", {**stack.receiver.env(), "OTEL_TRACES_SAMPLER": "always_off"}
    )
    (sent,) = out["sent"]
    unsampled = json.loads(sent)["headers"]
    assert int(unsampled["traceparent"][-2:], 16) & 1 == 0  # W3C's sampled flag, clear
    assert out["value"] == [3]
    # A sampled task sent after it is traced; by then the first would have been too.
    app = plain_celery(stack.settings)
    APPS.append(app)
    later = app.send_task(
        "tandem.infer",
        kwargs={"model": "sim:1", "inputs": [4]},
        queue=keys.l1("sim:1"),
        headers={"traceparent": f"00-{7:032x}-{7:016x}-01"},
    )
    assert later.get(timeout=30) == [4]
    stack.receiver.one("process ", **{"messaging.message.id": later.id})
    assert not stack.receiver.find("process ", **{"messaging.message.id": unsampled["id"]})


_TRACEPARENT = st.builds(
    lambda t, s, f: f"00-{t:032x}-{s:016x}-{f}",
    st.integers(0, 2**128 - 1),
    st.integers(0, 2**64 - 1),
    st.sampled_from(["00", "01", "02", "03", "zz"]),
)


@given(st.one_of(st.text(max_size=80), _TRACEPARENT), st.text(max_size=40))
def test_any_trace_header_a_message_carries_makes_a_span_and_never_raises(parent, state):
    """A hostile or malformed traceparent (any text) neither stops a batch's hook nor
    joins a trace it does not name: a valid sampled one is the parent, one whose flags
    say unsampled is followed (no span), anything else a new root."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from tandem.broker.message import Task
    from tandem.workers.computed import Computed
    from tandem.workers.tracing import Traces

    exported = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exported))
    hook = Traces(provider.get_tracer("test"), "w@test")
    task = Task(raw=b"", id="t1", model="sim:1", queue="tandem.l1.sim.1", sent_at=1.0)
    task.trace = {"traceparent": parent, "tracestate": state}
    done = Computed([task], {0: [1]}, claimed_at=2.0, started_at=3.0, compute_ms=1.0)
    done.stored_at, done.store_ended_at = 4.0, 5.0

    class Executor:
        id, model_ref = "w@test/sim:1/1", "sim:1"

    hook.batch_done(Executor(), done)
    spans = {s.name: s for s in exported.get_finished_spans()}
    if parent[-2:] in {f"{n:02x}" for n in range(0, 256, 2)}:
        # Flags that say unsampled: the caller decided against a trace, and is followed.
        assert not spans
        return
    process = spans["process tandem.l1.sim.1"]
    valid = re.fullmatch(r"00-([0-9a-f]{32})-([0-9a-f]{16})-0[13]", parent.strip())
    if process.parent is not None:  # joined: only a trace the header names
        assert f"{process.parent.trace_id:032x}" in parent
    elif valid and set(valid[1]) != {"0"} and set(valid[2]) != {"0"}:
        raise AssertionError(f"a valid sampled traceparent was not joined: {parent!r}")


def test_a_task_revoked_before_its_claim_has_a_span_that_says_so(settings, r):
    """An executor (in this process, its spans to the SDK's in-memory exporter) claims a
    task revoked before it was sent: never computed, and its span's outcome is revoked."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from helpers import wait_until
    from tandem.broker.table import Table
    from tandem.producers.client import Client
    from tandem.workers.executor import Executor
    from tandem.workers.heartbeat import Heartbeat
    from tandem.workers.models.sim import SimModel
    from tandem.workers.tracing import Traces

    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    hook = Traces(provider.get_tracer(tracing.SCOPE), "t")
    settings = settings.replace(max_wait_ms=0.0)
    executor = Executor(
        "sim:1", SimModel(0, 0), table=Table(r), settings=settings, worker="t", hooks=[hook]
    )
    executor.start()
    heartbeat = Heartbeat(executor.table, [executor], interval_s=0.1, ttl_s=2).start()
    try:
        with Client(settings=settings) as client:
            client.revoke("revoked-early")
            wait_until(lambda: executor.revocations, 10, "the heartbeat to see the record")
            revoked = client.submit("sim:1", [1], task_id="revoked-early")
            served = client.submit("sim:1", [2])
            assert served.get(timeout=10) == [2]
            revoked.get(timeout=10, propagate=False)
            assert revoked.state == "REVOKED"
        wait_until(
            lambda: [s for s in spans.get_finished_spans() if s.name.startswith("process ")],
            10,
            "the task spans",
        )
    finally:
        heartbeat.stop(), executor.stop()
    (span,) = [
        s
        for s in spans.get_finished_spans()
        if s.name.startswith("process ") and s.attributes["messaging.message.id"] == "revoked-early"
    ]
    assert span.attributes["tandem.outcome"] == "revoked"
    assert span.attributes["error.type"] == "Revoked"
    assert span.status.status_code.name == "ERROR" and "revoked" in span.status.description
    (batch,) = [
        s for s in spans.get_finished_spans() if s.links and s.links[0].context == span.context
    ]
    # Its batch (the served task's too, if they came together) computed all but it.
    size = batch.attributes["tandem.batch.size"]
    assert batch.attributes["tandem.batch.computed"] == size - 1
