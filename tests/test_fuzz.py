"""Decoding and validation are total: any bytes give a task or a BadInput, never a crash."""

from __future__ import annotations

import base64
import contextlib
import json
import uuid
from functools import cache

import msgpack
import pytest
import torch
from fuzzing import (
    EXAMPLES,
    deep,
    hostile_envelopes,
    hostile_messages,
    json_values,
    tensor_ext,
    valid_envelope,
)
from hypothesis import HealthCheck, example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from helpers import executors_of, wait_until
from tandem.broker import keys, message, payload, results
from tandem.broker.errors import BadInput, TandemError
from tandem.broker.settings import load_settings
from tandem.producers.client import Client
from tandem.workers.models import load_model

FUZZ = hsettings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
#: Each example pushes a list of hostile messages through real workers.
THROUGH_WORKERS = hsettings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def check_task(task: message.Task) -> None:
    assert task.error is None or isinstance(task.error, BadInput), repr(task.error)
    if task.id is not None:
        assert isinstance(task.id, str) and 0 < len(task.id) <= message.MAX_ID_CHARS
        meta = json.loads(results.failure(task.id, task.error or BadInput("x")))
        assert meta["task_id"] == task.id
    if task.error is None:
        assert isinstance(task.model, str) and task.id is not None
    if task.error is not None:
        assert len(str(task.error)) < 400  # one clear line, never the whole message


@FUZZ
@given(hostile_messages)
def test_decode_never_raises_on_hostile_messages(raw):
    check_task(message.decode(raw, max_bytes=1 << 20))


@FUZZ
@given(st.binary(max_size=300))
def test_decode_never_raises_on_any_bytes(raw):
    check_task(message.decode(raw, max_bytes=1 << 20))


@FUZZ
@given(hostile_envelopes())
def test_hostile_envelopes_keep_a_usable_id(raw):
    task = message.decode(raw, max_bytes=1 << 20)
    check_task(task)
    headers = json.loads(raw).get("headers")
    sent = headers.get("id") if isinstance(headers, dict) else None
    if message._task_id(sent) is not None:
        assert task.id == sent


@FUZZ
@given(
    st.binary(max_size=200)
    | tensor_ext().map(msgpack.packb)
    | st.lists(tensor_ext()).map(msgpack.packb)
)
def test_payload_loads_raises_only_bad_input(data):
    with contextlib.suppress(BadInput):
        payload.loads(data)


tensors = st.builds(
    lambda dtype, shape: torch.zeros(shape, dtype=getattr(torch, dtype)),
    st.sampled_from(payload.DTYPES),
    st.lists(st.integers(min_value=0, max_value=4), max_size=4),
)


@cache
def model(ref: str):
    return load_model(ref, load_settings(env={}, device="cpu"))[1]


@FUZZ
@given(
    st.sampled_from(["tiny:1", "sim:1", "cnn:1"]),
    json_values | tensors,
)
@example("cnn:1", [10**400, 0.0])  # found by this test: torch.tensor overflowed
@example("tiny:1", [10**400] * 8)
def test_validators_raise_only_tandem_errors(ref, inputs):
    with contextlib.suppress(TandemError):
        model(ref).validate(inputs)


@FUZZ
@given(json_values, st.integers(min_value=0, max_value=2))
def test_oversized_messages_keep_their_id_when_it_is_plain(inputs, extra):
    envelope = valid_envelope(inputs=inputs)
    raw = json.dumps(envelope).encode()
    task = message.decode(raw, max_bytes=max(1, len(raw) - 1 - extra))
    assert "over the" in str(task.error)
    assert task.id == envelope["headers"]["id"]


def reported_messages() -> dict[str, bytes]:
    """The messages that took the whole model down before decoding was total."""

    def with_(change) -> bytes:
        envelope = valid_envelope()
        envelope["headers"]["id"] = str(uuid.uuid4())
        change(envelope)
        return json.dumps(envelope).encode()

    negative = msgpack.ExtType(payload.TENSOR_EXT, msgpack.packb(["float32", [-1, -4], b"\0" * 16]))
    tensor_body = base64.b64encode(
        msgpack.packb([[], {"model": "sim:1", "inputs": negative}, {}])
    ).decode()
    return {
        "properties null": with_(lambda e: e.update(properties=None)),
        "properties []": with_(lambda e: e.update(properties=[])),
        "body of [": with_(
            lambda e: e.update(body=base64.b64encode(deep(100_000).encode()).decode())
        ),
        "envelope of [": deep(100_000).encode(),
        "sent_at 10**400": with_(lambda e: e["headers"].update(tandem_sent_at=10**400)),
        "negative shape": with_(
            lambda e: e.update(body=tensor_body, **{"content-type": payload.CONTENT_TYPE})
        ),
        "id null": with_(lambda e: e["headers"].update(id=None)),
        "deep inputs": with_(
            lambda e: e.update(
                body=base64.b64encode(
                    (
                        '[[], {"model": "sim:1", "inputs": ' + deep(500) + "]" * 500 + "}, {}]"
                    ).encode()
                ).decode()
            )
        ),
        "headers a list": with_(lambda e: e.update(headers=[1, 2])),
    }


#: A reported message that is harmless once decoding is total: the bad header is ignored.
RUNS_ANYWAY = {"sent_at 10**400"}


@pytest.mark.parametrize("name", sorted(reported_messages()))
def test_the_reported_messages_decode_to_a_clear_bad_input(name):
    raw = reported_messages()[name]
    task = message.decode(raw, max_bytes=1 << 20)
    check_task(task)
    if name in RUNS_ANYWAY:
        assert task.error is None and task.sent_at is None
        return
    assert isinstance(task.error, BadInput)
    headers = json.loads(raw).get("headers") if raw[:1] == b"{" else None
    expected = headers.get("id") if isinstance(headers, dict) else None
    assert task.id == expected  # "id": null and broken envelopes have none: dead letters


def wait_results(r, ids, timeout_s=60):
    def stored():
        metas = r.mget([keys.result(i) for i in ids])
        return all(metas) and [json.loads(m) for m in metas]

    return wait_until(stored, timeout_s, f"{len(ids)} results")


def test_the_reported_messages_do_not_take_the_model_down(processes, r, settings):
    processes.coordinator()
    processes.worker("w1")
    processes.worker("w2")
    raws = reported_messages()
    for raw in raws.values():
        r.lpush(keys.l1("sim:1"), raw)
    decoded = {name: message.decode(raw, max_bytes=1 << 20) for name, raw in raws.items()}
    with_id = {name: task.id for name, task in decoded.items() if task.id}
    metas = dict(zip(with_id, wait_results(r, list(with_id.values())), strict=True))
    for name, meta in metas.items():
        if name in RUNS_ANYWAY:
            assert meta["status"] == "SUCCESS"
        else:
            assert meta["status"] == "FAILURE" and meta["result"]["exc_type"] == "BadInput", name
    with Client(settings=settings) as client:
        good = [client.submit("sim:1", [n]) for n in range(20)]
        assert [g.get(timeout=30) for g in good] == [[n] for n in range(20)]
    # Each executor goes IDLE in its next step, just after its last result is out.
    wait_until(
        lambda: [executors_of(r, w)[0].state for w in ("w1", "w2")] == ["IDLE", "IDLE"],
        10,
        "both executors IDLE",
    )
    assert r.llen(keys.DEAD) == len(raws) - len(with_id)
    assert "crashed" not in processes.log("w1") + processes.log("w2")


def test_generated_hostile_messages_through_real_workers(processes, r, settings):
    processes.coordinator()
    processes.worker("w1")
    processes.worker("w2")
    client = Client(settings=settings)

    @THROUGH_WORKERS
    @given(st.lists(hostile_messages, min_size=1, max_size=8))
    def run(raws):
        decoded = [message.decode(raw, max_bytes=settings.max_message_bytes) for raw in raws]
        ids = {t.id for t in decoded if t.id}
        if ids:
            r.delete(*[keys.result(i) for i in ids])
        good = []
        for raw in raws:
            r.lpush(keys.l1("sim:1"), raw)
            good.append(client.submit("sim:1", [len(good)]))
        wait_results(r, sorted(ids | {g.id for g in good}))
        assert [g.get(timeout=30) for g in good] == [[n] for n in range(len(good))]

    try:
        run()
    finally:
        client.close()
    # Each executor goes IDLE in its next step, just after its last result is out.
    wait_until(
        lambda: [executors_of(r, w)[0].state for w in ("w1", "w2")] == ["IDLE", "IDLE"],
        10,
        "both executors IDLE",
    )
    assert "crashed" not in processes.log("w1") + processes.log("w2")
