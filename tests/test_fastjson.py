"""fastjson.loads is json.loads, value for value and error for error; results.loads is
kombu's loads, which Celery's backend decodes results with. Pure logic, any input."""

import json

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kombu.utils.json import object_hook

from tandem.broker import fastjson, results

#: What results.loads replaced: kombu's decoder, as Celery's backend runs it.
KOMBU = json.JSONDecoder(object_hook=object_hook).decode

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats()
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
#: JSON numbers as text, some past what a double or 64 bits hold.
numbers = st.from_regex(r"\A-?(0|[1-9][0-9]{0,40})(\.[0-9]{1,40})?([eE][+-]?[0-9]{1,4})?\Z")


def outcome(loads, data):
    """The value (by repr: NaN equals NaN, 1 differs from 1.0 and True, -0.0 from 0.0)
    or the type of the error that loads gives."""
    try:
        return repr(loads(data))
    except (ValueError, RecursionError) as e:
        return type(e)


def same_as_json(data) -> None:
    assert outcome(fastjson.loads, data) == outcome(json.loads, data)


@settings(max_examples=500)
@given(values, st.booleans(), st.sampled_from([None, (",", ":")]))
def test_any_json_value_reads_as_json_reads_it(value, ascii_only, separators):
    text = json.dumps(value, ensure_ascii=ascii_only, separators=separators)
    same_as_json(text)
    same_as_json(text.encode("utf-8", "surrogatepass"))


@settings(max_examples=500)
@given(numbers)
@example("123456789012345678901234567890")  # orjson reads it as a float
@example("-9223372036854775809")
@example("18446744073709551616")
@example("1e400")
def test_numbers_read_as_json_reads_them(text):
    same_as_json(text)
    same_as_json(f'[{text}, {{"n": {text}}}]'.encode())


@settings(max_examples=500)
@given(st.binary() | st.text())
@example(b"\xef\xbb\xbf{}")  # a UTF-8 byte order mark
@example('{"a": 1}'.encode("utf-16"))
@example(b'["\\ud800"]')  # a lone surrogate
@example(b"[NaN, Infinity, -Infinity]")
@example(b"[" * 5000 + b"]" * 5000)  # deeper than orjson reads
@example(b'{"a": 1, "a": 2}')
def test_any_bytes_or_text_read_as_json_reads_them(data):
    same_as_json(data)


def test_orjson_reads_the_plain_case_and_json_the_rest(monkeypatch):
    """The case the module is for, a message or a result, never reaches json.loads."""
    calls = []
    monkeypatch.setattr(fastjson.json, "loads", lambda data: calls.append(data))
    data = b'{"status": "SUCCESS", "result": [1, 2.5, "x"], "children": []}'
    assert fastjson.loads(data) == orjson.loads(data)
    assert calls == []
    for other in (b"[NaN]", b"[12345678901234567890]"):
        fastjson.loads(other)
    assert calls == [b"[NaN]", b"[12345678901234567890]"]


@settings(max_examples=500)
@given(values | st.fixed_dictionaries({"__type__": st.text(), "__value__": values}))
def test_results_read_as_kombu_reads_them(value):
    text = json.dumps({"status": "SUCCESS", "result": value, "children": []})
    for data in (text, text.encode("utf-8", "surrogatepass")):
        assert outcome(results.loads, data) == outcome(
            KOMBU, data.decode("utf-8", "surrogatepass") if isinstance(data, bytes) else data
        )


@pytest.mark.parametrize(
    "text",
    [
        '{"result": {"__type__": "datetime", "__value__": "2026-12-06T00:00:00"}}',
        '{"result": {"\\u005f_type__": "datetime", "__value__": "2026-12-06T00:00:00"}}',
        '{"result": {"__type__": "bytes", "__value__": "aGk="}}',
    ],
)
def test_kombu_type_markers_are_read_even_escaped(text):
    assert results.loads(text.encode()) == KOMBU(text)
    assert results.loads(text.encode())["result"] != json.loads(text)["result"]
