"""Where a task is, read from Redis and from the processes' logs: for a fault run's report
when a task had no result in time, so the next occurrence can be read instead of guessed.

Every place a task can sit is a Redis list of raw messages (L1 by priority, the retry
list, each executor's L2 and in-flight list, the poison list) or a record (its result
key, a dead letter). A message names its task id in plain text, so a byte search finds it
whatever the message's encoding.
"""

from __future__ import annotations

import json
from pathlib import Path

import redis

from tandem.broker import deadletter, keys

#: Log lines kept per task, at most.
LOG_LINES = 5


def places(client: redis.Redis, model: str, task_ids: list[str]) -> dict[str, list[str]]:
    """task id -> every place it is found now ("result SUCCESS", "L1 tandem.l1.sim.1",
    "in flight at <executor>", ...); an empty list where it is nowhere."""
    found: dict[str, list[str]] = {t: [] for t in task_ids}
    if not task_ids:
        return found
    stored: list[bytes | None] = client.mget([keys.result(t) for t in task_ids])  # type: ignore[assignment]
    for task_id, raw in zip(task_ids, stored, strict=True):
        if raw is not None:
            found[task_id].append(f"result {_status(raw)}")
    lists = [(f"L1 {k}", k) for k in keys.l1_keys(model)]
    lists += [("retry", keys.retry(model)), ("poison", keys.POISON)]
    members: set[bytes] = client.smembers(keys.executors(model))  # type: ignore[assignment]
    for executor_id in sorted(m.decode() for m in members):
        lists.append((f"L2 of {executor_id}", keys.l2(executor_id)))
        lists.append((f"in flight at {executor_id}", keys.inflight(executor_id)))
    for where, key in lists:
        held: list[bytes] = client.lrange(key, 0, -1)  # type: ignore[assignment]
        for message in held:
            for task_id in task_ids:
                if task_id.encode() in message:
                    found[task_id].append(where)
    for letter in deadletter.read(client, 10_000):
        if letter.id in found:
            found[letter.id].append(f"dead letter: {letter.reason}")
    return found


def mentions(logs: list[Path], task_id: str) -> list[str]:
    """The first LOG_LINES lines of these logs that name the task, each with its file."""
    out: list[str] = []
    for log in logs:
        if not log.exists():
            continue
        for line in log.read_text(errors="replace").splitlines():
            if task_id in line:
                out.append(f"{log.name}: {line.strip()}")
                if len(out) >= LOG_LINES:
                    return out
    return out


def describe(client: redis.Redis, model: str, task_ids: list[str], logs: list[Path]) -> list[str]:
    """One line per task (where it is), then the log lines that name it, indented."""
    lines = []
    for task_id, where in places(client, model, task_ids).items():
        lines.append(f"{task_id}: {', '.join(where) or 'nowhere in Redis'}")
        lines += [f"    {line}" for line in mentions(logs, task_id)]
    return lines


def _status(raw: bytes) -> str:
    try:
        return str(json.loads(raw).get("status"))
    except (ValueError, AttributeError):
        return "(not JSON)"
