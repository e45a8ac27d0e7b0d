"""The bad input catalogue: each gets a clear FAILURE, and the executor survives it."""

from __future__ import annotations

import base64
import json

import pytest

from helpers import plain_celery, wait_until
from tandem.broker import keys, message
from tandem.broker.errors import BadInput
from tandem.producers.client import Client


@pytest.fixture
def served(processes, settings, r):
    processes.worker("w1", models=("sim:1", "tiny:1"), max_message_bytes=20_000)
    with Client(settings=settings) as client:
        yield client, plain_celery(settings)
    assert processes.started[0].poll() is None, "the worker died"


def push(r, model: str, envelope: dict | bytes) -> None:
    raw = envelope if isinstance(envelope, bytes) else json.dumps(envelope)
    r.lpush(keys.l1(model), raw)


def failure(r, task_id: str) -> str:
    meta = json.loads(wait_until(lambda: r.get(keys.result(task_id)), 15, f"result {task_id}"))
    assert meta["status"] == "FAILURE"
    return f"{meta['result']['exc_type']}: {meta['result']['exc_message'][0]}"


def envelope(model: str, inputs, **changes) -> dict:
    task_id, raw = message.encode(model, inputs, queue=keys.l1(model))
    out = json.loads(raw)
    for key, value in changes.items():
        out[key] = value
    return out


def test_catalogue(served, r):
    client, plain = served
    good = client.submit_many("tiny:1", [[1.0] * 8] * 3)
    cases = {}

    bad_body = envelope("sim:1", 1, body=base64.b64encode(b"{not json").decode())
    push(r, "sim:1", bad_body)
    cases[bad_body["headers"]["id"]] = "BadInput: malformed body"

    pickled = envelope("sim:1", 1, **{"content-type": "application/x-python-serialize"})
    push(r, "sim:1", pickled)
    cases[pickled["headers"]["id"]] = "content type 'application/x-python-serialize' refused"

    other = plain.send_task("other.task", args=[1], queue=keys.l1("sim:1"))
    cases[other.id] = "BadInput: unknown task name 'other.task'"

    unknown = plain.send_task(
        "tandem.infer", kwargs={"model": "sim:9", "inputs": 1}, queue=keys.l1("sim:1")
    )
    cases[unknown.id] = "UnknownModel: task asks for model 'sim:9'"

    shape = client.submit("tiny:1", [[1.0] * 8])
    cases[shape.id] = "BadInput: tiny expects a list of 8 numbers"

    oversized = plain.send_task(
        "tandem.infer", kwargs={"model": "sim:1", "inputs": "x" * 30_000}, queue=keys.l1("sim:1")
    )
    cases[oversized.id] = "-byte limit"

    empty = client.submit("tiny:1", [])
    cases[empty.id] = "BadInput: tiny expects a list of 8 numbers, got a list of 0"

    nan_in = plain.send_task(
        "tandem.infer",
        kwargs={"model": "tiny:1", "inputs": [float("nan")] * 8},
        queue=keys.l1("tiny:1"),
    )
    cases[nan_in.id] = "BadInput: tiny refuses NaN and infinite inputs"

    unstorable = plain.send_task(
        "tandem.infer", kwargs={"model": "sim:1", "inputs": [float("inf")]}, queue=keys.l1("sim:1")
    )
    cases[unstorable.id] = "BadInput: result cannot be stored as JSON"

    push(r, "sim:1", b"\x00\x01 not even json")

    for task_id, text in cases.items():
        assert text in failure(r, task_id), task_id
    wait_until(lambda: r.llen(keys.DEAD) == 1, 10, "the unreadable message dead-lettered")
    outputs = [res.get(timeout=10) for res in good]
    assert all(out == pytest.approx(outputs[0], abs=1e-5) for out in outputs)
    assert client.submit("sim:1", ["still serving"]).get(timeout=10) == ["still serving"]


def test_the_client_refuses_what_json_cannot_carry(served):
    client, _ = served
    with pytest.raises(BadInput, match="NaN and infinity are not JSON"):
        client.submit("tiny:1", [float("nan")] * 8)
    with pytest.raises(BadInput, match="cannot be sent as JSON: ") as refused:
        client.submit("sim:1", {1, 2})
    assert "set is not JSON serializable" in str(refused.value)
    assert "NaN" not in str(refused.value)  # a set is not a NaN


def test_a_huge_number_of_tiny_tasks(processes, settings, r):
    processes.worker("w1", sim_base_ms=0.0, sim_per_item_ms=0.0)
    client = Client(settings=settings)
    results = []
    for start in range(0, 20_000, 2_000):
        results += client.submit_many("sim:1", list(range(start, start + 2_000)))
    result_keys = [keys.result(res.id) for res in results]
    wait_until(lambda: r.exists(*result_keys) == len(results), 120, "20,000 results")
    values = [json.loads(raw)["result"] for raw in r.mget(result_keys)]
    assert values == list(range(20_000))
    client.close()
