"""Open Inference Protocol tensors over gRPC: a ModelInferRequest read into the same
InferRequest as an HTTP body (producers/http/tensors.py), and outputs written back.

An input's values come from `raw_input_contents` (one entry per input, in order, when
the request has any: little-endian C order; a BYTES element a 4-byte little-endian
length and its bytes) or from its typed `contents`. Outputs are always sent as
`raw_output_contents`, as Triton does. Anything malformed raises BadInput with the
reason; nothing here trusts a size or a count it was sent.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import numpy as np

from tandem.broker.errors import BadInput
from tandem.producers.http.tensors import (
    DATATYPES,
    MAX_DIMS,
    MAX_ELEMENTS,
    InferRequest,
    Requested,
    Tensor,
    from_raw,
    from_values,
)

#: The typed contents field of each datatype (FP16 has none: raw contents only).
CONTENTS = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter(value: Any) -> Any:
    """An InferParameter's value (bool, int, str or float), None if it holds none."""
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def read_request(request: Any) -> InferRequest:
    """The inputs, the outputs asked for, the id and the parameters of a request."""
    raws = list(request.raw_input_contents)
    if raws and len(raws) != len(request.inputs):
        raise BadInput(
            f"{len(raws)} raw_input_contents for {len(request.inputs)} inputs: "
            "give one per input, in order, or none"
        )
    inputs = [_input(item, n, raws[n] if raws else None) for n, item in enumerate(request.inputs)]
    outputs = [Requested(o.name, True) for o in request.outputs] or None
    parameters = {key: parameter(value) for key, value in request.parameters.items()}
    return InferRequest(inputs, outputs, True, request.id or None, parameters)


def _input(item: Any, n: int, raw: bytes | None) -> Tensor:
    if not item.name:
        raise BadInput(f"input {n} has no name")
    label = f"input {item.name[:64]!r}"
    datatype = item.datatype
    if datatype not in DATATYPES:
        raise BadInput(f"{label}: datatype {datatype[:32]!r} is not one of {list(DATATYPES)}")
    shape = list(item.shape)
    if len(shape) > MAX_DIMS or any(d < 0 for d in shape):
        raise BadInput(f"{label}: shape must be at most {MAX_DIMS} sizes >= 0")
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise BadInput(f"{label}: {count} elements is over the limit of {MAX_ELEMENTS}")
    field = CONTENTS.get(datatype)
    typed = field is not None and item.HasField("contents") and len(getattr(item.contents, field))
    if raw is not None:
        if typed:
            raise BadInput(f"{label} has both contents and raw_input_contents")
        value = from_raw(raw, datatype, shape, count, label)
    elif field is None:
        raise BadInput(f"{label}: {datatype} needs raw_input_contents")
    else:
        values = list(getattr(item.contents, field)) if typed else []
        if datatype == "BYTES":
            values = [_text(v, label) for v in values]
        value = from_values(values, datatype, shape, count, label)
    return Tensor(item.name, datatype, tuple(shape), value)


def _text(value: bytes, label: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise BadInput(f"{label}: a BYTES element is not UTF-8 text") from None


def raw_output(datatype: str, array: np.ndarray) -> bytes:
    """An output's raw contents: little-endian C order, or length-prefixed BYTES."""
    if datatype == "BYTES":
        parts = []
        for value in array.reshape(-1):
            data = value if isinstance(value, bytes) else str(value).encode()
            parts += [struct.pack("<I", len(data)), data]
        return b"".join(parts)
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype]).tobytes()
