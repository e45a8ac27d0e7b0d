"""Task messages built exactly as other Celery clients build them, for tests.

- gocelery (Go, protocol 1): no "headers" key at all (`omitempty` on a nil map); the
  body is base64 of {"id", "task", "args", "kwargs", "retries", "eta", "expires"};
  delivery_info carries the priority.
- celery-node (JavaScript): protocol 1 with empty headers and the body
  {"task", "id", "args", "kwargs"}; protocol 2 with sparse headers (lang, task, id).
"""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any


def _envelope(body: Any, headers: dict | None, queue: str, properties: dict) -> bytes:
    envelope = {
        "body": base64.b64encode(json.dumps(body).encode()).decode(),
        "content-type": "application/json",
        "properties": {
            "body_encoding": "base64",
            "delivery_info": {"exchange": queue, "priority": 0, "routing_key": queue},
            "delivery_mode": 2,
            "delivery_tag": str(uuid.uuid4()),
            **properties,
        },
        "content-encoding": "utf-8",
    }
    if headers is not None:
        envelope["headers"] = headers
    return json.dumps(envelope).encode()


def gocelery(
    task_id: str, args: list, kwargs: dict, queue: str, expires: str | None = None
) -> bytes:
    body = {
        "id": task_id,
        "task": "tandem.infer",
        "args": args,
        "kwargs": kwargs,
        "retries": 0,
        "eta": None,
        "expires": expires,
    }
    props = {"correlation_id": str(uuid.uuid4()), "reply_to": str(uuid.uuid4())}
    return _envelope(body, None, queue, props)


def celery_node_v1(task_id: str, args: list, kwargs: dict, queue: str) -> bytes:
    body = {"task": "tandem.infer", "id": task_id, "args": args, "kwargs": kwargs}
    return _envelope(body, {}, queue, {"correlationId": task_id, "replyTo": ""})


def celery_node_v2(task_id: str, args: list, kwargs: dict, queue: str) -> bytes:
    headers = {"lang": "js", "task": "tandem.infer", "id": task_id}
    props = {"correlationId": task_id, "replyTo": ""}
    return _envelope([args, kwargs, {}], headers, queue, props)
