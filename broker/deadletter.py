"""Dead letters: what tandem could not serve, as JSON records in keys.DEAD (newest first).

A record::

    {"id": "..." or null, "model": "sim:1", "reason": "PoisonMessage: ...",
     "executors": ["w1@host/sim:1/ab12cd", ...], "at": "2026-12-02T14:00:00+00:00",
     "message": "<the raw message>"}

The message is kept as text, or as "message_b64" when its bytes are not UTF-8, and cut
to MAX_KEPT_BYTES ("truncated": true; such a letter cannot be requeued). The list is
capped (dead_letter_max) and expires dead_letter_ttl_s after its last entry.
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property

import redis

from tandem.broker import keys, message
from tandem.broker.errors import TandemError

#: Longest raw message a record keeps.
MAX_KEPT_BYTES = 64 * 1024


def record(
    raw: bytes,
    reason: str,
    *,
    task_id: str | None = None,
    model: str = "",
    executors: tuple[str, ...] | list[str] = (),
) -> str:
    """The JSON record of one dead letter."""
    kept = raw[:MAX_KEPT_BYTES]
    data: dict = {
        "id": task_id,
        "model": model or None,
        "reason": reason,
        "executors": list(executors),
        "at": datetime.now(timezone.utc).isoformat(),
        "at_s": round(time.time(), 3),  # epoch seconds: the scripts expire records by it
    }
    try:
        data["message"] = kept.decode("utf-8")
    except UnicodeDecodeError:
        data["message_b64"] = base64.b64encode(kept).decode()
    if len(raw) > MAX_KEPT_BYTES:
        data["truncated"] = True
    return json.dumps(data)


@dataclass(frozen=True)
class DeadLetter:
    """One parsed record; `stored` is its bytes in Redis, to remove exactly it."""

    stored: bytes
    reason: str
    id: str | None = None
    model: str | None = None
    executors: tuple[str, ...] = ()
    at: str = ""
    raw: bytes | None = field(default=None, repr=False)  # None: not kept whole

    @cached_property
    def blocked(self) -> str | None:
        """Why requeueing it would not serve it, or None if it can be requeued (its
        message decoded once, however often it is asked)."""
        if self.raw is None:
            return "its message was not kept whole"
        if not self.model:
            return "it names no model"
        try:
            keys.parse_model(self.model)
        except ValueError as e:
            return str(e)
        task = message.decode(self.raw, max_bytes=len(self.raw) + 1)
        if task.id is None:  # a worker would dead-letter it again at once
            reason = f" ({task.error})" if task.error else ""
            return f"its message carries no usable task id{reason}"
        return None

    def row(self) -> dict:
        return {
            "id": self.id,
            "model": self.model,
            "reason": self.reason,
            "executors": list(self.executors),
            "at": self.at,
            "requeueable": self.blocked is None,
        }


def parse(stored: bytes) -> DeadLetter:
    """Parse one stored record. Never raises: anything else is an unreadable letter."""
    try:
        data = json.loads(stored)
        if not isinstance(data, dict):
            raise ValueError("not an object")
        executors = data.get("executors")
        return DeadLetter(
            stored=stored,
            reason=_text(data, "reason") or "no reason recorded",
            id=_text(data, "id"),
            model=_text(data, "model"),
            executors=tuple(e for e in executors if isinstance(e, str))
            if isinstance(executors, list)
            else (),
            at=_text(data, "at") or "",
            raw=_raw(data),
        )
    except (ValueError, TypeError, RecursionError) as e:
        return DeadLetter(stored=stored, reason=f"unreadable dead-letter record: {e}"[:200])


def _text(data: dict, name: str) -> str | None:
    value = data.get(name)
    return value if isinstance(value, str) else None


def _raw(data: dict) -> bytes | None:
    if data.get("truncated") is True:
        return None
    if isinstance(data.get("message"), str):
        return data["message"].encode("utf-8", "surrogatepass")
    if isinstance(data.get("message_b64"), str):
        try:
            return base64.b64decode(data["message_b64"], validate=True)
        except binascii.Error:
            return None
    return None


def count(client: redis.Redis) -> int:
    return client.llen(keys.DEAD)


def read(client: redis.Redis, limit: int = 100) -> list[DeadLetter]:
    """The newest `limit` dead letters."""
    stored: list[bytes] = client.lrange(keys.DEAD, 0, max(limit, 1) - 1)  # type: ignore[assignment]
    return [parse(one) for one in stored]


def purge(client: redis.Redis) -> int:
    """Delete every dead letter; returns how many there were."""
    with client.pipeline() as pipe:  # MULTI: nothing added between the count and the delete
        pipe.llen(keys.DEAD)
        pipe.delete(keys.DEAD)
        return pipe.execute()[0]


def requeue(table, letter: DeadLetter) -> str:
    """Submit a dead letter's message again by the two-level rule, with a fresh delivery
    count, and drop the letter. Returns where it went; raises TandemError if it cannot."""
    if letter.blocked:
        raise TandemError(f"{letter.blocked}, so requeueing it would not serve it")
    chosen = table.requeue(letter.model, letter.raw, letter.stored)
    return f"L2 of {chosen}" if chosen else f"L1 of {letter.model}"
