"""The gateway's gRPC side: a real gateway process, a real Redis, real workers, and the
client Triton users already have (tritonclient.grpc, sync and aio). No assertion on speed.

One stack serves the module, the one test_http.py uses (conftest.gateway_stack)."""

from __future__ import annotations

import asyncio
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from conftest import gateway_stack
from helpers import wait_until
from tandem.broker import keys
from tandem.broker.table import Table
from tandem.producers.client import Client

grpcclient = pytest.importorskip("tritonclient.grpc")
import grpc  # noqa: E402  (after the skip: grpcio comes with tritonclient[grpc])
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from tritonclient.grpc import aio as grpcaio  # noqa: E402
from tritonclient.grpc import service_pb2, service_pb2_grpc  # noqa: E402
from tritonclient.utils import InferenceServerException  # noqa: E402


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with gateway_stack(tmp_path_factory.mktemp("grpc")) as procs:
        yield procs


@pytest.fixture(scope="module")
def address(stack) -> str:
    return stack.grpc["gateway"]


@pytest.fixture(scope="module")
def triton(address):
    client = grpcclient.InferenceServerClient(address)
    yield client
    client.close()


@pytest.fixture(scope="module")
def direct(stack):
    with Client(settings=stack.settings) as client:
        yield client


def tensor(name: str, array: np.ndarray, datatype: str = "FP32"):
    out = grpcclient.InferInput(name, list(array.shape), datatype)
    out.set_data_from_numpy(array)
    return out


def code_of(call) -> grpc.StatusCode | str:
    try:
        call()
    except InferenceServerException as e:
        return e.status()
    return "OK"


# Real clients


def test_tritonclient_sees_health_metadata_and_config(triton):
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny") and triton.is_model_ready("tiny", "1")
    assert code_of(lambda: triton.is_model_ready("nope")) == "StatusCode.NOT_FOUND"
    meta = triton.get_model_metadata("tiny", as_json=True)
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": ["-1", "8"]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": ["-1", "4"]}]
    config = triton.get_model_config("tiny", "1", as_json=True)["config"]
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": ["8"]}]
    assert triton.get_server_metadata().name == "tandem"


def test_a_batch_with_raw_contents_equals_a_direct_submit(triton, direct):
    rows = np.arange(24, dtype=np.float32).reshape(3, 8) / 7
    got = triton.infer("tiny", [tensor("x", rows)]).as_numpy("y")
    expected = [direct.submit("tiny:1", row.tolist()).get(timeout=30) for row in rows]
    assert got.shape == (3, 4)
    # Equal up to float rounding: a batch of 3 and 3 batches of 1 sum in different orders.
    assert np.allclose(got, np.asarray(expected, dtype=np.float32), rtol=1e-5, atol=1e-6)


def test_a_variable_length_model_answers_each_item(triton, direct):
    for length in (1, 5, 17):
        rows = np.arange(4 * length, dtype=np.float32).reshape(4, length) - 3
        got = triton.infer("sim", [tensor("x", rows)], model_version="1").as_numpy("y")
        expected = [direct.submit("sim:1", row.tolist()).get(timeout=30) for row in rows]
        assert np.array_equal(got, np.asarray(expected, dtype=np.float32))


def test_triton_priority_and_timeout_parameters_are_taken(triton):
    rows = [tensor("x", np.ones((1, 8), np.float32))]
    answer = triton.infer("tiny", rows, priority=2, timeout=5_000_000)  # µs, Triton's unit
    assert answer.as_numpy("y").shape == (1, 4)


def test_typed_contents_are_read_as_raw_ones_are(address, triton):
    rows = np.arange(16, dtype=np.float32).reshape(2, 8)
    request = service_pb2.ModelInferRequest(model_name="tiny", id="typed-1")
    given_input = request.inputs.add(name="x", datatype="FP32", shape=[2, 8])
    given_input.contents.fp32_contents.extend(rows.reshape(-1).tolist())
    with grpc.insecure_channel(address) as channel:
        answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert answer.id == "typed-1" and answer.model_name == "tiny" and answer.model_version == "1"
    (output,) = answer.outputs
    got = np.frombuffer(answer.raw_output_contents[0], "<f4").reshape(list(output.shape))
    assert np.allclose(got, triton.infer("tiny", [tensor("x", rows)]).as_numpy("y"))


def test_the_asyncio_client_does_the_same(address, direct):
    rows = np.ones((2, 8), np.float32) / 3

    async def main():
        client = grpcaio.InferenceServerClient(address)
        try:
            assert await client.is_server_ready() and await client.is_model_ready("tiny")
            meta = await client.get_model_metadata("tiny", as_json=True)
            answer = await client.infer("tiny", [tensor("x", rows)])
            return meta, answer.as_numpy("y")
        finally:
            await client.close()

    meta, got = asyncio.run(main())
    assert meta["name"] == "tiny"
    expected = [direct.submit("tiny:1", row.tolist()).get(timeout=30) for row in rows]
    assert np.allclose(got, np.asarray(expected, np.float32), rtol=1e-5, atol=1e-6)


def test_a_stream_answers_each_request_and_each_error(triton):
    answers: list = []
    done = threading.Condition()

    def callback(result, error):
        with done:
            answers.append((result, error))
            done.notify_all()

    triton.start_stream(callback)
    try:
        rows = np.ones((2, 8), np.float32)
        triton.async_stream_infer("tiny", [tensor("x", rows)], request_id="a")
        triton.async_stream_infer(
            "tiny", [tensor("x", np.ones((1, 7), np.float32))], request_id="b"
        )
        triton.async_stream_infer("sim", [tensor("x", rows)], request_id="c")
        with done:
            assert done.wait_for(lambda: len(answers) == 3, 30)
    finally:
        triton.stop_stream()
    good = {r.get_response().id: r for r, e in answers if e is None}
    bad = [e for _, e in answers if e is not None]
    assert set(good) == {"a", "c"} and good["c"].as_numpy("y").shape == (2, 8)
    assert len(bad) == 1 and "shape [1, 7], expected [-1, 8]" in str(bad[0])


def test_the_standard_health_check_answers(address):
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            reply = health.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as e:
            health.Check(health_pb2.HealthCheckRequest(service="nope"))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND


def test_grpc_requests_are_counted_beside_http_ones(stack, triton):
    import httpx

    triton.infer("tiny", [tensor("x", np.ones((3, 8), np.float32))])
    text = httpx.get(stack.url + "/metrics").text
    assert 'tandem_gateway_items_total{model="tiny:1",protocol="grpc"}' in text
    assert 'tandem_gateway_requests_total{protocol="grpc",route="ModelInfer",status="OK"}' in text


# Errors, deadlines and cancellation


@pytest.mark.parametrize(
    ("model", "rows", "datatype", "code", "fragment"),
    [
        ("tiny", np.ones((1, 7), np.float32), "FP32", "INVALID_ARGUMENT", "shape [1, 7]"),
        ("tiny", np.ones((1, 8), np.int64), "INT64", "INVALID_ARGUMENT", "datatype INT64"),
        ("tiny", np.ones((0, 8), np.float32), "FP32", "INVALID_ARGUMENT", "the batch is empty"),
        ("nope", np.ones((1, 8), np.float32), "FP32", "NOT_FOUND", "'nope'"),
    ],
)
def test_bad_requests_get_their_status_with_the_reason(
    triton, model, rows, datatype, code, fragment
):
    with pytest.raises(InferenceServerException) as e:
        triton.infer(model, [tensor("x", rows, datatype)])
    assert e.value.status() == f"StatusCode.{code}" and fragment in e.value.message()


def test_raw_contents_that_do_not_match_get_invalid_argument(address):
    request = service_pb2.ModelInferRequest(model_name="tiny")
    request.inputs.add(name="x", datatype="FP32", shape=[2, 8])
    request.raw_input_contents.append(np.ones(15, np.float32).tobytes())
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as e:
        service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bytes of binary data" in e.value.details()


def _working(table: Table, model: str) -> bool:
    return all(e.state == "WORKING" for e in table.executors(model))


def _computed(table: Table, model: str) -> int:
    return sum(e.tasks for e in table.executors(model))


def _busy(stack, triton) -> threading.Thread:
    """sim:2 computing one task (300 ms) from a thread of its own."""
    table = Table(redis.Redis.from_url(stack.settings.redis_url))
    busy = threading.Thread(
        target=triton.infer,
        args=("sim", [tensor("x", np.ones((1, 1), np.float32))]),
        kwargs={"model_version": "2"},
    )
    busy.start()
    wait_until(lambda: _working(table, "sim:2"), 10, "sim:2 to be computing")
    return busy


def test_a_deadline_shorter_than_the_wait_is_refused_at_once_and_never_computed(stack, triton):
    table = Table(redis.Redis.from_url(stack.settings.redis_url))
    one = [tensor("x", np.ones((1, 1), np.float32))]
    for _ in range(3):  # sim:2's speed, learnt
        triton.infer("sim", one, model_version="2")
    wait_until(lambda: table.speed("sim:2") is not None, 30, "sim:2's speed")
    busy = _busy(stack, triton)
    before = _computed(table, "sim:2")
    with pytest.raises(InferenceServerException) as e:
        triton.infer("sim", one, model_version="2", client_timeout=0.1)
    busy.join()
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED", e.value
    assert "deadline" in e.value.message()
    # Only the busy task was computed: the refused one never reached a queue.
    wait_until(lambda: _computed(table, "sim:2") == before + 1, 10, "the busy task counted")
    assert table.l1_depth("sim:2") == 0


def test_a_cancelled_call_revokes_its_tasks(stack, triton):
    admin = redis.Redis.from_url(stack.settings.redis_url)
    table = Table(admin)
    busy = _busy(stack, triton)
    revoked_before = set(admin.zrange(keys.REVOKED, 0, -1))
    answers: list = []
    call = triton.async_infer(
        "sim",
        [tensor("x", np.ones((1, 1), np.float32))],
        lambda result, error: answers.append(error),
        model_version="2",
    )
    wait_until(lambda: table.l1_depth("sim:2") == 1, 10, "the call's task to wait in L1")
    call.cancel()
    fresh = wait_until(
        lambda: set(admin.zrange(keys.REVOKED, 0, -1)) - revoked_before, 10, "a revocation"
    )
    (task_id,) = [t.decode() for t in fresh]
    assert "CANCELLED" in str(wait_until(lambda: answers, 10, "the client's callback")[0])
    busy.join()
    meta = wait_until(lambda: admin.get(keys.result(task_id)), 10, "the revoked task's result")
    assert b'"REVOKED"' in meta
    admin.close()


# A strict gateway: auth and a small message limit


@pytest.fixture(scope="module")
def strict(stack) -> str:
    stack.gateway("strict", "--token=s3cret", "--max-body-mb=0.01")
    return stack.grpc["strict"]


AUTH = {"authorization": "Bearer s3cret"}


def test_a_token_is_required_except_for_health(strict):
    client = grpcclient.InferenceServerClient(strict)
    rows = [tensor("x", np.ones((1, 8), np.float32))]
    assert code_of(lambda: client.infer("tiny", rows)) == "StatusCode.UNAUTHENTICATED"
    wrong = {"authorization": "Bearer no"}
    assert code_of(lambda: client.infer("tiny", rows, headers=wrong)) == (
        "StatusCode.UNAUTHENTICATED"
    )
    assert client.infer("tiny", rows, headers=AUTH).as_numpy("y").shape == (1, 4)
    assert client.is_server_live() and client.is_server_ready()
    client.close()


def test_messages_over_the_limit_get_resource_exhausted(strict):
    client = grpcclient.InferenceServerClient(strict)
    big = [tensor("x", np.ones((1000, 8), np.float32))]  # 32 kB, over 0.01 MiB
    assert code_of(lambda: client.infer("tiny", big, headers=AUTH)) == (
        "StatusCode.RESOURCE_EXHAUSTED"
    )
    assert client.is_server_live()
    client.close()


# Hostile requests: any message the protocol can carry, bent out of shape

names = st.sampled_from(["x", "y", ""]) | st.text(max_size=6)
datatypes = st.sampled_from(["FP32", "FP16", "BYTES", "BOOL", "INT64", "UINT64", "nope", ""])
hostile_inputs = st.fixed_dictionaries(
    {
        "name": names,
        "datatype": datatypes,
        "shape": st.lists(st.integers(-3, 9), max_size=4),
        "fp32": st.lists(st.floats(width=32, allow_nan=True), max_size=12),
        "bytes": st.lists(st.binary(max_size=6), max_size=3),
    }
)
hostile = st.fixed_dictionaries(
    {
        "model": st.sampled_from(["tiny", "sim", "nope", ""]),
        "version": st.sampled_from(["", "1", "9", "x"]),
        "inputs": st.lists(hostile_inputs, max_size=3),
        "raw": st.none() | st.lists(st.binary(max_size=64), max_size=3),
        "outputs": st.lists(names, max_size=2),
        "priority": st.none() | st.integers(-3, 20),
    }
)


def _request(case: dict):
    request = service_pb2.ModelInferRequest(model_name=case["model"], model_version=case["version"])
    for item in case["inputs"]:
        given_input = request.inputs.add(
            name=item["name"], datatype=item["datatype"], shape=item["shape"]
        )
        given_input.contents.fp32_contents.extend(item["fp32"])
        given_input.contents.bytes_contents.extend(item["bytes"])
    for raw in case["raw"] or ():
        request.raw_input_contents.append(raw)
    for name in case["outputs"]:
        request.outputs.add(name=name)
    if case["priority"] is not None:
        request.parameters["priority"].int64_param = case["priority"]
    return request


@hypothesis_settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=hostile)
def test_hostile_requests_get_an_error_status_and_the_server_serves_on(address, case):
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            answer = stub.ModelInfer(_request(case), timeout=30)
        except grpc.RpcError as e:
            assert e.code() in (
                grpc.StatusCode.INVALID_ARGUMENT,
                grpc.StatusCode.NOT_FOUND,
            ), (case, e.code(), e.details())
            assert e.details()
        else:  # bent, but still valid
            assert answer.outputs and len(answer.raw_output_contents) == len(answer.outputs)
        assert stub.ServerLive(service_pb2.ServerLiveRequest()).live


@hypothesis_settings(max_examples=60, deadline=None)
@given(junk=st.binary(max_size=300))
def test_bytes_that_are_no_message_get_an_error_and_the_server_serves_on(address, junk):
    with grpc.insecure_channel(address) as channel:
        call = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            request_serializer=None,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        try:
            call(junk, timeout=30)
        except grpc.RpcError as e:
            assert e.code() != grpc.StatusCode.OK
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ServerLive(service_pb2.ServerLiveRequest()).live


def test_the_readme_examples_run_as_written(address):
    root = Path(__file__).resolve().parent.parent
    tour = (root / "README.md").read_text().split("**From any gRPC client**", 1)[1]
    tour = tour.split("**Models**", 1)[0]
    sync, aio = re.findall(r"```python\n(.*?)```", tour, flags=re.S)
    scope: dict = {}
    exec(sync.replace("localhost:8001", address), scope)
    assert scope["y"].shape == (2, 4)
    scope = {}
    exec(aio.replace("localhost:8001", address), scope)
    assert np.array_equal(scope["y"], np.arange(15, dtype=np.float32).reshape(3, 5))


def test_triton_extensions_tandem_does_not_serve_say_so(triton):
    with pytest.raises(InferenceServerException) as e:
        triton.get_model_repository_index()
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "tandem does not serve" in e.value.message()
    assert triton.is_server_live()
