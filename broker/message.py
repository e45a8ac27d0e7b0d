"""Celery protocol-2 messages, as kombu's Redis transport stores them in a list.

An L1 or L2 entry is the JSON envelope kombu writes::

    {"body": base64(JSON [args, kwargs, embed]), "content-type": "application/json",
     "content-encoding": "utf-8", "headers": {"task": "tandem.infer", "id": ..., ...},
     "properties": {"priority": 0, "body_encoding": "base64", "delivery_info": {...}, ...}}

tandem reads JSON bodies and the binary tensor payload of broker/payload.py.
Any other content type (pickle above all) is refused without being decoded.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import msgpack

from broker import payload
from broker.errors import BadInput, DeadlineExceeded, TandemError

TASK_NAME = "tandem.infer"
JSON = "application/json"
ACCEPTED = (JSON, payload.CONTENT_TYPE)
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


@dataclass
class Task:
    """One decoded message. `error` is set when the task must fail without compute."""

    raw: bytes
    id: str | None = None
    model: str = ""
    inputs: Any = None
    expires: datetime | None = None
    sent_at: float | None = None  # epoch seconds, from tandem producers only
    error: TandemError | None = field(default=None)

    def check_deadline(self, now: datetime) -> None:
        if self.error is None and self.expires is not None and self.expires <= now:
            self.error = DeadlineExceeded(f"task expired at {self.expires.isoformat()}")


def encode(
    model: str,
    inputs: Any,
    *,
    queue: str,
    task_id: str | None = None,
    priority: int = 0,
    expires: datetime | None = None,
    binary: bool = False,
) -> tuple[str, str]:
    """Build the kombu envelope for a tandem.infer task. Returns (task id, envelope JSON).

    binary: pack the body with the tensor payload codec instead of JSON.
    """
    task_id = task_id or str(uuid.uuid4())
    triple = [[], {"model": model, "inputs": inputs}, _EMBED]
    if binary:
        body = payload.dumps(triple)
    else:
        body = json.dumps(triple, separators=(",", ":"), allow_nan=False).encode()
    headers = {
        "lang": "py",
        "task": TASK_NAME,
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
        "tandem_sent_at": time.time(),
    }
    envelope = {
        "body": base64.b64encode(body).decode(),
        "content-encoding": "binary" if binary else "utf-8",
        "content-type": payload.CONTENT_TYPE if binary else JSON,
        "headers": headers,
        "properties": {
            "correlation_id": task_id,
            "reply_to": "",
            "delivery_mode": 2,
            "delivery_info": {"exchange": "", "routing_key": queue},
            "priority": priority,
            "body_encoding": "base64",
            "delivery_tag": str(uuid.uuid4()),
        },
    }
    return task_id, json.dumps(envelope, separators=(",", ":"))


def decode(raw: bytes, *, max_bytes: int) -> Task:
    """Decode one envelope. Never raises: a bad message comes back with `error` set."""
    task = Task(raw=raw)
    try:
        envelope = json.loads(raw)
        headers = envelope["headers"]
        task.id = str(headers["id"])
    except (ValueError, KeyError, TypeError):
        task.error = BadInput("malformed message: not a Celery protocol-2 envelope")
        return task
    try:
        _decode_body(task, envelope, headers, max_bytes)
    except BadInput as e:
        task.error = e
    return task


def _decode_body(task: Task, envelope: dict, headers: dict, max_bytes: int) -> None:
    if len(task.raw) > max_bytes:
        raise BadInput(f"message of {len(task.raw)} bytes is over the {max_bytes}-byte limit")
    if headers.get("task") != TASK_NAME:
        raise BadInput(f"unknown task name {headers.get('task')!r}; tandem runs {TASK_NAME}")
    content_type = envelope.get("content-type")
    if content_type not in ACCEPTED:
        raise BadInput(
            f"content type {content_type!r} refused; tandem accepts {' and '.join(ACCEPTED)}"
        )
    try:
        body = envelope["body"]
        if envelope.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        loads = json.loads if content_type == JSON else payload.loads
        args, kwargs, _embed = loads(body)
        task.model = kwargs["model"]
        task.inputs = kwargs["inputs"]
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as e:
        raise BadInput(f"malformed body: expected [[], {{model, inputs}}, embed] ({e})") from e
    if args:
        raise BadInput("tandem.infer takes keyword arguments model and inputs, not positional ones")
    task.expires = _parse_expires(headers.get("expires"))
    sent_at = headers.get("tandem_sent_at")
    task.sent_at = float(sent_at) if isinstance(sent_at, (int, float)) else None


def _parse_expires(value: Any) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except (TypeError, ValueError) as e:
        raise BadInput(f"malformed expires header {value!r}") from e
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
