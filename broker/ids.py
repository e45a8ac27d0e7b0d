"""Random task ids and delivery tags: version-4 UUIDs, as Celery writes them."""

from __future__ import annotations

import os

#: Random UUIDs are made UUID_BATCH at a time, from one os.urandom call: a submit needs
#: two (the task id, the delivery tag), and a system call on its path costs more cold
#: than the rest of the id. A forked child starts with none of its parent's.
UUID_BATCH = 256
_uuids: list[str] = []
os.register_at_fork(after_in_child=_uuids.clear)


def new_uuid() -> str:
    """A random UUID, as str(uuid.uuid4()) writes it."""
    try:
        return _uuids.pop()  # atomic: threads never share one
    except IndexError:
        _uuids.extend(_make_uuids(UUID_BATCH))
        return _uuids.pop()


def _make_uuids(n: int) -> list[str]:
    """n version-4 UUIDs, made straight from random bytes (uuid.UUID's checks cost more
    than the bytes)."""
    raw = bytearray(os.urandom(16 * n))
    raw[6::16] = bytes(b & 0x0F | 0x40 for b in raw[6::16])  # version 4
    raw[8::16] = bytes(b & 0x3F | 0x80 for b in raw[8::16])  # the RFC 4122 variant
    h = raw.hex()
    return [
        f"{h[i : i + 8]}-{h[i + 8 : i + 12]}-{h[i + 12 : i + 16]}-{h[i + 16 : i + 20]}-"
        f"{h[i + 20 : i + 32]}"
        for i in range(0, 32 * n, 32)
    ]
