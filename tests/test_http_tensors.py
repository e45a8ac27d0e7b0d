"""The Open Inference Protocol tensor codec (producers/http/tensors.py): any bytes give a
request or a BadInput, never another error; what it encodes, tritonclient decodes."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tandem.broker.errors import BadInput
from tandem.producers.http.tensors import (
    DATATYPES,
    encode_output,
    parse_request,
    response_body,
)

tritonclient_http = pytest.importorskip("tritonclient.http")

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=30,
)
tensor_dicts = st.fixed_dictionaries(
    {
        "name": st.text(max_size=3) | json_values,
        "datatype": st.sampled_from(list(DATATYPES)) | json_values,
    },
    optional={
        "shape": st.lists(st.integers(-3, 5), max_size=4) | json_values,
        "data": json_values,
        "parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-2, 40)})
        | json_values,
    },
)
requests = st.fixed_dictionaries(
    {"inputs": st.lists(tensor_dicts, max_size=3) | json_values},
    optional={"outputs": json_values, "parameters": json_values, "id": json_values},
)


def parse_or_refuse(body: bytes, header: str | None) -> None:
    try:
        parse_request(body, header)
    except BadInput as e:
        assert str(e)


@given(st.binary(max_size=300), st.none() | st.text(max_size=6))
def test_any_bytes_parse_or_are_refused_with_bad_input(body, header):
    parse_or_refuse(body, header)


@given(requests, st.binary(max_size=64), st.booleans())
def test_any_request_shape_parses_or_is_refused_with_bad_input(request, tail, with_header):
    head = json.dumps(request).encode()
    if with_header:
        parse_or_refuse(head + tail, str(len(head)))
    else:
        parse_or_refuse(head, None)


@given(
    st.sampled_from(["FP32", "FP64", "INT64", "INT8", "BOOL", "FP16", "UINT8"]),
    st.lists(st.integers(1, 4), min_size=1, max_size=3),
    st.booleans(),
)
def test_tritonclient_decodes_what_the_gateway_encodes(datatype, shape, binary):
    dtype = DATATYPES[datatype]
    array = (np.arange(int(np.prod(shape))) % 2).astype(dtype).reshape(shape)
    entry, raw = encode_output("y", datatype, array, binary)
    body, header_length = response_body({"model_name": "m", "outputs": [entry]}, [raw])
    result = tritonclient_http.InferResult.from_response_body(body, header_length=header_length)
    assert np.array_equal(result.as_numpy("y"), array)


@given(st.lists(st.text(max_size=10), min_size=1, max_size=5), st.booleans())
def test_what_tritonclient_sends_parses_back(texts, binary):
    strings = tritonclient_http.InferInput("text", [len(texts), 1], "BYTES")
    strings.set_data_from_numpy(np.array(texts, dtype=object).reshape(-1, 1), binary_data=binary)
    floats = tritonclient_http.InferInput("x", [2, 3], "FP32")
    values = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    floats.set_data_from_numpy(values, binary_data=binary)
    body, header_length = tritonclient_http.InferenceServerClient.generate_request_body(
        [strings, floats]
    )
    parsed = parse_request(body, None if header_length is None else str(header_length))
    assert parsed.inputs[0].value == texts
    assert np.array_equal(parsed.inputs[1].value, values)
