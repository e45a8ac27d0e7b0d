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
import binascii
import functools
import json
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace
from typing import Any

import orjson

from tandem.broker import fastjson, payload, tracing
from tandem.broker.errors import BadArgument, BadInput, DeadlineExceeded, TandemError
from tandem.broker.ids import new_uuid

TASK_NAME = "tandem.infer"
JSON = "application/json"
ACCEPTED = (JSON, payload.CONTENT_TYPE)
_EMBED = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
#: infer(model, inputs): how positional arguments bind.
PARAMETERS = ("model", "inputs")
#: A body's JSON, as json.dumps(..., separators=(",", ":"), allow_nan=False) writes it;
#: made once, as json.dumps makes an encoder on every call given any option.
_BODY_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode


@dataclass
class Task:
    """One decoded message. `error` is set when the task must fail without compute."""

    raw: bytes
    id: str | None = None
    model: str = ""
    inputs: Any = None
    expires: datetime | None = None
    sent_at: float | None = None  # epoch seconds, from tandem producers only
    priority: int = 0  # 0 (first) to 9, from the message's properties
    #: When its answer is worth nothing any more, epoch seconds: `expires`, else its send
    #: time plus the model's SLO (set by the executor); None when it has neither.
    deadline: float | None = None
    queue: str | None = None  # the routing key it was published with
    sent_inputs: Any = None  # inputs as decoded, before the model's validate()
    validated: bool = False  # inputs passed through the model's validate() (the executor)
    #: Celery canvas fields (callbacks, errbacks, chain, chord, group, group_index,
    #: root_id, parent_id), or None for a task with no next step and no group.
    canvas: dict | None = None
    #: The W3C trace context its headers carry (traceparent, tracestate), or None.
    trace: dict[str, str] | None = None
    error: TandemError | None = field(default=None)

    def check_deadline(self, now: datetime) -> None:
        """Fail the task unrun if its expires, or its SLO deadline, has passed."""
        if self.error is not None:
            return
        if self.expires is not None:
            if self.expires <= now:
                self.error = DeadlineExceeded(f"task expired at {self.expires.isoformat()}")
        elif self.deadline is not None and self.deadline <= now.timestamp():
            when = datetime.fromtimestamp(self.deadline, timezone.utc).isoformat()
            self.error = DeadlineExceeded(f"task expired at {when} (its model's SLO)")


def encode(
    model: str,
    inputs: Any,
    *,
    queue: str,
    task_id: str | None = None,
    priority: int = 0,
    expires: datetime | None = None,
    binary: bool = False,
    trace: dict[str, str] | None = None,
) -> tuple[str, str]:
    """Build the kombu envelope for a tandem.infer task. Returns (task id, envelope JSON).

    binary: pack the body with the tensor payload codec instead of JSON.
    trace: the W3C trace context headers (traceparent, tracestate) to carry.
    """
    task_id = task_id or new_uuid()
    triple = [[], {"model": model, "inputs": inputs}, _EMBED]
    body = payload.dumps(triple) if binary else _BODY_JSON(triple).encode()
    sent_at = time.time()
    properties = {
        "correlation_id": task_id,
        "reply_to": "",
        "delivery_mode": 2,
        "delivery_info": {"exchange": "", "routing_key": queue},
        "priority": int(priority),
    }
    if expires is not None:  # ms left, a string, as send_task writes it
        properties["expiration"] = str(max(0, round((expires.timestamp() - sent_at) * 1000)))
    properties["body_encoding"] = "base64"
    properties["delivery_tag"] = new_uuid()
    # Keys in the order Celery's as_task_v2 and kombu's Redis transport write them.
    envelope: dict[str, Any] = {
        "body": binascii.b2a_base64(body, newline=False).decode(),
        "content-encoding": "binary" if binary else "utf-8",
        "content-type": payload.CONTENT_TYPE if binary else JSON,
        "headers": {
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
            "kwargsrepr": _kwargsrepr(model),
            "origin": "tandem",
            "ignore_result": False,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
            "tandem_sent_at": sent_at,
        },
        "properties": properties,
    }
    if trace:
        envelope["headers"].update(trace)
    try:
        return task_id, orjson.dumps(envelope).decode()
    except orjson.JSONEncodeError:  # a lone surrogate in an id or name: JSON escapes it
        return task_id, json.dumps(envelope, separators=(",", ":"))


def expires_in(deadline_s: float | None) -> datetime | None:
    """When a task submitted now with deadline_s expires; None for none. Raises
    BadArgument unless deadline_s is a positive, finite number of seconds."""
    if deadline_s is None:
        return None
    if (
        isinstance(deadline_s, bool)
        or not isinstance(deadline_s, (int, float))
        or not 0 < deadline_s < float("inf")
    ):
        raise BadArgument(
            f"deadline_s must be a positive number of seconds, got {deadline_s!r}: a task "
            "whose deadline has passed can only fail"
        )
    return datetime.now(timezone.utc) + timedelta(seconds=deadline_s)


def encode_checked(
    model: str,
    inputs: Any,
    *,
    queue: str,
    task_id: str,
    priority: int,
    expires: datetime | None,
    binary: bool,
    limit: int,
    trace: dict[str, str] | None = None,
) -> str:
    """encode(), for a producer: inputs that cannot be sent, or a message over `limit`
    bytes, raise BadInput saying which."""
    try:
        _, envelope = encode(
            model, inputs, queue=queue, task_id=task_id, priority=priority,
            expires=expires, binary=binary, trace=trace,
        )  # fmt: skip
    except ValueError as e:  # JSON's own refusal: NaN or infinity
        kind = "the tensor payload" if binary else "JSON (NaN and infinity are not JSON)"
        raise BadInput(f"inputs cannot be sent as {kind}: {e}") from e
    except TypeError as e:  # a value of no JSON type: a set, bytes, an object
        kind = "the tensor payload" if binary else "JSON"
        raise BadInput(f"inputs cannot be sent as {kind}: {e}") from e
    if len(envelope) > limit:
        raise BadInput(f"message of {len(envelope)} bytes is over the {limit}-byte limit")
    return envelope


@functools.lru_cache(maxsize=1024)
def _kwargsrepr(model: str) -> str:
    """The envelope's kwargsrepr: the inputs are left out, as they may be large."""
    return f"{{'model': {model!r}, 'inputs': ...}}"


def decode(raw: bytes, *, max_bytes: int) -> Task:
    """Decode one envelope. Never raises: a bad message comes back with `error` set.

    Sizes are checked before parsing; a message with a usable id keeps it, so that it
    gets its own FAILURE. One without goes to the dead letters. Protocol-1 and hybrid
    messages (id, task, args and kwargs in the body, as gocelery and old Celery send
    them) are converted to protocol 2 first, as Celery's worker does.
    """
    task = Task(raw=raw)
    try:
        if len(raw) > max_bytes:
            task.id = _scan_id(raw)
            raise BadInput(f"message of {len(raw)} bytes is over the {max_bytes}-byte limit")
        envelope = _object(_json(raw, "message"), "message")
        headers = envelope.get("headers")
        headers = _object({} if headers is None else headers, "headers")
        task.id = _task_id(headers.get("id"))
        body = _body(task, envelope) if task.id or "task" not in headers else None
        if isinstance(body, dict) and "args" in body:
            task.id = task.id or _task_id(body.get("id"))
            body, headers = _proto1_to_proto2(body, headers)
            task.id = _task_id(headers.get("id"))
        if task.id is None:
            raise BadInput(f"no usable task id in headers (got {short(headers.get('id'))})")
        _fill(task, body, headers)
    except BadInput as e:
        task.error = e
    except Exception as e:  # noqa: BLE001 - decoding is total: anything unforeseen is bad input
        task.error = BadInput(f"malformed message: {type(e).__name__}: {_clip(str(e))}")
    return task


#: Longest task id accepted; Celery's are 36-character UUIDs.
MAX_ID_CHARS = 255
#: Deepest nesting of lists and objects accepted in a task's inputs.
MAX_DEPTH = 32
_ID = re.compile(rb'"id"\s*:\s*"([^"\\\x00-\x1f]{1,255})"')


def _task_id(value: Any) -> str | None:
    """The id if usable as a Celery task id: a non-empty printable string, not too long."""
    if isinstance(value, str) and 0 < len(value) <= MAX_ID_CHARS and value.isprintable():
        return value
    return None


def _scan_id(raw: bytes) -> str | None:
    """The task id of a message too large to parse, if exactly one "id" key holds one."""
    found = {m.decode("utf-8", "replace") for m in _ID.findall(raw)}
    return _task_id(found.pop()) if len(found) == 1 else None


def short(value: Any, limit: int = 80) -> str:
    """repr(value), cut to `limit` characters: hostile values stay short in errors."""
    return _clip(repr(value), limit)


def _clip(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _json(data: bytes | str, what: str) -> Any:
    try:
        return fastjson.loads(data)
    except RecursionError:
        raise BadInput(f"malformed {what}: nested too deeply") from None
    except ValueError as e:
        raise BadInput(f"malformed {what}: not JSON ({_clip(str(e))})") from None


def _object(value: Any, what: str) -> dict:
    if not isinstance(value, dict):
        raise BadInput(f"malformed {what}: expected a JSON object, got {type(value).__name__}")
    return value


def _body(task: Task, envelope: dict) -> Any:
    """The decoded body: [args, kwargs, embed] in protocol 2, a dict in protocol 1."""
    content_type = envelope.get("content-type")
    if content_type not in ACCEPTED:
        raise BadInput(
            f"content type {short(content_type)} refused; tandem accepts {' and '.join(ACCEPTED)}"
        )
    properties = envelope.get("properties", {})
    if not isinstance(properties, dict):
        raise BadInput("malformed envelope: properties must be a JSON object")
    task.priority = _priority(properties.get("priority"))
    info = properties.get("delivery_info")
    if isinstance(info, dict) and isinstance(info.get("routing_key"), str):
        task.queue = info["routing_key"]
    body = envelope.get("body")
    if not isinstance(body, str):
        raise BadInput("malformed envelope: body must be a string")
    if properties.get("body_encoding") == "base64":
        try:
            data = _b64decode(body)
        except ValueError:
            raise BadInput("malformed body: not base64") from None
    else:
        data = body.encode()
    return _json(data, "body") if content_type == JSON else payload.loads(data)


#: base64.b64decode(text, validate=True), as it calls it since Python 3.11: no Python
#: function entered, which costs a few us cold.
_b64decode = (
    functools.partial(binascii.a2b_base64, strict_mode=True)
    if sys.version_info >= (3, 11)
    else functools.partial(base64.b64decode, validate=True)
)


def _proto1_to_proto2(body: dict, headers: dict) -> tuple[list, dict]:
    """A protocol-1 or hybrid body as ([args, kwargs, embed], headers), by Celery's own
    conversion (celery.worker.strategy.hybrid_to_proto2)."""
    from celery.exceptions import InvalidTaskError
    from celery.worker.strategy import hybrid_to_proto2

    try:
        triple, merged, _decoded, _utc = hybrid_to_proto2(SimpleNamespace(headers=headers), body)
    except InvalidTaskError as e:
        raise BadInput(f"malformed protocol-1 body: {e}") from None
    return list(triple), merged


def _fill(task: Task, triple: Any, headers: dict) -> None:
    if headers.get("task") != TASK_NAME:
        raise BadInput(f"unknown task name {short(headers.get('task'))}; tandem runs {TASK_NAME}")
    if not (isinstance(triple, (list, tuple)) and len(triple) == 3):
        raise BadInput("malformed body: expected [args, kwargs, embed]")
    args, kwargs, embed = triple
    task.model, task.inputs = _bind(args, kwargs)
    task.canvas = _canvas(embed, headers)
    task.sent_inputs = task.inputs
    check_depth(task.inputs)
    task.expires = _parse_expires(headers.get("expires"))
    task.sent_at = _sent_at(headers.get("tandem_sent_at"))
    if "traceparent" in headers:
        task.trace = tracing.carried(headers)


def _canvas(embed: Any, headers: dict) -> dict | None:
    """The canvas fields of the body's embed and the headers, checked for shape."""
    embed = {} if embed is None else embed
    if not isinstance(embed, dict):
        raise BadInput("malformed body: embed must be a JSON object")
    canvas: dict[str, Any] = {}
    for name in ("callbacks", "errbacks", "chain"):
        value = embed.get(name)
        if value is None:
            continue
        if not isinstance(value, list) or not all(_is_signature(s) for s in value):
            raise BadInput(f"malformed {name}: expected a list of task signatures")
        if value:
            canvas[name] = value
    if embed.get("chord") is not None:
        if not _is_signature(embed["chord"]):
            raise BadInput("malformed chord: expected a task signature")
        canvas["chord"] = embed["chord"]
    if headers.get("group") is not None:
        if not isinstance(headers["group"], str):
            raise BadInput(f"malformed group header {short(headers['group'])}")
        canvas["group"] = headers["group"]
        index = headers.get("group_index")
        canvas["group_index"] = index if isinstance(index, int) else None
    if not canvas:
        return None
    for name in ("root_id", "parent_id"):
        canvas[name] = headers.get(name) if isinstance(headers.get(name), str) else None
    return canvas


def _is_signature(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("task"), str)


def _bind(args: Any, kwargs: Any) -> tuple[str, Any]:
    """(model, inputs) from args and kwargs, bound as Python binds infer(model, inputs)."""
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        raise BadInput("malformed body: args must be a list and kwargs an object")
    if len(args) > len(PARAMETERS):
        raise BadInput(f"{TASK_NAME} takes model and inputs, got {len(args)} positional arguments")
    bound = dict(zip(PARAMETERS, args, strict=False))
    for name, value in kwargs.items():
        if name in bound:
            raise BadInput(f"{TASK_NAME} got multiple values for argument {name!r}")
        bound[name] = value
    missing = [name for name in PARAMETERS if name not in bound]
    if missing:
        raise BadInput(f"{TASK_NAME} is missing {' and '.join(missing)}")
    if not isinstance(bound["model"], str):
        raise BadInput(f"model must be a string, got {short(bound['model'])}")
    return bound["model"], bound["inputs"]


def check_depth(value: Any, limit: int = MAX_DEPTH) -> None:
    """Raise BadInput if lists and objects nest deeper than `limit`. Level by level, no
    recursion, so any depth is safe to check."""
    nested = (list, tuple, dict)
    level, depth = ([value] if isinstance(value, nested) else []), 0
    while level:
        depth += 1
        if depth > limit:
            raise BadInput(f"inputs nest deeper than {limit} levels")
        level = [
            child
            for item in level
            for child in (item.values() if isinstance(item, dict) else item)
            if isinstance(child, nested)
        ]


def _priority(value: Any) -> int:
    """The message's priority, 0-9 as kombu orders them; anything else counts as 0."""
    if isinstance(value, bool) or not isinstance(value, int):
        return 0
    return min(max(value, 0), 9)


def _sent_at(value: Any) -> float | None:
    """tandem_sent_at, epoch seconds, only if it is a plausible time (it feeds metrics)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 < value < 1e11 else None


def _parse_expires(value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadInput(f"malformed expires header {short(value)}")
    try:
        when = datetime.fromisoformat(value)
    except ValueError as e:
        raise BadInput(f"malformed expires header {short(value)}") from e
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)
