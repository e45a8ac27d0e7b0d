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

from broker.errors import BadInput


def _meta(task_id: str, status: str, result: Any, traceback: str | None = None) -> str:
    return json.dumps(
        {
            "status": status,
            "result": result,
            "traceback": traceback,
            "children": [],
            "date_done": datetime.now(timezone.utc).isoformat(),
            "task_id": task_id,
        },
        allow_nan=False,
    )


def failure(task_id: str, error: BaseException) -> str:
    """FAILURE meta; the exception is rebuilt by AsyncResult.get() on the client."""
    exc = {
        "exc_type": type(error).__qualname__,
        "exc_message": [str(error)],
        "exc_module": type(error).__module__,
    }
    return _meta(task_id, "FAILURE", exc)


def success(task_id: str, output: Any) -> str:
    """SUCCESS meta, or a FAILURE meta if the output cannot be stored as JSON."""
    try:
        return _meta(task_id, "SUCCESS", output)
    except (TypeError, ValueError) as e:
        return failure(task_id, BadInput(f"result cannot be stored as JSON: {e}"))
