"""Open Inference Protocol (v2) tensors: JSON data and Triton's binary data extension.

A request body is JSON, or, with the header Inference-Header-Content-Length: N, N bytes
of JSON followed by the raw bytes of every input whose parameters carry
`binary_data_size`, in input order. Raw numbers are little-endian C order; a BYTES
element is a 4-byte little-endian length and its bytes. Anything malformed raises
BadInput with the reason; nothing here trusts a size or a count it was sent.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tandem.broker.errors import BadInput

#: OIP datatype -> numpy dtype (little-endian); BYTES elements are Python str.
DATATYPES = {
    "BOOL": np.dtype("bool"),
    "UINT8": np.dtype("<u1"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": None,
}
#: tandem's dtype names (broker/payload.py; "string" for tokenizer text) -> OIP datatype.
FROM_DTYPE = {
    "bool": "BOOL",
    "uint8": "UINT8",
    "int8": "INT8",
    "int16": "INT16",
    "int32": "INT32",
    "int64": "INT64",
    "float16": "FP16",
    "float32": "FP32",
    "float64": "FP64",
    "string": "BYTES",
}
#: Most dimensions and elements one tensor of a request may declare.
MAX_DIMS = 16
MAX_ELEMENTS = 1 << 26


@dataclass
class Tensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    #: A numpy array of `shape`, or for BYTES a flat list of str.
    value: Any


@dataclass
class Requested:
    name: str
    binary: bool


@dataclass
class InferRequest:
    inputs: list[Tensor]
    #: The outputs asked for, or None for all of them.
    outputs: list[Requested] | None
    binary_output: bool = False
    id: str | None = None
    parameters: dict = field(default_factory=dict)


def _refuse_constant(name: str) -> None:
    raise BadInput(f"{name} is not JSON")


def loads(data: bytes | str) -> Any:
    """Strict JSON: NaN and Infinity refused, errors as BadInput."""
    try:
        return json.loads(data, parse_constant=_refuse_constant)
    except BadInput:
        raise
    except (ValueError, RecursionError) as e:
        raise BadInput(f"invalid JSON: {str(e)[:200]}") from None


def loads_object(data: bytes) -> dict:
    """A strict JSON object, else BadInput."""
    raw = loads(data)
    if not isinstance(raw, dict):
        raise BadInput("the request must be a JSON object")
    return raw


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """An infer request from its body and its Inference-Header-Content-Length header."""
    if header_length is None:
        head, rest = body, b""
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise BadInput("Inference-Header-Content-Length is not an integer") from None
        if not 0 < n <= len(body):
            raise BadInput(
                f"Inference-Header-Content-Length {n} does not fit a body of {len(body)} bytes"
            )
        head, rest = body[:n], body[n:]
    raw = loads_object(head)
    inputs = raw.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise BadInput("'inputs' must be a non-empty list")
    parameters = _dict(raw.get("parameters"), "parameters")
    offset = 0
    tensors = []
    for n, item in enumerate(inputs):
        tensor, used = _input(item, n, rest, offset)
        offset += used
        tensors.append(tensor)
    if offset != len(rest):
        raise BadInput(f"{len(rest) - offset} bytes of binary data follow the inputs' own")
    names = [t.name for t in tensors]
    if len(set(names)) != len(names):
        raise BadInput("an input is named twice")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise BadInput("parameters.binary_data_output must be true or false")
    request_id = raw.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadInput("'id' must be a string")
    return InferRequest(
        inputs=tensors,
        outputs=_requested(raw.get("outputs"), binary_output),
        binary_output=binary_output,
        id=request_id,
        parameters=parameters,
    )


def _dict(value: Any, what: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadInput(f"{what} must be an object")
    return value


def _requested(raw: Any, binary_output: bool) -> list[Requested] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise BadInput("'outputs' must be a list")
    out = []
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadInput("each requested output must be an object with a 'name'")
        binary = _dict(item.get("parameters"), "an output's parameters").get(
            "binary_data", binary_output
        )
        if not isinstance(binary, bool):
            raise BadInput("an output's parameters.binary_data must be true or false")
        out.append(Requested(item["name"], binary))
    return out


def _input(item: Any, n: int, rest: bytes, offset: int) -> tuple[Tensor, int]:
    """One input tensor, and how many bytes of binary data it took from rest[offset:]."""
    if not isinstance(item, dict):
        raise BadInput(f"input {n} must be an object")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise BadInput(f"input {n} has no 'name'")
    label = f"input {name[:64]!r}"
    datatype = item.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        raise BadInput(f"{label}: datatype {str(datatype)[:32]!r} is not one of {list(DATATYPES)}")
    shape = item.get("shape")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
    ):
        raise BadInput(f"{label}: 'shape' must be a list of at most {MAX_DIMS} sizes >= 0")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise BadInput(f"{label}: {count} elements is over the limit of {MAX_ELEMENTS}")
    size = _dict(item.get("parameters"), f"{label} parameters").get("binary_data_size")
    if size is None:
        if "data" not in item:
            raise BadInput(f"{label} has neither 'data' nor parameters.binary_data_size")
        value = from_values(item["data"], datatype, shape, count, label)
        return Tensor(name, datatype, tuple(shape), value), 0
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise BadInput(f"{label}: binary_data_size must be an integer >= 0")
    if "data" in item:
        raise BadInput(f"{label} has both 'data' and binary_data_size")
    if offset + size > len(rest):
        raise BadInput(f"{label}: binary_data_size {size} runs past the end of the body")
    raw = rest[offset : offset + size]
    value = from_raw(raw, datatype, shape, count, label)
    return Tensor(name, datatype, tuple(shape), value), size


def _flatten(data: Any, label: str) -> list:
    """OIP data may be flat or nested as the shape: the elements in row-major order."""
    if not isinstance(data, list):
        raise BadInput(f"{label}: 'data' must be a list")
    out, stack = [], [iter(data)]
    while stack:
        for value in stack[-1]:
            if isinstance(value, list):
                if len(stack) > MAX_DIMS:
                    raise BadInput(f"{label}: 'data' is nested too deep")
                stack.append(iter(value))
                break
            out.append(value)
        else:
            stack.pop()
    return out


def from_values(data: Any, datatype: str, shape: list[int], count: int, label: str) -> Any:
    """A tensor from JSON values (flat or nested as the shape), checked against its
    datatype: a numpy array, or for BYTES a list of str."""
    flat = _flatten(data, label)
    if len(flat) != count:
        raise BadInput(f"{label}: {len(flat)} values for shape {shape} ({count} elements)")
    if datatype == "BYTES":
        if not all(isinstance(v, str) for v in flat):
            raise BadInput(f"{label}: BYTES data must be strings")
        return flat
    if datatype == "BOOL":
        if not all(isinstance(v, bool) for v in flat):
            raise BadInput(f"{label}: BOOL data must be true or false")
    elif not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
        raise BadInput(f"{label}: {datatype} data must be numbers")
    elif datatype[:2] != "FP" and not all(isinstance(v, int) for v in flat):
        raise BadInput(f"{label}: {datatype} data must be integers")
    dtype = DATATYPES[datatype]
    try:
        array = np.array(flat, dtype=dtype)
    except (OverflowError, ValueError) as e:
        raise BadInput(f"{label}: a value does not fit {datatype}: {e}") from None
    if datatype[:2] == "FP" and not np.isfinite(array).all():
        raise BadInput(f"{label}: a value does not fit {datatype}")
    return array.reshape(shape)


def from_raw(raw: bytes, datatype: str, shape: list[int], count: int, label: str) -> Any:
    """A tensor from its raw bytes (little-endian C order; BYTES length-prefixed)."""
    if datatype == "BYTES":
        return _bytes_elements(raw, count, label)
    dtype = DATATYPES[datatype]
    assert dtype is not None  # every datatype but BYTES has one
    if len(raw) != count * dtype.itemsize:
        raise BadInput(
            f"{label}: {len(raw)} bytes of binary data for {count} {datatype} elements "
            f"({count * dtype.itemsize} bytes)"
        )
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if datatype == "BOOL" and not np.isin(np.frombuffer(raw, dtype=np.uint8), (0, 1)).all():
        raise BadInput(f"{label}: BOOL bytes must be 0 or 1")
    return array


def _bytes_elements(raw: bytes, count: int, label: str) -> list[str]:
    out, offset = [], 0
    for _ in range(count):
        if offset + 4 > len(raw):
            raise BadInput(f"{label}: BYTES data ends inside an element's length")
        (size,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + size > len(raw):
            raise BadInput(f"{label}: a BYTES element runs past its binary data")
        try:
            out.append(raw[offset : offset + size].decode())
        except UnicodeDecodeError:
            raise BadInput(f"{label}: a BYTES element is not UTF-8 text") from None
        offset += size
    if offset != len(raw):
        raise BadInput(f"{label}: {len(raw) - offset} bytes follow the last BYTES element")
    return out


def encode_output(name: str, datatype: str, array: np.ndarray, binary: bool) -> tuple[dict, bytes]:
    """One output's JSON entry, and its raw bytes when sent as binary data."""
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if binary:
        raw = np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
        entry["parameters"] = {"binary_data_size": len(raw)}
        return entry, raw
    entry["data"] = array.reshape(-1).tolist()
    return entry, b""


def response_body(head: dict, raws: list[bytes]) -> tuple[bytes, int | None]:
    """The response body, and the header length to send when binary data follows."""
    text = json.dumps(head, separators=(",", ":")).encode()
    if not any(raws):
        return text, None
    return text + b"".join(raws), len(text)
