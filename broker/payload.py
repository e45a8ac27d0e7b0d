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

from typing import Any

import msgpack

CONTENT_TYPE = "application/x-tandem-tensor"
CODEC = "tandem-tensor"
TENSOR_EXT = 1

DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int16", "int32", "int64", "bool")


def _torch_dtype(name: str):
    import torch

    if name not in DTYPES:
        raise ValueError(f"unsupported tensor dtype {name!r}; use one of {', '.join(DTYPES)}")
    return getattr(torch, name)


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


def _ext_hook(code: int, data: bytes) -> Any:
    if code != TENSOR_EXT:
        raise ValueError(f"unknown msgpack extension type {code}")
    import torch

    name, shape, raw = msgpack.unpackb(data)
    dtype = _torch_dtype(name)
    flat = torch.frombuffer(bytearray(raw), dtype=dtype) if raw else torch.empty(0, dtype=dtype)
    count = 1
    for dim in shape:
        count *= dim
    if flat.numel() != count:
        raise ValueError(f"tensor of shape {shape} needs {count} {name} values, got {flat.numel()}")
    return flat.reshape(shape)


def dumps(value: Any) -> bytes:
    """Pack a value, tensors included."""
    return msgpack.packb(value, default=_default, use_bin_type=True)


def loads(data: bytes) -> Any:
    """Unpack a value; tensors come back as torch tensors."""
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def register() -> None:
    """Register the codec with kombu, so Celery clients can send serializer='tandem-tensor'."""
    from kombu.serialization import register as kombu_register

    kombu_register(CODEC, dumps, loads, content_type=CONTENT_TYPE, content_encoding="binary")
