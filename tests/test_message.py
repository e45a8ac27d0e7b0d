"""Message encoding and decoding, as pure logic."""

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest

from tandem.broker import keys, message
from tandem.broker.errors import BadInput, DeadlineExceeded


def test_round_trip():
    task_id, raw = message.encode("m:1", {"a": [1.5]}, queue=keys.l1("m:1"), priority=3)
    task = message.decode(raw.encode(), max_bytes=1 << 20)
    assert (task.id, task.model, task.inputs, task.error) == (task_id, "m:1", {"a": [1.5]}, None)
    envelope = json.loads(raw)
    assert envelope["properties"]["priority"] == 3
    assert envelope["properties"]["delivery_info"]["routing_key"] == "tandem.l1.m.1"
    assert envelope["headers"]["task"] == "tandem.infer"


def test_expired_tasks_get_a_deadline_error():
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    _, raw = message.encode("m:1", 1, queue="q", expires=past)
    task = message.decode(raw.encode(), max_bytes=1 << 20)
    task.check_deadline(datetime.now(timezone.utc))
    assert isinstance(task.error, DeadlineExceeded)


@pytest.mark.parametrize(
    ("mutate", "error"),
    [
        (lambda e: e["headers"].update(task="other.task"), "unknown task name 'other.task'"),
        (lambda e: e.update({"content-type": "application/x-python-serialize"}), "refused"),
        (lambda e: e.update(body=base64.b64encode(b"[[1], {}, {}]").decode()), "missing inputs"),
        (lambda e: e.update(body=base64.b64encode(b"[[1], {}]").decode()), "malformed body"),
        (lambda e: e["headers"].update(expires="soon"), "malformed expires"),
    ],
)
def test_bad_messages_keep_their_id_and_say_why(mutate, error):
    task_id, raw = message.encode("m:1", 1, queue="q")
    envelope = json.loads(raw)
    mutate(envelope)
    task = message.decode(json.dumps(envelope).encode(), max_bytes=1 << 20)
    assert task.id == task_id
    assert isinstance(task.error, BadInput)
    assert error in str(task.error)


def test_garbage_has_no_id():
    task = message.decode(b"\x80garbage", max_bytes=100)
    assert task.id is None
    assert "malformed message" in str(task.error)


def test_oversized_messages_are_refused():
    _, raw = message.encode("m:1", "x" * 1000, queue="q")
    task = message.decode(raw.encode(), max_bytes=500)
    assert "over the 500-byte limit" in str(task.error)


def test_model_names_are_checked():
    assert keys.l1("resnet18:1") == "tandem.l1.resnet18.1"
    assert keys.l1_for_priority("m:1", 4) == "tandem.l1.m.1\x06\x163"
    for bad in ("resnet", "a.b:1", "a:1:2", ":1", "a:"):
        with pytest.raises(ValueError):
            keys.parse_model(bad)
