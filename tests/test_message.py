"""Message encoding and decoding, as pure logic."""

import base64
import json
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

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


def reference_envelope(model, inputs, queue, task_id, priority, expires, sent_at, tag) -> dict:
    """The envelope as nested dicts, as encode() built it before it wrote the JSON out."""
    triple = [[], {"model": model, "inputs": inputs}, message._EMBED]
    body = json.dumps(triple, separators=(",", ":")).encode()
    return {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {
            "lang": "py",
            "task": "tandem.infer",
            "id": task_id,
            "shadow": None,
            "eta": None,
            "expires": expires.isoformat() if expires else None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": task_id,
            "parent_id": None,
            "argsrepr": "()",
            "kwargsrepr": f"{{'model': {model!r}, 'inputs': ...}}",
            "origin": "tandem",
            "ignore_result": False,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
            "tandem_sent_at": sent_at,
        },
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": priority,
            **(
                {"expiration": str(max(0, round((expires.timestamp() - sent_at) * 1000)))}
                if expires
                else {}
            ),
            "body_encoding": "base64",
            "delivery_tag": tag,
        },
    }


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(
    model=st.text(min_size=1, max_size=20),
    inputs=json_values,
    task_id=st.text(min_size=1, max_size=40),
    priority=st.integers(0, 9),
    expires=st.none() | st.datetimes(timezones=st.just(timezone.utc)),
    queue=st.text(max_size=30),
)
def test_the_envelope_is_the_json_of_its_fields_for_any_values(
    model, inputs, task_id, priority, expires, queue
):
    _, envelope = message.encode(
        model, inputs, queue=queue, task_id=task_id, priority=priority, expires=expires
    )
    got = json.loads(envelope)
    sent_at, tag = got["headers"]["tandem_sent_at"], got["properties"]["delivery_tag"]
    want = reference_envelope(model, inputs, queue, task_id, priority, expires, sent_at, tag)
    assert got == want
    assert json.dumps(got) == json.dumps(want)  # the same keys in the same order


_celery_app = None


def celery_amqp():
    """A Celery app's AMQP helper, made once: as_task_v2 needs no broker connection."""
    global _celery_app
    if _celery_app is None:
        from celery import Celery

        _celery_app = Celery("envelope-check", broker="memory://", set_as_current=False)
    return _celery_app.amqp


@given(
    model=st.text(min_size=1, max_size=20),
    inputs=json_values,
    task_id=st.text(min_size=1, max_size=40),
    priority=st.integers(0, 9),
    expires=st.none()
    | st.datetimes(timezones=st.sampled_from([timezone.utc, timezone(timedelta(hours=-5))])),
)
def test_headers_and_body_are_celerys_own_as_task_v2_for_any_values(
    model, inputs, task_id, priority, expires
):
    """Celery's own as_task_v2, for the same task, makes the same headers (but for those
    that name the sender, and tandem's send time) and the same (args, kwargs, embed)."""
    kwargs = {"model": model, "inputs": inputs}
    celery = celery_amqp().as_task_v2(
        task_id, message.TASK_NAME, args=(), kwargs=kwargs, expires=expires, priority=priority
    )
    _, envelope = message.encode(
        model, inputs, queue="q", task_id=task_id, priority=priority, expires=expires
    )
    ours = json.loads(envelope)
    headers = json.loads(json.dumps(celery.headers))  # as JSON carries them
    sender = {"origin", "kwargsrepr"}  # tandem leaves the inputs out of kwargsrepr
    assert list(ours["headers"]) == [*headers, "tandem_sent_at"]
    for name, value in headers.items():
        if name not in sender:
            assert ours["headers"][name] == value, name
    assert ours["properties"]["correlation_id"] == celery.properties["correlation_id"]
    assert ours["properties"]["reply_to"] == celery.properties["reply_to"]
    body = json.loads(base64.b64decode(ours["body"]))
    assert body == json.loads(json.dumps(celery.body))


def test_the_envelope_is_the_one_celery_itself_publishes(settings, r):
    """Celery's own send_task (as_task_v2, kombu's Redis transport) writes a message into
    a real Redis list; tandem's encode, for the same task, writes the same envelope: the
    same keys at every level, the same values but for those that name the sender or are
    new per message, and a body that decodes to the same (args, kwargs, embed)."""
    from helpers import plain_celery

    expires = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=5)
    queue = "tandem.envelope.check"
    kwargs = {"model": "sim:1", "inputs": [[1.5, -2], {"a": [3]}]}
    plain_celery(settings).send_task(
        message.TASK_NAME, kwargs=kwargs, queue=queue, task_id="id-1", expires=expires
    )
    celery = json.loads(r.lindex(queue, 0))
    _, written = message.encode(
        "sim:1", kwargs["inputs"], queue=queue, task_id="id-1", expires=expires
    )
    ours = json.loads(written)
    assert ours.keys() == celery.keys()
    extra = {"tandem_sent_at"}  # tandem's own header: the send time, for the SLO
    assert ours["headers"].keys() - extra == celery["headers"].keys()
    assert ours["properties"].keys() == celery["properties"].keys()
    sender = {"origin", "argsrepr", "kwargsrepr", "ignore_result"}
    for name, value in celery["headers"].items():
        if name not in sender:
            assert ours["headers"][name] == value, name
    fresh = {"delivery_tag", "reply_to", "expiration"}  # reply_to: the sending app's id
    for name, value in celery["properties"].items():
        if name not in fresh:
            assert ours["properties"][name] == value, name
    # ms left until it expires, as each sender counted them when it sent
    left = [int(m["properties"]["expiration"]) for m in (ours, celery)]
    assert abs(left[0] - left[1]) < 5000
    for name in ("content-type", "content-encoding"):
        assert ours[name] == celery[name]
    body = [json.loads(base64.b64decode(m["body"])) for m in (ours, celery)]
    assert body[0] == body[1]


def test_an_id_with_a_lone_surrogate_is_still_sent_as_json():
    """orjson refuses lone surrogates; such an envelope is written by json, escaped."""
    _, envelope = message.encode("m:1", 1, queue="q", task_id="id-\ud800")
    assert json.loads(envelope)["headers"]["id"] == "id-\ud800"
