"""The binary tensor payload: msgpack, with each tensor as an extension type.

Content type ``application/x-tandem-tensor``. A message body is the usual
Celery protocol-2 triple ``[args, kwargs, embed]`` packed with msgpack, where
any tensor (a torch tensor or a numpy array) is the msgpack ExtType 1 whose data
is itself msgpack: ``[dtype, shape, raw]``. ``dtype`` is a numpy-style name
("float32", "int64", ...), ``shape`` a list of ints, ``raw`` the C-order bytes,
little-endian (tandem runs on little-endian hosts). Decoding gives
torch tensors. Nothing here ever unpickles.
"""

from __future__ import annotations

import math
from typing import Any

import msgpack

from tandem.broker.errors import BadInput

CONTENT_TYPE = "application/x-tandem-tensor"
CODEC = "tandem-tensor"
TENSOR_EXT = 1

DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")


def _pack_tensor(obj: Any) -> msgpack.ExtType | None:
    if hasattr(obj, "detach") and hasattr(obj, "dtype"):  # torch.Tensor
        tensor = obj.detach().cpu().contiguous()
        name, shape = str(tensor.dtype).removeprefix("torch."), list(tensor.shape)
        if name not in DTYPES:
            raise ValueError(f"unsupported tensor dtype {name!r}")
        raw = tensor.numpy().tobytes()
    elif hasattr(obj, "tobytes") and hasattr(obj, "dtype") and hasattr(obj, "shape"):  # numpy
        name, shape = str(obj.dtype), list(obj.shape)
        raw = obj.astype(obj.dtype.newbyteorder("<"), copy=False).tobytes(order="C")
    else:
        return None
    if name not in DTYPES:
        raise ValueError(f"unsupported tensor dtype {name!r}")
    return msgpack.ExtType(TENSOR_EXT, msgpack.packb([name, shape, raw]))


def _default(obj: Any) -> Any:
    packed = _pack_tensor(obj)
    if packed is None:
        raise TypeError(f"cannot encode {type(obj).__name__} in a tandem-tensor payload")
    return packed


#: Most dimensions a tensor in a payload may have.
MAX_DIMS = 16


def _ext_hook(code: int, data: bytes) -> Any:
    if code != TENSOR_EXT:
        raise BadInput(f"unknown msgpack extension type {code}")
    import torch

    parts = msgpack.unpackb(data, raw=False)
    if not (isinstance(parts, list) and len(parts) == 3):
        raise BadInput("malformed tensor: expected [dtype, shape, raw]")
    name, shape, raw = parts
    if not isinstance(name, str) or name not in DTYPES:
        raise BadInput(f"unsupported tensor dtype {name!r:.40}; use one of {', '.join(DTYPES)}")
    if not (
        isinstance(shape, list)
        and len(shape) <= MAX_DIMS
        and all(type(d) is int and d >= 0 for d in shape)
    ):
        raise BadInput(f"malformed tensor shape {shape!r:.60}: up to {MAX_DIMS} sizes >= 0")
    if not isinstance(raw, bytes):
        raise BadInput("malformed tensor: raw data must be bytes")
    dtype = getattr(torch, name)
    count = math.prod(shape)
    size = torch.empty(0, dtype=dtype).element_size()
    if count * size != len(raw):
        got = f"{len(raw) // size} values" if len(raw) % size == 0 else f"{len(raw)} bytes"
        raise BadInput(f"tensor of shape {shape} needs {count} {name} values, got {got}")
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    if name == "bool" and bool((flat.view(torch.uint8) > 1).any()):
        raise BadInput("malformed tensor: bool values must be 0 or 1")
    return flat.reshape(shape)


def dumps(value: Any) -> bytes:
    """Pack a value, tensors included."""
    return msgpack.packb(value, default=_default, use_bin_type=True)


def loads(data: bytes) -> Any:
    """Unpack a value; tensors come back as torch tensors. Raises BadInput and nothing else."""
    try:
        return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except BadInput:
        raise
    except Exception as e:  # noqa: BLE001 - any malformed payload is bad input
        raise BadInput(f"malformed tensor payload: {type(e).__name__}: {str(e)[:80]}") from None


def register() -> None:
    """Register the codec with kombu, so Celery clients can send serializer='tandem-tensor'."""
    from kombu.serialization import register as kombu_register

    kombu_register(CODEC, dumps, loads, content_type=CONTENT_TYPE, content_encoding="binary")
