"""Hypothesis strategies for hostile messages: generated, and mutated from valid ones."""

from __future__ import annotations

import base64
import json
import os
import uuid

import msgpack
from hypothesis import strategies as st

from tandem.broker import message, payload

#: Examples per fuzz test; CI runs the default, a long run sets TANDEM_FUZZ_EXAMPLES.
EXAMPLES = int(os.environ.get("TANDEM_FUZZ_EXAMPLES", "1700"))

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.sampled_from([10**400, -(10**400), 2**63, -(2**64)])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=8,
)

HEADER_KEYS = ("id", "task", "expires", "tandem_sent_at", "eta", "retries", "timelimit", "lang")
PROTO1_KEYS = ("task", "kwargs", "expires", "eta", "callbacks", "errbacks", "chord", "taskset")
ENVELOPE_KEYS = ("body", "content-type", "content-encoding", "headers", "properties")


def valid_envelope(model: str = "sim:1", inputs=None, binary: bool = False) -> dict:
    """A valid envelope, the same bytes every time (hypothesis needs deterministic data)."""
    inputs = [1, 2] if inputs is None else inputs
    task_id = "00000000-0000-4000-8000-000000000000"
    _, raw = message.encode(model, inputs, queue="tandem.l1.sim.1", task_id=task_id, binary=binary)
    envelope = json.loads(raw)
    envelope["headers"]["tandem_sent_at"] = 1.7e9
    envelope["properties"]["delivery_tag"] = task_id
    return envelope


def deep(n: int, opener: str = "[") -> str:
    return opener * n


@st.composite
def tensor_ext(draw) -> msgpack.ExtType:
    """A tensor extension, often malformed: any dtype name, shape and raw bytes."""
    dtype = draw(
        st.sampled_from([*payload.DTYPES, "complex64", "object", ""]) | st.text(max_size=8)
    )
    shape = draw(
        st.lists(st.integers(min_value=-3, max_value=6), max_size=4)
        | st.sampled_from([[2**40, 2**40], [-1], None, "3", [1.5]])
    )
    raw = draw(st.binary(max_size=64))
    parts = draw(st.sampled_from(["list", "short", "junk"]))
    if parts == "list":
        data = msgpack.packb([dtype, shape, raw])
    elif parts == "short":
        data = msgpack.packb([dtype, shape])
    else:
        data = draw(st.binary(max_size=32))
    return msgpack.ExtType(draw(st.sampled_from([payload.TENSOR_EXT, 2, 127])), data)


@st.composite
def bodies(draw) -> tuple[str, str]:
    """(content type, base64 body): JSON triples of any shape, msgpack ones, or junk."""
    kind = draw(st.sampled_from(["json", "msgpack", "junk", "deep", "proto1"]))
    if kind == "proto1":  # a protocol-1 body: id, task, args and kwargs in it
        body = draw(st.dictionaries(st.sampled_from(PROTO1_KEYS), json_values, max_size=6))
        body.update(args=draw(json_values), id=draw(st.just("p1") | json_values))
        raw = json.dumps(body).encode()
        content_type = message.JSON
    elif kind == "json":
        triple = draw(
            st.tuples(json_values, json_values, json_values).map(list)
            | json_values.map(lambda v: [[], {"model": "sim:1", "inputs": v}, {}])
        )
        raw = json.dumps(triple).encode()
        content_type = message.JSON
    elif kind == "msgpack":
        inputs = draw(tensor_ext() | st.lists(tensor_ext(), max_size=3))
        raw = msgpack.packb([[], {"model": "sim:1", "inputs": inputs}, {}])
        content_type = payload.CONTENT_TYPE
    elif kind == "deep":
        raw = deep(draw(st.integers(min_value=30, max_value=3000))).encode()
        content_type = draw(st.sampled_from([message.JSON, payload.CONTENT_TYPE]))
    else:
        raw = draw(st.binary(max_size=64))
        content_type = draw(st.sampled_from([message.JSON, payload.CONTENT_TYPE]))
    return content_type, base64.b64encode(raw).decode()


@st.composite
def hostile_envelopes(draw) -> bytes:
    """A valid envelope with some of its parts replaced by hostile values."""
    envelope = valid_envelope()
    envelope["headers"]["id"] = str(uuid.uuid4())
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        target = draw(st.sampled_from(["header", "envelope", "body", "properties"]))
        if target == "header":
            headers = envelope.get("headers")
            envelope["headers"] = headers if isinstance(headers, dict) else {}
            envelope["headers"][draw(st.sampled_from(HEADER_KEYS))] = draw(json_values)
        elif target == "envelope":
            envelope[draw(st.sampled_from(ENVELOPE_KEYS))] = draw(json_values)
        elif target == "body":
            envelope["content-type"], envelope["body"] = draw(bodies())
        else:
            envelope["properties"] = draw(
                json_values | st.just({"body_encoding": draw(json_values)})
            )
    return json.dumps(envelope).encode()


@st.composite
def mutated_bytes(draw) -> bytes:
    """A valid message with bytes flipped, cut or inserted."""
    raw = bytearray(json.dumps(valid_envelope(binary=draw(st.booleans()))).encode())
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        at = draw(st.integers(min_value=0, max_value=len(raw) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            raw[at] = draw(st.integers(min_value=0, max_value=255))
        elif action == "cut":
            del raw[at : at + draw(st.integers(min_value=1, max_value=20))]
        else:
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        if not raw:
            raw = bytearray(b"{")
    return bytes(raw)


hostile_messages = (
    hostile_envelopes()
    | mutated_bytes()
    | st.binary(max_size=200)
    | json_values.map(lambda v: json.dumps(v).encode())
)
