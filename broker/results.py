"""Results in Celery's result-backend format, so AsyncResult(task_id).get() works anywhere.

A result is the JSON that Celery's Redis backend stores under celery-task-meta-<id>::

    {"status": "SUCCESS", "result": ..., "traceback": null, "children": [],
     "date_done": "2026-12-02T14:00:00+00:00", "task_id": "..."}

A failure stores {"exc_type", "exc_message", "exc_module"} as its result, as
Celery does with the JSON serializer.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from kombu.utils.json import object_hook

from tandem.broker import fastjson
from tandem.broker.errors import BadInput

#: Largest task message whose kwargs an extended result repeats; larger ones are elided.
EXTENDED_MAX_BYTES = 4096
#: json.dumps(..., allow_nan=False), with its encoder made once: json.dumps makes one on
#: every call given any option, and a result is encoded on every task's path.
_JSON = json.JSONEncoder(allow_nan=False).encode
#: kombu's JSON loads, which Celery's backend decodes results with (type markers and
#: all), with its decoder made once: json.loads makes one per call given a hook.
_KOMBU_JSON = json.JSONDecoder(object_hook=object_hook).decode


def loads(data: bytes | str) -> Any:
    """A stored result, decoded as Celery's backend decodes it (kombu's loads). kombu's
    hook acts only on an object whose keys are "__type__" and "__value__": where that
    key cannot stand, written out or escaped, plain JSON is the same and costs less."""
    text = data.decode() if isinstance(data, bytes) else data
    if "__type__" in text or "\\" in text:
        return _KOMBU_JSON(text)
    return fastjson.loads(text)


def _meta(task_id: str, status: str, result: Any, traceback: str | None, extended: dict) -> str:
    return _JSON(
        {
            "status": status,
            "result": result,
            "traceback": traceback,
            "children": [],
            "date_done": datetime.now(timezone.utc).isoformat(),
            "task_id": task_id,
            **extended,
        }
    )


def failure(task_id: str, error: BaseException, extended: dict | None = None) -> str:
    """FAILURE meta; the exception is rebuilt by AsyncResult.get() on the client. An
    error with a `traceback` attribute (a model's own exception) stores it, as Celery does."""
    exc = {
        "exc_type": type(error).__qualname__,
        "exc_message": [str(error)],
        "exc_module": type(error).__module__,
    }
    return _meta(task_id, "FAILURE", exc, getattr(error, "traceback", None), extended or {})


def success(task_id: str, output: Any, extended: dict | None = None) -> str:
    """SUCCESS meta, or a FAILURE meta if the output cannot be stored as JSON."""
    try:
        return _meta(task_id, "SUCCESS", output, None, extended or {})
    except (TypeError, ValueError) as e:
        return failure(task_id, BadInput(f"result cannot be stored as JSON: {e}"), extended)


def revoked(task_id: str, reason: str = "revoked") -> str:
    """REVOKED meta, as Celery's mark_as_revoked stores it."""
    exc = {
        "exc_type": "TaskRevokedError",
        "exc_message": [reason],
        "exc_module": "celery.exceptions",
    }
    return _meta(task_id, "REVOKED", exc, None, {})


def extended(name: str, kwargs: dict, *, size: int, worker: str, queue: str | None) -> dict:
    """The fields Celery's result_extended adds. kwargs of a message over
    EXTENDED_MAX_BYTES, or that JSON cannot hold, keep the model and elide the inputs."""
    if size > EXTENDED_MAX_BYTES or not _is_json(kwargs):
        kwargs = {"model": kwargs.get("model"), "inputs": f"<elided: {size}-byte message>"}
    return {
        "name": name,
        "args": [],
        "kwargs": kwargs,
        "worker": worker,
        "retries": 0,
        "queue": queue,
    }


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True
